//! LoRA merging for export: a [`WeightSource`] that reads the base weights with a PEFT adapter
//! folded in (`W + s·B·A`, per tensor, on read; trainable tokens' rows replace the embedding's,
//! which a tied LM head shares). The adapter files themselves are read and written
//! by the training crate's one PEFT implementation ([`decision_train::model::peft`]).

use std::sync::Arc;

use anyhow::{Result, bail};

use decision_train::model::peft::PeftAdapter;

use decision_train::model::weights::WeightSource;

const EMBED: &str = "model.embed_tokens.weight";

/// A weight source with a LoRA adapter merged in: `W + scaling · B·A` for adapted projections,
/// the base tensor otherwise. Merging happens per tensor, on read.
pub struct MergedSource {
    base: Arc<dyn WeightSource>,
    adapter: Arc<PeftAdapter>,
}

impl MergedSource {
    pub fn new(base: Arc<dyn WeightSource>, adapter: Arc<PeftAdapter>) -> Result<Self> {
        for (module, pair) in &adapter.modules {
            let name = format!("{module}.weight");
            match base.shape(&name) {
                Some(s) if s == [pair.b.rows, pair.a.cols] => {}
                Some(s) => bail!(
                    "adapter module `{module}` is [{}, {}], the base weight is {s:?}",
                    pair.b.rows,
                    pair.a.cols
                ),
                None => bail!("adapter module `{module}` has no base weight `{name}`"),
            }
        }
        if let Some(t) = &adapter.tokens {
            match base.shape(EMBED) {
                Some(s) if s.len() == 2 && s[1] == t.values.cols => {
                    if let Some(bad) = t.ids.iter().find(|&&id| id as usize >= s[0]) {
                        bail!(
                            "adapter trainable token {bad} is outside the base's vocabulary of {}",
                            s[0]
                        );
                    }
                }
                s => bail!(
                    "adapter trainable tokens are {} wide, the base's `{EMBED}` is {s:?}",
                    t.values.cols
                ),
            }
        }
        Ok(Self { base, adapter })
    }
}

impl WeightSource for MergedSource {
    fn names(&self) -> Vec<String> {
        self.base.names()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.base.shape(name)
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let mut w = self.base.read_f32(name)?;
        if let Some(module) = name.strip_suffix(".weight")
            && let Some(delta) = self.adapter.delta(module)
        {
            for (x, d) in w.iter_mut().zip(delta) {
                *x += d;
            }
        }
        if name == EMBED
            && let Some(t) = &self.adapter.tokens
        {
            let h = t.values.cols;
            for (i, &id) in t.ids.iter().enumerate() {
                let id = id as usize;
                w[id * h..(id + 1) * h].copy_from_slice(&t.values.data[i * h..(i + 1) * h]);
            }
        }
        Ok(w)
    }
}
