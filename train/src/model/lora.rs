//! LoRA adapters on the model's projections, computed as `x·W + s·(dropout(x)·A)·B` with the base
//! `W` frozen: no dense `W + s·A·B` is ever formed during training, the base gets no gradient and
//! no optimizer state.
//!
//! Shapes follow Burn's `[d_in, d_out]` layout: `A` is `[d_in, r]`, `B` is `[r, d_out]`, so
//! PEFT's `lora_A.weight` (`[r, d_in]`) is `Aᵀ` and `lora_B.weight` (`[d_out, r]`) is `Bᵀ`;
//! `s = alpha / r`. Initialisation as PEFT's default (`init_lora_weights = True`): `A` from
//! Kaiming-uniform with `a = √5` on `lora_A.weight`, i.e. uniform in `±1/√d_in`, and `B = 0`, so
//! the adapted model starts equal to the base.
//!
//! Trainable tokens (`[lora] trainable_tokens`, PEFT's `trainable_token_indices`) are rows of the
//! token embedding that train beside the adapters, in f32 whatever the base's dtype: a token the
//! base model never learnt to answer with (a tool new under changed rules) has an embedding
//! shaped only as a wrong option, and low-rank updates of the projections alone may not set it
//! apart (docs/results.md, "bf16 at the tiny size").
//!
//! The PEFT files ([`save_peft`], [`load_peft`]) are read and written by [`crate::model::peft`], in
//! PEFT's exact layout.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{DType, Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use crate::model::peft::{BaseShape, LoraPair, Matrix, PROJECTIONS, PeftAdapter, TokenRows};
use crate::model::qwen3::{Proj, Qwen3, TrainableTokens};

/// One adapter: `delta(x) = s · (dropout(x) · A) · B`.
#[derive(Module, Debug)]
pub struct LoraAdapter {
    /// `[d_in, r]`
    pub lora_a: Param<Tensor<2>>,
    /// `[r, d_out]`
    pub lora_b: Param<Tensor<2>>,
    pub dropout: Dropout,
    /// `alpha / r` (`alpha / sqrt(r)` for an rsLoRA adapter read from PEFT files)
    pub scaling: f64,
}

impl LoraAdapter {
    /// `s · (dropout(x)·A)·B`; dropout acts only while training on an autodiff device.
    /// The adapter computes in its own dtype (f32) whatever the base's (`x`'s) dtype, and returns
    /// `x`'s dtype.
    pub fn delta<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let x = self.dropout.forward(x);
        let a = self.lora_a.val().unsqueeze::<D>();
        let b = self.lora_b.val().unsqueeze::<D>();
        let (dtype, own) = (x.dtype(), a.dtype());
        if dtype == own {
            x.matmul(a).matmul(b).mul_scalar(self.scaling)
        } else {
            x.cast(own)
                .matmul(a)
                .matmul(b)
                .mul_scalar(self.scaling)
                .cast(dtype)
        }
    }

    pub fn rank(&self) -> usize {
        self.lora_a.shape().dims::<2>()[1]
    }

    /// `s · A·B`, `[d_in, d_out]`: what merging adds to the base weight.
    pub(crate) fn dense(&self) -> Tensor<2> {
        self.lora_a
            .val()
            .matmul(self.lora_b.val())
            .mul_scalar(self.scaling)
    }
}

/// LoRA settings as the adapter files record them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f32,
    pub dropout: f32,
    pub targets: Vec<String>,
    /// Token ids whose embedding rows train too (empty: none).
    pub tokens: Vec<u32>,
}

impl LoraSpec {
    pub fn scaling(&self) -> f64 {
        self.alpha as f64 / self.rank as f64
    }
}

