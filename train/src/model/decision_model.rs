//! [`DecisionModel`]: a Qwen3 checkpoint with its tokenizer and `decision.json`, ready to turn
//! states into per-candidate probabilities. What `score`, `train`, `eval` and `export` load.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::DType;
use decision_data::State;
use tokenizers::Tokenizer;

use crate::model::backend::{self, Backend, Precision};
use crate::model::config::Qwen3Config;
use crate::model::hub::{self, HubEnv, ModelDir};
use crate::model::qwen3::Qwen3;
use crate::model::score::{self, Scores};
use crate::model::weights::{self, HfTensor, SaveDtype};
use decision_prompt::spec::{self, DecisionSpec, PromptTemplate};
use decision_prompt::{Encoded, Prompter};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub backend: Backend,
    pub precision: Precision,
    /// Hub settings; `None` reads them from the environment.
    pub hub: Option<HubEnv>,
    /// The weights will train (full fine-tuning). Otherwise they stay as loaded (scoring, a LoRA
    /// run's frozen base), and on a GPU each goes in a buffer of its own, outside the runtime's
    /// pools: those then carve their pages to the activations' sizes, not the largest weight's.
    pub trains: bool,
}

/// Refuse, before any weight is read, a model whose largest weight in `dtype` is larger than the
/// largest buffer (`limit`) the GPU allocates: there each tensor is one buffer, and the load
/// would fail as if memory had run out.
fn weights_fit_buffers(config: &Qwen3Config, dtype: DType, limit: u64, origin: &str) -> Result<()> {
    let (name, shape) = weights::largest_tensor(config);
    let bytes = (shape.iter().product::<usize>() * dtype.size()) as u64;
    if bytes <= limit {
        return Ok(());
    }
    let half = if dtype == DType::F32 && bytes / 2 <= limit {
        " (a 16-bit --dtype, where the device computes one, halves it)"
    } else {
        ""
    };
    bail!(
        "{origin}: the weight {name} {shape:?} takes {} in {dtype:?}, more than the largest \
         buffer {} allocates ({}){half}; --backend cpu runs it",
        crate::plan::size(bytes),
        crate::trainer::adapter_name(),
        crate::plan::size(limit)
    )
}

/// A decision model: architecture, weights on a device, tokenizer, prompt and temperatures.
pub struct DecisionModel {
    pub config: Qwen3Config,
    pub model: Qwen3,
    /// `decision.json` as loaded (or the defaults), with `label_token_ids` filled in.
    pub spec: DecisionSpec,
    pub prompter: Prompter,
    pub pad_id: u32,
    pub device: Device,
    /// What the model was loaded from, for messages and manifests.
    pub origin: String,
}

/// The default `decision.json` for a tokenizer: Qwen's chat format (non-thinking) when the
/// tokenizer has its markers, the plain template otherwise.
pub fn default_spec(tokenizer: &Tokenizer) -> DecisionSpec {
    let template = match decision_prompt::tokenizer::chat_markers(tokenizer) {
        (true, think) => PromptTemplate::qwen_chat(think),
        (false, _) => PromptTemplate::plain(),
    };
    DecisionSpec::defaults(template)
}

/// The prompter of `spec` over `tokenizer` for a model of `config`, checked as a run and a load
/// use it: the tokenizer fits the model's vocabulary and every label is one token where the
/// template puts it. Errors name `origin`.
pub(crate) fn prompter_for(
    config: &Qwen3Config,
    tokenizer: Tokenizer,
    spec: &DecisionSpec,
    origin: &str,
) -> Result<Prompter> {
    let vocab = tokenizer.get_vocab_size(true);
    if vocab > config.vocab_size {
        bail!(
            "{origin}: the tokenizer has {vocab} tokens but the model's vocab_size is {}",
            config.vocab_size
        );
    }
    Prompter::new(spec, tokenizer, config.max_position_embeddings)
        .with_context(|| format!("{origin}: decision prompt"))
}

impl DecisionModel {
    /// Load from a local folder or a Hub id (`owner/name[@revision]`).
    pub fn load(src: &str, opts: &LoadOptions) -> Result<Self> {
        Self::load_as(src, src, opts)
    }

    /// As [`DecisionModel::load`], with `label` (the flag or key and its value, `--run X`)
    /// leading the messages about where the model is.
    pub(crate) fn load_as(label: &str, src: &str, opts: &LoadOptions) -> Result<Self> {
        let env = opts.hub.clone().unwrap_or_else(HubEnv::from_env);
        let dir = hub::resolve_as(label, src, &env)?;
        Self::load_dir(&dir, opts)
    }

