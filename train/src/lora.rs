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
//! The PEFT files ([`save_peft`], [`load_peft`]) use PEFT's exact layout: `adapter_config.json`
//! and `adapter_model.safetensors` with keys such as
//! `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::model::{Proj, Qwen3};

/// One adapter: `delta(x) = s · (dropout(x) · A) · B`.
#[derive(Module, Debug)]
pub struct LoraAdapter {
    /// `[d_in, r]`
    pub lora_a: Param<Tensor<2>>,
    /// `[r, d_out]`
    pub lora_b: Param<Tensor<2>>,
    pub dropout: Dropout,
    /// `alpha / r`
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
    pub fn dense(&self) -> Tensor<2> {
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
}

impl LoraSpec {
    pub fn scaling(&self) -> f64 {
        self.alpha as f64 / self.rank as f64
    }
}

/// The projections of layer `layer`, by their Hugging Face names.
fn projections_mut(model: &mut Qwen3, layer: usize) -> [(&'static str, &mut Proj); 7] {
    let l = &mut model.model.layers[layer];
    [
        ("q_proj", &mut l.self_attn.q_proj),
        ("k_proj", &mut l.self_attn.k_proj),
        ("v_proj", &mut l.self_attn.v_proj),
        ("o_proj", &mut l.self_attn.o_proj),
        ("gate_proj", &mut l.mlp.gate_proj),
        ("up_proj", &mut l.mlp.up_proj),
        ("down_proj", &mut l.mlp.down_proj),
    ]
}

fn projections(model: &Qwen3, layer: usize) -> [(&'static str, &Proj); 7] {
    let l = &model.model.layers[layer];
    [
        ("q_proj", &l.self_attn.q_proj),
        ("k_proj", &l.self_attn.k_proj),
        ("v_proj", &l.self_attn.v_proj),
        ("o_proj", &l.self_attn.o_proj),
        ("gate_proj", &l.mlp.gate_proj),
        ("up_proj", &l.mlp.up_proj),
        ("down_proj", &l.mlp.down_proj),
    ]
}

fn self_attn_or_mlp(target: &str) -> &'static str {
    if target.ends_with("_proj") && ["gate_proj", "up_proj", "down_proj"].contains(&target) {
        "mlp"
    } else {
        "self_attn"
    }
}

/// PEFT's key for a projection's adapter matrix (`which` = `lora_A` / `lora_B`).
pub fn peft_key(layer: usize, target: &str, which: &str) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{target}.{which}.weight",
        self_attn_or_mlp(target)
    )
}

/// Freeze the whole model and attach fresh adapters (PEFT initialisation) to `spec.targets`.
/// The adapters require gradients; nothing else does.
pub fn attach(model: Qwen3, spec: &LoraSpec, seed: u64) -> Qwen3 {
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
            proj.lora = Some(adapter(a, b, spec));
        }
    }
    model
}

fn adapter(a: Tensor<2>, b: Tensor<2>, spec: &LoraSpec) -> LoraAdapter {
    let (a, b) = if a.device().is_autodiff() {
        (a.detach().require_grad(), b.detach().require_grad())
    } else {
        (a, b)
    };
    LoraAdapter {
        lora_a: Param::from_tensor(a),
        lora_b: Param::from_tensor(b),
        dropout: DropoutConfig::new(spec.dropout as f64).init(),
        scaling: spec.scaling(),
    }
}

/// Fold every adapter into its base weight (`W + s·A·B`) and remove the adapters.
pub fn merge(mut model: Qwen3) -> Qwen3 {
    for layer in 0..model.model.layers.len() {
        for (_, proj) in projections_mut(&mut model, layer) {
            if let Some(ad) = proj.lora.take() {
                let base = proj.weight.val().inner();
                let w = ad.dense().inner().cast(base.dtype()) + base;
                let w = if proj.weight.val().device().is_autodiff() {
                    Tensor::from_inner(w)
                } else {
                    w
                };
                proj.weight = Param::initialized(proj.weight.id, w);
            }
        }
    }
    model
}

/// Number of adapter parameters.
pub fn adapter_params(model: &Qwen3) -> usize {
    let mut n = 0;
    for layer in 0..model.model.layers.len() {
        for (_, proj) in projections(model, layer) {
            if let Some(ad) = &proj.lora {
                n += ad.lora_a.shape().num_elements() + ad.lora_b.shape().num_elements();
            }
        }
    }
    n
}

/// PEFT's `adapter_config.json` (the fields PEFT writes for a LoRA adapter).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdapterConfig {
    pub peft_type: String,
    pub task_type: String,
    pub base_model_name_or_path: String,
    pub r: usize,
    pub lora_alpha: f32,
    pub lora_dropout: f32,
    pub target_modules: Vec<String>,
    pub bias: String,
    pub fan_in_fan_out: bool,
    pub inference_mode: bool,
    pub init_lora_weights: bool,
    pub use_rslora: bool,
    pub use_dora: bool,
    pub modules_to_save: Option<Vec<String>>,
    pub layers_to_transform: Option<Vec<usize>>,
    pub layers_pattern: Option<String>,
    pub rank_pattern: BTreeMap<String, usize>,
    pub alpha_pattern: BTreeMap<String, f32>,
    pub revision: Option<String>,
}