/// The projections of layer `layer`, by their Hugging Face names.
pub(crate) fn projections_mut(model: &mut Qwen3, layer: usize) -> [(&'static str, &mut Proj); 7] {
    model.model.layers[layer]
        .projections_mut()
        .map(|(path, proj)| (short_name(path), proj))
}

fn projections(model: &Qwen3, layer: usize) -> [(&'static str, &Proj); 7] {
    model.model.layers[layer]
        .projections()
        .map(|(path, proj)| (short_name(path), proj))
}

/// `q_proj` of `self_attn.q_proj`: the names LoRA targets use.
fn short_name(path: &'static str) -> &'static str {
    path.rsplit_once('.').map_or(path, |(_, name)| name)
}

/// Freeze the whole model and attach fresh adapters (PEFT initialisation) to `spec.targets`.
/// The adapters require gradients; nothing else does.
pub(crate) fn attach(model: Qwen3, spec: &LoraSpec, seed: u64) -> Qwen3 {
    let device = model.device();
    let mut model = model.no_grad();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x10a4_5eed);
    for layer in 0..model.model.layers.len() {
        for (name, proj) in projections_mut(&mut model, layer) {
            if !spec.targets.iter().any(|t| t == name) {
                continue;
            }
            let [d_in, d_out] = proj.dims();
            let bound = 1.0 / (d_in as f32).sqrt();
            let a: Vec<f32> = (0..d_in * spec.rank)
                .map(|_| rng.random_range(-bound..bound))
                .collect();
            let a = Tensor::<2>::from_data(TensorData::new(a, [d_in, spec.rank]), &device);
            let b = Tensor::<2>::zeros([spec.rank, d_out], &device);
            proj.lora = Some(adapter(a, b, spec.dropout, spec.scaling()));
        }
    }
    if !spec.tokens.is_empty() {
        let rows = embedding_rows(&model, &spec.tokens);
        model.tokens = Some(trainable_tokens(rows, spec.tokens.clone()));
    }
    model
}

/// Rows `ids` of the model's token embedding, f32 `[ids.len(), hidden]`.
fn embedding_rows(model: &Qwen3, ids: &[u32]) -> Tensor<2> {
    let w = model.model.embed_tokens.weight.val();
    let idx: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let idx = burn::tensor::Tensor::<1, burn::tensor::Int>::from_data(
        TensorData::new(idx, [ids.len()]),
        &w.device(),
    );
    w.select(0, idx).cast(DType::F32)
}

/// Trainable rows holding `values`, as [`adapter`] makes adapters trainable.
fn trainable_tokens(values: Tensor<2>, ids: Vec<u32>) -> TrainableTokens {
    let values = if values.device().is_autodiff() {
        values.detach().require_grad()
    } else {
        values
    };
    TrainableTokens {
        values: Param::from_tensor(values),
        ids,
    }
}

fn adapter(a: Tensor<2>, b: Tensor<2>, dropout: f32, scaling: f64) -> LoraAdapter {
    let (a, b) = if a.device().is_autodiff() {
        (a.detach().require_grad(), b.detach().require_grad())
    } else {
        (a, b)
    };
    LoraAdapter {
        lora_a: Param::from_tensor(a),
        lora_b: Param::from_tensor(b),
        dropout: DropoutConfig::new(dropout as f64).init(),
        scaling,
    }
}

/// Fold every adapter into its base weight (`W + s·A·B`) and remove the adapters. Each base
/// weight is dropped as its merged copy replaces it, so where `model` holds the only handles on
/// the base, one projection's copy is alive at a time, not a second set of projections.
pub fn merge(mut model: Qwen3) -> Qwen3 {
    for layer in 0..model.model.layers.len() {
        for (_, proj) in projections_mut(&mut model, layer) {
            if let Some(ad) = proj.lora.take() {
                // In f32, rounded once to the base's dtype.
                let base = proj.weight.val().inner();
                let dtype = base.dtype();
                let w = (ad.dense().inner() + base.cast(DType::F32)).cast(dtype);
                let w = if proj.weight.val().device().is_autodiff() {
                    Tensor::from_inner(w)
                } else {
                    w
                };
                proj.weight = Param::initialized(proj.weight.id, w);
                // On a GPU the base's weight had a buffer of its own (`LoadOptions::trains`),
                // which stays reserved once freed until a cleanup returns it: one projection at
                // a time, as the plan counts the merge.
                proj.weight.device().memory_cleanup();
            }
        }
    }
    if let Some(tokens) = model.tokens.take() {
        // The rows replace the embedding's (and so the tied head's), rounded to its dtype.
        let embed = &mut model.model.embed_tokens.weight;
        let mut w = embed.val().inner();
        let [_, h] = w.dims();
        let values = tokens.values.val().inner().cast(w.dtype());
        for (i, &id) in tokens.ids.iter().enumerate() {
            let id = id as usize;
            w = w.slice_assign([id..id + 1, 0..h], values.clone().narrow(0, i, 1));
        }
        let w = if embed.val().device().is_autodiff() {
            Tensor::from_inner(w)
        } else {
            w
        };
        *embed = Param::initialized(embed.id, w);
    }
    model
}

/// The exact decimal of an f32 setting as an f64 (`0.1`, not `0.10000000149011612`), for the
/// adapter config.
fn decimal(x: f32) -> f64 {
    x.to_string().parse().expect("an f32 prints as a number")
}

fn to_vec(t: Tensor<2>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// The projection shapes of the model, for checking an adapter against it.
fn base_shape(model: &Qwen3) -> Result<BaseShape> {
    let layers = model.model.layers.len();
    if layers == 0 {
        bail!("the model has no layers to adapt");
    }
    let mut dims = [(0, 0); 7];
    for (d, (_, proj)) in dims.iter_mut().zip(projections(model, 0)) {
        let [d_in, d_out] = proj.dims();
        *d = (d_out, d_in);
    }
    let [vocab, hidden] = model.model.embed_tokens.weight.shape().dims();
    Ok(BaseShape {
        layers,
        dims,
        vocab,
        hidden,
    })
}

/// Write `adapter_config.json` and `adapter_model.safetensors` (PEFT layout, f32) into `dir`.
pub(crate) fn save_peft(model: &Qwen3, spec: &LoraSpec, base: &str, dir: &Path) -> Result<()> {
    peft(model, spec, base)?.write_peft(dir)
}

/// The model's adapters in PEFT's layout (host copies, f32), ready for
/// [`PeftAdapter::write_peft`]; `base` is the base model's name.
pub fn peft(model: &Qwen3, spec: &LoraSpec, base: &str) -> Result<PeftAdapter> {
    let mut modules = BTreeMap::new();
    for layer in 0..model.model.layers.len() {
        for ((sub, name), (_, proj)) in PROJECTIONS.iter().zip(projections(model, layer)) {
            if let Some(ad) = &proj.lora {
                let matrix = |t: Tensor<2>| {
                    let [rows, cols] = t.dims();
                    Matrix::new(rows, cols, to_vec(t))
                };
                let pair = LoraPair {
                    a: matrix(ad.lora_a.val().inner().transpose())?, // [r, d_in]
                    b: matrix(ad.lora_b.val().inner().transpose())?, // [d_out, r]
                };
                modules.insert(format!("model.layers.{layer}.{sub}.{name}"), pair);
            }
        }
    }
    if modules.is_empty() {
        bail!("the model has no LoRA adapters to save");
    }
    let tokens = match &model.tokens {
        Some(t) => {
            let values = t.values.val().inner();
            let [rows, cols] = values.dims();
            Some(TokenRows {
                ids: t.ids.clone(),
                values: Matrix::new(rows, cols, to_vec(values))?,
            })
        }
        None => None,
    };
    Ok(PeftAdapter {
        r: spec.rank,
        alpha: decimal(spec.alpha),
        use_rslora: false,
        target_modules: spec.targets.clone(),
        dropout: decimal(spec.dropout),
        base_model: Some(base.to_string()),
        base_layers: model.model.layers.len(),
        modules,
        tokens,
    })
}

/// Read a PEFT adapter folder ([`PeftAdapter::read`]: missing or unexpected keys and wrong shapes
/// are errors) and attach its adapters to `model` (frozen base, adapters trainable on an autodiff
/// device). Returns the model, the adapter's settings and its base model (`""` when unnamed). An
/// rsLoRA adapter keeps PEFT's scale `alpha / sqrt(r)`; its settings say so as the plain LoRA
/// with that scale (`alpha · sqrt(r)`), which is what [`save_peft`] then writes.
pub fn load_peft(model: Qwen3, dir: &Path) -> Result<(Qwen3, LoraSpec, String)> {
    let peft = PeftAdapter::read(dir, &base_shape(&model)?)?;
    let scaling = peft.scaling();
    let device: Device = model.device();
    let mut model = model.no_grad();
    let mut targets: Vec<String> = Vec::new();
    for layer in 0..model.model.layers.len() {
        for ((sub, name), (_, proj)) in PROJECTIONS.iter().zip(projections_mut(&mut model, layer)) {
            let Some(pair) = peft
                .modules
                .get(&format!("model.layers.{layer}.{sub}.{name}"))
            else {
                continue;
            };
            // PEFT's `[out, in]` transposed on the host: row-major in Burn's `[in, out]` layout,
            // as attach makes them, so a loaded adapter's products read it as a trained one's.
            let tensor = |m: &Matrix| {
                let t: Vec<f32> = (0..m.cols * m.rows)
                    .map(|i| m.data[(i % m.rows) * m.cols + i / m.rows])
                    .collect();
                Tensor::<2>::from_data(TensorData::new(t, [m.cols, m.rows]), &device)
            };
            proj.lora = Some(adapter(
                tensor(&pair.a),
                tensor(&pair.b),
                peft.dropout as f32,
                scaling,
            ));
            if !targets.iter().any(|t| t == name) {
                targets.push(name.to_string());
            }
        }
    }
    targets.sort_by_key(|t| PROJECTIONS.iter().position(|(_, p)| p == t));
    let mut token_ids = Vec::new();
    if let Some(t) = &peft.tokens {
        let values = Tensor::<2>::from_data(
            TensorData::new(t.values.data.clone(), [t.values.rows, t.values.cols]),
            &device,
        );
        model.tokens = Some(trainable_tokens(values, t.ids.clone()));
        token_ids = t.ids.clone();
    }
    let spec = LoraSpec {
        rank: peft.r,
        alpha: if peft.use_rslora {
            (scaling * peft.r as f64) as f32
        } else {
            peft.alpha as f32
        },
        dropout: peft.dropout as f32,
        targets,
        tokens: token_ids,
    };
    Ok((model, spec, peft.base_model.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Qwen3Config;

    /// PEFT's rsLoRA scales `B·A` by `alpha / sqrt(r)` (not `alpha / r`), and every reader says so
    /// alike: the files' reader (what the exporter merges), training's loader, and what training
    /// writes back. Here r = 4, alpha = 8: the scale is 4, where plain LoRA's would be 2. The
    /// adapter covers one projection of one layer, so the written `layers_to_transform` is
    /// exercised too.
    #[test]
    fn rslora_adapters_scale_by_alpha_over_sqrt_r_everywhere() {
        let cfg = Qwen3Config::from_json(&serde_json::json!({
            "model_type": "qwen3", "vocab_size": 16, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": false, "max_position_embeddings": 64
        }))
        .unwrap();
        let (out, inp) = BaseShape::of(&cfg).dims[0];
        let a = Matrix::new(
            4,
            inp,
            (0..4 * inp).map(|i| (i as f32 * 0.37).sin()).collect(),
        );
        let b = Matrix::new(
            out,
            4,
            (0..out * 4).map(|i| (i as f32 * 0.53).cos()).collect(),
        );
        let module = "model.layers.1.self_attn.q_proj";
        let written = PeftAdapter {
            r: 4,
            alpha: 8.0,
            use_rslora: true,
            target_modules: vec!["q_proj".into()],
            dropout: 0.0,
            base_model: None,
            base_layers: 2,
            modules: BTreeMap::from([(
                module.to_string(),
                LoraPair {
                    a: a.unwrap(),
                    b: b.unwrap(),
                },
            )]),
            tokens: None,
        };
        let dir = tempfile::tempdir().unwrap();
        written.write_peft(dir.path()).unwrap();

        let read = PeftAdapter::load(dir.path(), &cfg).unwrap();
        assert!(read.use_rslora);
        assert_eq!(read.scaling(), 4.0);
        let delta = read.delta(module).unwrap();
        let pair = &read.modules[module];
        let by_hand: f64 = (0..4)
            .map(|k| pair.b.data[k] as f64 * pair.a.data[k * inp] as f64)
            .sum();
        assert!((delta[0] as f64 - 4.0 * by_hand).abs() < 1e-5);

        let device = Device::flex();
        let model = crate::model::qwen3::init_random(&cfg, 0.3, &device);
        let (model, spec, _) = load_peft(model, dir.path()).unwrap();
        let layers = &model.model.layers;
        assert!(layers[0].self_attn.q_proj.lora.is_none());
        let ad = layers[1].self_attn.q_proj.lora.as_ref().unwrap();
        assert_eq!(ad.scaling, 4.0);
        assert!((spec.scaling() - 4.0).abs() < 1e-6, "{spec:?}");
        // The Burn adapter's s·A·B is [in, out]: its transpose is the reader's delta.
        let dense = to_vec(ad.dense().transpose());
        let worst = dense
            .iter()
            .zip(&delta)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert_eq!(dense.len(), delta.len());
        assert!(worst < 1e-5, "{worst}");

        // Written back by training (as the plain LoRA of the same scale), read again: same delta.
        let again = tempfile::tempdir().unwrap();
        save_peft(&model, &spec, "base", again.path()).unwrap();
        let back = PeftAdapter::load(again.path(), &cfg).unwrap();
        assert_eq!(back.modules.keys().collect::<Vec<_>>(), [module]);
        let back_delta = back.delta(module).unwrap();
        assert_eq!(back_delta.len(), delta.len());
        for (x, y) in back_delta.iter().zip(&delta) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
}