    /// Load a resolved model folder.
    pub fn load_dir(md: &ModelDir, opts: &LoadOptions) -> Result<Self> {
        let dir = &md.dir;
        let config = Qwen3Config::from_file(&dir.join("config.json"))?;
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            bail!(
                "{}: no tokenizer.json (a decision model needs the Hugging Face tokenizer file)",
                md.origin
            );
        }
        let tokenizer = decision_prompt::tokenizer::load(&tok_path)?;
        let spec_path = dir.join(spec::FILE);
        let spec = if spec_path.is_file() {
            Some(DecisionSpec::from_file(&spec_path)?)
        } else {
            None
        };
        let device = backend::device(opts.backend)?;
        let dtype = backend::resolve_precision(&device, opts.backend, opts.precision)?
            .dtype()
            .expect("a resolved precision names a dtype");
        if let Some(limit) = backend::largest_buffer(&device) {
            weights_fit_buffers(&config, dtype, limit, &md.origin)?;
        }
        let files = weights::weight_files(dir)?;
        let load = |()| weights::load_model(&config, &files, &md.origin, &device, dtype);
        let model = if opts.trains {
            load(())?
        } else {
            // A weight that trains is replaced each step, and a freed buffer of its own would
            // stay reserved: only weights that stay go there.
            device.memory_persistent_allocations((), load)?
        };
        Self::from_parts(config, model, tokenizer, spec, &md.origin)
    }

    /// Assemble from parts (a model trained from scratch, a model built in a test).
    /// `spec` `None` means the defaults for this tokenizer.
    pub fn from_parts(
        config: Qwen3Config,
        model: Qwen3,
        tokenizer: Tokenizer,
        spec: Option<DecisionSpec>,
        origin: &str,
    ) -> Result<Self> {
        let mut spec = spec.unwrap_or_else(|| default_spec(&tokenizer));
        let prompter = prompter_for(&config, tokenizer, &spec, origin)?;
        spec.label_token_ids = prompter.label_token_ids.clone();
        let pad_id = decision_prompt::tokenizer::pad_id(&prompter.tokenizer);
        let device = model.device();
        Ok(Self {
            config,
            model,
            spec,
            prompter,
            pad_id,
            device,
            origin: origin.to_string(),
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.prompter.tokenizer
    }

    pub fn dtype(&self) -> DType {
        self.model.dtype()
    }

    /// Prompt token ids and option label ids of a state (truncated to `max_tokens` if needed).
    pub fn encode(&self, state: &State) -> Result<Encoded> {
        self.prompter.encode(state)
    }

    /// The temperature used for a decision point.
    pub fn temperature(&self, point: &str) -> f64 {
        self.spec.temperature_for(point)
    }

    /// Score states in batches of `batch_size`; results in input order. Refused (naming the
    /// state) when the model's logits for a state are not finite.
    pub fn score(&self, states: &[State], batch_size: usize) -> Result<Vec<Scores>> {
        let encoded = states
            .iter()
            .map(|s| self.encode(s))
            .collect::<Result<Vec<_>>>()?;
        let points: Vec<&str> = states.iter().map(|s| s.point.as_str()).collect();
        let scores = self.score_encoded(&encoded, &points, batch_size, &mut |_| {});
        let logits: Vec<Vec<f64>> = scores.iter().map(|s| s.logits.clone()).collect();
        score::check_finite(&logits, &|i| format!("state {:?}", states[i].id))
            .with_context(|| self.origin.clone())?;
        Ok(scores)
    }

    /// Score encoded states; `progress` is told how many states each finished batch held. The
    /// logits are as the model gave them: check them with [`score::check_finite`] before use.
    pub fn score_encoded(
        &self,
        encoded: &[Encoded],
        points: &[&str],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Vec<Scores> {
        score::logits_in_batches(
            &self.model,
            encoded,
            self.pad_id,
            batch_size,
            None,
            progress,
        )
        .iter()
        .zip(points)
        .map(|(logits, point)| score::scores_from_logits(logits, self.temperature(point)))
        .collect()
    }

    /// Save in the Hugging Face layout plus `decision.json`: `config.json`, `model.safetensors`,
    /// `tokenizer.json`, `decision.json`. Each file is written atomically.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.save_as(dir, SaveDtype::F32)
    }

    pub fn save_as(&self, dir: &Path, dtype: SaveDtype) -> Result<()> {
        weights::save_model(&self.model, &self.config, dir, dtype)?;
        decision_prompt::tokenizer::save(self.tokenizer(), &dir.join("tokenizer.json"))?;
        decision_data::atomic::write_json_atomic(dir.join(spec::FILE), &self.spec)?;
        Ok(())
    }

    /// The weights under their Hugging Face names, in checkpoint layout, one at a time.
    pub fn hf_tensors(&self) -> impl Iterator<Item = HfTensor> + '_ {
        weights::hf_tensors(&self.model)
    }
}