impl AdapterConfig {
    pub fn new(spec: &LoraSpec, base: &str) -> Self {
        Self {
            peft_type: "LORA".into(),
            task_type: "CAUSAL_LM".into(),
            base_model_name_or_path: base.into(),
            r: spec.rank,
            lora_alpha: spec.alpha,
            lora_dropout: spec.dropout,
            target_modules: spec.targets.clone(),
            bias: "none".into(),
            fan_in_fan_out: false,
            inference_mode: true,
            init_lora_weights: true,
            use_rslora: false,
            use_dora: false,
            modules_to_save: None,
            layers_to_transform: None,
            layers_pattern: None,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            revision: None,
        }
    }

    pub fn spec(&self) -> Result<LoraSpec> {
        if self.peft_type != "LORA" {
            bail!(
                "peft_type is {:?}; only LORA adapters are supported",
                self.peft_type
            );
        }
        if self.use_dora || self.use_rslora || self.fan_in_fan_out || self.bias != "none" {
            bail!(
                "only plain LoRA adapters are supported (no DoRA, rsLoRA, fan_in_fan_out or bias training)"
            );
        }
        if !self.rank_pattern.is_empty() || !self.alpha_pattern.is_empty() {
            bail!("per-module rank_pattern / alpha_pattern is not supported");
        }
        Ok(LoraSpec {
            rank: self.r,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            targets: self.target_modules.clone(),
        })
    }
}

fn to_vec(t: Tensor<2>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// Write `adapter_config.json` and `adapter_model.safetensors` (PEFT layout, f32) into `dir`.
pub fn save_peft(model: &Qwen3, spec: &LoraSpec, base: &str, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for layer in 0..model.model.layers.len() {
        for (name, proj) in projections(model, layer) {
            if let Some(ad) = &proj.lora {
                let a = ad.lora_a.val().inner().transpose(); // [r, d_in]
                let b = ad.lora_b.val().inner().transpose(); // [d_out, r]
                tensors.push((
                    peft_key(layer, name, "lora_A"),
                    a.dims().to_vec(),
                    to_vec(a),
                ));
                tensors.push((
                    peft_key(layer, name, "lora_B"),
                    b.dims().to_vec(),
                    to_vec(b),
                ));
            }
        }
    }
    if tensors.is_empty() {
        bail!("the model has no LoRA adapters to save");
    }
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((k, shape, _), b)| {
            (
                k.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                    .expect("shape matches"),
            )
        })
        .collect();
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let data = safetensors::serialize(views, Some(meta))?;
    decision_data::atomic::write_atomic(dir.join("adapter_model.safetensors"), &data)?;
    decision_data::atomic::write_json_atomic(
        dir.join("adapter_config.json"),
        &AdapterConfig::new(spec, base),
    )?;
    Ok(())
}

/// Read a PEFT adapter folder and attach its adapters to `model` (frozen base, adapters
/// trainable on an autodiff device). Missing or unexpected keys and wrong shapes are errors.
pub fn load_peft(model: Qwen3, dir: &Path) -> Result<(Qwen3, LoraSpec, String)> {
    let cfg_path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    let cfg: AdapterConfig = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a PEFT LoRA config", cfg_path.display()))?;
    let spec = cfg.spec().with_context(|| cfg_path.display().to_string())?;
    let st_path = dir.join("adapter_model.safetensors");
    let bytes =
        std::fs::read(&st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{}: not safetensors", st_path.display()))?;
    let mut remaining: BTreeMap<String, ()> = st
        .names()
        .into_iter()
        .map(|n| (n.to_string(), ()))
        .collect();
    let device: Device = model.device();
    let mut model = model.no_grad();
    for layer in 0..model.model.layers.len() {
        for (name, proj) in projections_mut(&mut model, layer) {
            if !spec.targets.iter().any(|t| t == name) {
                continue;
            }
            let [d_in, d_out] = proj.dims();
            let mut get = |which: &str, shape: [usize; 2]| -> Result<Tensor<2>> {
                let key = peft_key(layer, name, which);
                let view = st.tensor(&key).map_err(|_| {
                    anyhow::anyhow!("{}: missing tensor `{key}`", st_path.display())
                })?;
                remaining.remove(&key);
                if view.shape() != shape {
                    bail!(
                        "{}: `{key}` has shape {:?}, expected {:?}",
                        st_path.display(),
                        view.shape(),
                        shape
                    );
                }
                let data: Vec<f32> = match view.dtype() {
                    safetensors::Dtype::F32 => view
                        .data()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                    safetensors::Dtype::F16 => view
                        .data()
                        .chunks_exact(2)
                        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                        .collect(),
                    safetensors::Dtype::BF16 => view
                        .data()
                        .chunks_exact(2)
                        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                        .collect(),
                    other => bail!("{}: `{key}` has dtype {other:?}", st_path.display()),
                };
                Ok(Tensor::<2>::from_data(TensorData::new(data, shape), &device).transpose())
            };
            let a = get("lora_A", [spec.rank, d_in])?;
            let b = get("lora_B", [d_out, spec.rank])?;
            proj.lora = Some(adapter(a, b, &spec));
        }
    }
    if let Some(k) = remaining.keys().next() {
        bail!(
            "{}: unexpected tensor `{k}` (not one of the configured target modules)",
            st_path.display()
        );
    }
    Ok((model, spec, cfg.base_model_name_or_path))
}
