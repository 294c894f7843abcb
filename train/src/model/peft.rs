//! The PEFT LoRA adapter files, host-side: `adapter_config.json` + `adapter_model.safetensors` read
//! and written in PEFT's exact layout (keys such as
//! `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), so Python `peft` loads what
//! we write and we load what it writes. The one reader and writer: training attaches what it reads
//! to the Burn model ([`crate::model::lora::load_peft`]), the exporter merges it into the base weights.
//!
//! Reading is strict: every adapted module of the base model must have exactly its `lora_A` and
//! `lora_B`, with shapes that fit the base weight; a missing key, an unexpected key or a wrong
//! shape is an error naming it. Adapter features a plain `W + s·B·A` would get wrong (DoRA,
//! per-module ranks, trained biases, `modules_to_save`, …) are refused rather than ignored.
//! Trainable tokens (`trainable_token_indices`, on the token embedding) are read and written:
//! key `base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta`, `[n, hidden]`,
//! holds the rows' new values (not differences), which replace rows `trainable_token_indices` of
//! the embedding, and of the LM head when it is tied to the embedding.
//! rsLoRA is read as PEFT applies it: the scale is `alpha / sqrt(r)` instead of `alpha / r`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use safetensors::{Dtype, SafeTensors};
use serde_json::{Value, json};

use crate::model::config::Qwen3Config;
use crate::model::weights::decode_f32;

/// The projections LoRA may adapt in a Qwen3 decoder layer, with their sub-module.
pub(crate) const PROJECTIONS: [(&str, &str); 7] = [
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
];

const KEY_PREFIX: &str = "base_model.model.";
pub(crate) const CONFIG_FILE: &str = "adapter_config.json";
pub(crate) const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// A row-major f32 matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self> {
        if data.len() != rows * cols {
            bail!(
                "a {rows}×{cols} matrix needs {} values, got {}",
                rows * cols,
                data.len()
            );
        }
        Ok(Self { rows, cols, data })
    }
}

/// One adapted module: `A` is `[r, in]`, `B` is `[out, r]` (PEFT's layout).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    pub a: Matrix,
    pub b: Matrix,
}

/// Trainable tokens: `values` row `i` replaces row `ids[i]` of the token embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRows {
    pub ids: Vec<u32>,
    /// `[ids.len(), hidden]`
    pub values: Matrix,
}

/// The key of the trainable tokens' values.
pub(crate) const TOKENS_KEY: &str =
    "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta";

/// A PEFT LoRA adapter over a Qwen3 model, as its files hold it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeftAdapter {
    pub r: usize,
    pub alpha: f64,
    /// rsLoRA scaling (`alpha / sqrt(r)`) instead of `alpha / r`.
    pub use_rslora: bool,
    /// Projection names as PEFT's `target_modules` lists them (`q_proj`, …).
    pub target_modules: Vec<String>,
    pub dropout: f64,
    /// Where the base model came from (a Hub id or a path), written to `base_model_name_or_path`.
    pub base_model: Option<String>,
    /// The base model's layer count (what "every layer" means when the files are written).
    pub base_layers: usize,
    /// Keyed by module path, e.g. `model.layers.0.self_attn.q_proj`.
    pub modules: BTreeMap<String, LoraPair>,
    /// Embedding rows that trained beside the adapters (`trainable_token_indices`).
    pub tokens: Option<TokenRows>,
}

impl PeftAdapter {
    /// The factor the product `B·A` is multiplied by.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Read a PEFT adapter folder and check it against the base model's config ([`Self::read`]).
    pub fn load(dir: &Path, cfg: &Qwen3Config) -> Result<Self> {
        Self::read(dir, &BaseShape::of(cfg))
    }

    /// Read a PEFT adapter folder and check it against the base model's projections: the adapted
    /// modules follow from `target_modules` (and `layers_to_transform`), and the file must hold
    /// exactly their `lora_A` / `lora_B` weights.
    pub fn read(dir: &Path, base: &BaseShape) -> Result<Self> {
        let config_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let c: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", config_path.display()))?;
        let here = |msg: String| anyhow::anyhow!("{}: {msg}", config_path.display());
        let peft_type = c.get("peft_type").and_then(Value::as_str).unwrap_or("");
        if peft_type != "LORA" {
            return Err(here(format!(
                "field `peft_type` is {peft_type:?}; only LORA adapters can be merged"
            )));
        }
        let r = c
            .get("r")
            .and_then(Value::as_u64)
            .filter(|r| *r > 0)
            .ok_or_else(|| here("field `r` must be a positive integer".into()))?
            as usize;
        let alpha = c
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| here("field `lora_alpha` is missing".into()))?;
        let flag = |name: &str| c.get(name).and_then(Value::as_bool).unwrap_or(false);
        for refused in ["use_dora", "fan_in_fan_out", "lora_bias", "use_qalora"] {
            if flag(refused) {
                return Err(here(format!(
                    "field `{refused}` is true; such an adapter cannot be applied as W + s·B·A"
                )));
            }
        }
        let non_empty = |name: &str| match c.get(name) {
            None | Some(Value::Null) => false,
            Some(Value::Object(m)) => !m.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        for refused in [
            "rank_pattern",
            "alpha_pattern",
            "modules_to_save",
            "exclude_modules",
            "target_parameters",
        ] {
            if non_empty(refused) {
                return Err(here(format!(
                    "field `{refused}` is set; such an adapter cannot be applied as W + s·B·A"
                )));
            }
        }
        match c.get("bias").and_then(Value::as_str).unwrap_or("none") {
            "none" => {}
            other => {
                return Err(here(format!(
                    "field `bias` is {other:?}; only \"none\" can be merged"
                )));
            }
        }
        let targets = parse_targets(c.get("target_modules")).map_err(|e| here(e.to_string()))?;
        let token_ids = parse_token_indices(c.get("trainable_token_indices"), base.vocab)
            .map_err(|e| here(e.to_string()))?;
        let layers: Vec<usize> = match c.get("layers_to_transform") {
            None | Some(Value::Null) => (0..base.layers).collect(),
            Some(Value::Number(n)) => vec![n.as_u64().unwrap_or(u64::MAX) as usize],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().unwrap_or(u64::MAX) as usize)
                .collect(),
            Some(other) => {
                return Err(here(format!(
                    "field `layers_to_transform` is {other}, not a layer list"
                )));
            }
        };
        if let Some(bad) = layers.iter().find(|l| **l >= base.layers) {
            return Err(here(format!(
                "field `layers_to_transform` names layer {bad}; the model has {}",
                base.layers
            )));
        }

        let weights_path = dir.join(WEIGHTS_FILE);
        let bytes = std::fs::read(&weights_path).with_context(|| {
            let bin = dir.join("adapter_model.bin");
            if bin.is_file() {
                format!("{} is missing; pickle adapters (adapter_model.bin) can execute code and are not read — re-save with safetensors", weights_path.display())
            } else {
                format!("reading {}", weights_path.display())
            }
        })?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| {
            anyhow::anyhow!("{}: not a safetensors file: {e}", weights_path.display())
        })?;
        let mut tensors: BTreeMap<String, (Vec<usize>, Dtype, Vec<u8>)> = file
            .iter()
            .map(|(name, view)| {
                (
                    name.to_string(),
                    (view.shape().to_vec(), view.dtype(), view.data().to_vec()),
                )
            })
            .collect();

        let modules_wanted = adapted_modules(base, &targets, &layers);
        if modules_wanted.is_empty() {
            return Err(here(
                "field `target_modules` matches no projection of the model".into(),
            ));
        }
        let mut problems = Vec::new();
        let mut modules = BTreeMap::new();
        for (module, (out_dim, in_dim)) in &modules_wanted {
            let mut take = |part: &str, rows: usize, cols: usize| -> Option<Matrix> {
                let key = format!("{KEY_PREFIX}{module}.{part}.weight");
                match tensors.remove(&key) {
                    None => {
                        problems.push(format!("missing key `{key}`"));
                        None
                    }
                    Some((shape, _, _)) if shape != [rows, cols] => {
                        problems.push(format!(
                            "key `{key}` has shape {shape:?}, expected [{rows}, {cols}]"
                        ));
                        None
                    }
                    Some((_, dtype, data)) => match decode_f32(&data, dtype) {
                        Ok(values) => Some(Matrix {
                            rows,
                            cols,
                            data: values,
                        }),
                        Err(e) => {
                            problems.push(format!("key `{key}`: {e}"));
                            None
                        }
                    },
                }
            };
            let a = take("lora_A", r, *in_dim);
            let b = take("lora_B", *out_dim, r);
            if let (Some(a), Some(b)) = (a, b) {
                modules.insert(module.clone(), LoraPair { a, b });
            }
        }
        let tokens = match token_ids {
            None => None,
            Some(ids) => match tensors.remove(TOKENS_KEY) {
                None => {
                    problems.push(format!(
                        "missing key `{TOKENS_KEY}` (the config lists trainable tokens)"
                    ));
                    None
                }
                Some((shape, _, _)) if shape != [ids.len(), base.hidden] => {
                    problems.push(format!(
                        "key `{TOKENS_KEY}` has shape {shape:?}, expected [{}, {}]",
                        ids.len(),
                        base.hidden
                    ));
                    None
                }
                Some((_, dtype, data)) => match decode_f32(&data, dtype) {
                    Ok(values) => Some(TokenRows {
                        values: Matrix::new(ids.len(), base.hidden, values)?,
                        ids,
                    }),
                    Err(e) => {
                        problems.push(format!("key `{TOKENS_KEY}`: {e}"));
                        None
                    }
                },
            },
        };
        for key in tensors.keys() {
            problems.push(format!("unexpected key `{key}`"));
        }
        if !problems.is_empty() {
            let shown = problems
                .iter()
                .take(12)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ");
            let more = problems.len().saturating_sub(12);
            let tail = if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            };
            bail!(
                "{}: the adapter does not fit the model: {shown}{tail}",
                weights_path.display()
            );
        }
        Ok(Self {
            r,
            alpha,
            use_rslora: flag("use_rslora"),
            target_modules: targets.names(),
            dropout: c.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
            base_model: c
                .get("base_model_name_or_path")
                .and_then(Value::as_str)
                .map(str::to_owned),
            base_layers: base.layers,
            modules,
            tokens,
        })
    }

    /// `scaling · B·A` for one module, `[out, in]` row-major.
    pub fn delta(&self, module: &str) -> Option<Vec<f32>> {
        let pair = self.modules.get(module)?;
        let (a, b) = (&pair.a, &pair.b);
        let s = self.scaling();
        let mut out = vec![0f32; b.rows * a.cols];
        for i in 0..b.rows {
            let row = &mut out[i * a.cols..(i + 1) * a.cols];
            let mut acc = vec![0f64; a.cols];
            for k in 0..self.r {
                let bik = b.data[i * b.cols + k] as f64;
                for (j, x) in a.data[k * a.cols..(k + 1) * a.cols].iter().enumerate() {
                    acc[j] += bik * *x as f64;
                }
            }
            for (o, v) in row.iter_mut().zip(acc) {
                *o = (v * s) as f32;
            }
        }
        Some(out)
    }

    /// Write the adapter in PEFT's layout: `dir/adapter_config.json` and
    /// `dir/adapter_model.safetensors` (f32, keys `base_model.model.<module>.lora_{A,B}.weight`).
    pub fn write_peft(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (targets, layers) = self.selection()?;
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_model,
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "use_rslora": self.use_rslora,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_dora": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "trainable_token_indices": self.tokens.as_ref().map(|t| &t.ids),
            "layers_to_transform": layers,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        });
        let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (module, pair) in &self.modules {
            for (part, m) in [("lora_A", &pair.a), ("lora_B", &pair.b)] {
                let bytes = m.data.iter().flat_map(|x| x.to_le_bytes()).collect();
                blobs.push((
                    format!("{KEY_PREFIX}{module}.{part}.weight"),
                    vec![m.rows, m.cols],
                    bytes,
                ));
            }
        }
        if let Some(t) = &self.tokens {
            let bytes = t.values.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            blobs.push((
                TOKENS_KEY.to_string(),
                vec![t.values.rows, t.values.cols],
                bytes,
            ));
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = blobs
            .iter()
            .map(|(name, shape, bytes)| {
                safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| anyhow::anyhow!("adapter tensor `{name}`: {e}"))
            })
            .collect::<Result<_>>()?;
        let metadata = Some(std::collections::HashMap::from([(
            "format".to_string(),
            "pt".to_string(),
        )]));
        let bytes = safetensors::serialize(views, metadata)
            .map_err(|e| anyhow::anyhow!("serialising the adapter: {e}"))?;
        decision_data::atomic::write_atomic(dir.join(WEIGHTS_FILE), &bytes)?;
        decision_data::atomic::write_json_atomic(dir.join(CONFIG_FILE), &config)?;
        Ok(())
    }
}

impl PeftAdapter {
    /// `target_modules` and `layers_to_transform` that select exactly the modules held: the
    /// projection names (and the layers, unless every layer is adapted) when the modules are every
    /// such projection of every such layer, else a pattern naming each module.
    fn selection(&self) -> Result<(Value, Value)> {
        let mut layers = std::collections::BTreeSet::new();
        let mut projs: Vec<&str> = Vec::new();
        for module in self.modules.keys() {
            let (layer, proj) = module
                .strip_prefix("model.layers.")
                .and_then(|rest| Some((rest.split('.').next()?, rest.rsplit('.').next()?)))
                .with_context(|| format!("adapter module `{module}` is not a layer projection"))?;
            let layer: usize = layer
                .parse()
                .with_context(|| format!("adapter module `{module}` has no layer number"))?;
            layers.insert(layer);
            if !projs.contains(&proj) {
                projs.push(proj);
            }
        }
        projs.sort_by_key(|p| PROJECTIONS.iter().position(|(_, q)| q == p));
        if layers.len() * projs.len() != self.modules.len() {
            let names: Vec<String> = self.modules.keys().map(|m| regex::escape(m)).collect();
            return Ok((Value::String(names.join("|")), Value::Null));
        }
        let every = layers.iter().copied().eq(0..self.base_layers);
        let layers = if every { Value::Null } else { json!(layers) };
        Ok((json!(projs), layers))
    }
}

/// `target_modules` as PEFT reads it: a list of module-name suffixes, a regular expression that
/// must match the whole module path, or `"all-linear"` (every projection, not the LM head).
enum Targets {
    List(Vec<String>),
    Regex(regex::Regex),
}

impl Targets {
    fn matches(&self, module: &str) -> bool {
        match self {
            Targets::List(list) => list
                .iter()
                .any(|t| module == t || module.ends_with(&format!(".{t}"))),
            Targets::Regex(re) => re.is_match(module),
        }
    }

    fn names(&self) -> Vec<String> {
        match self {
            Targets::List(list) => list.clone(),
            Targets::Regex(re) => {
                let mut seen: Vec<String> = Vec::new();
                for (sub, proj) in PROJECTIONS {
                    if re.is_match(&format!("model.layers.0.{sub}.{proj}"))
                        && !seen.iter().any(|s| s == proj)
                    {
                        seen.push(proj.to_string());
                    }
                }
                seen
            }
        }
    }
}

fn parse_targets(v: Option<&Value>) -> Result<Targets> {
    match v {
        Some(Value::String(s)) if s == "all-linear" => Ok(Targets::List(
            PROJECTIONS.iter().map(|(_, p)| p.to_string()).collect(),
        )),
        Some(Value::String(s)) => {
            let re = regex::Regex::new(&format!("^(?:{s})$")).with_context(|| {
                format!("field `target_modules` is not a valid regular expression: {s:?}")
            })?;
            Ok(Targets::Regex(re))
        }
        Some(Value::Array(a)) => {
            let list: Vec<String> = a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect();
            if list.len() != a.len() || list.is_empty() {
                bail!("field `target_modules` must be a non-empty list of module names");
            }
            let known: Vec<&str> = PROJECTIONS.iter().map(|(_, p)| *p).collect();
            if let Some(bad) = list.iter().find(|t| {
                !known.iter().any(|k| {
                    *k == t.as_str()
                        || k.ends_with(&format!(".{t}"))
                        || t.ends_with(&format!(".{k}"))
                })
            }) {
                bail!(
                    "field `target_modules` names {bad:?}; LoRA applies only to {}",
                    known.join(", ")
                );
            }
            Ok(Targets::List(list))
        }
        _ => bail!("field `target_modules` is missing"),
    }
}

/// `trainable_token_indices` as PEFT writes it for the token embedding: a list of token ids, or
/// a map naming `embed_tokens` alone. `None` when absent or empty.
fn parse_token_indices(v: Option<&Value>, vocab: usize) -> Result<Option<Vec<u32>>> {
    let list = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(Value::Object(m)) => match (m.len(), m.get("embed_tokens")) {
            (0, _) => return Ok(None),
            (1, Some(Value::Array(a))) => a,
            _ => bail!(
                "field `trainable_token_indices` names modules other than `embed_tokens`; only \
                 the token embedding's rows can be applied"
            ),
        },
        Some(other) => bail!("field `trainable_token_indices` is {other}, not a list of token ids"),
    };
    if list.is_empty() {
        return Ok(None);
    }
    let mut ids = Vec::with_capacity(list.len());
    for x in list {
        match x.as_u64() {
            Some(id) if (id as usize) < vocab => {
                if ids.contains(&(id as u32)) {
                    bail!("field `trainable_token_indices` lists token {id} twice");
                }
                ids.push(id as u32)
            }
            _ => bail!(
                "field `trainable_token_indices` holds {x}; token ids are integers below the \
                 vocabulary size {vocab}"
            ),
        }
    }
    Ok(Some(ids))
}

/// What an adapter is checked against: the base model's layer count, the `(out, in)` shape of
/// each of [`PROJECTIONS`] (the same in every layer of a Qwen3 model), and the embedding's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseShape {
    pub layers: usize,
    /// In the order of [`PROJECTIONS`].
    pub dims: [(usize, usize); 7],
    pub vocab: usize,
    pub hidden: usize,
}

impl BaseShape {
    /// The projections of a Qwen3 model with this config.
    pub fn of(cfg: &Qwen3Config) -> Self {
        let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        Self {
            layers: cfg.num_hidden_layers,
            dims: [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)],
            vocab: cfg.vocab_size,
            hidden: h,
        }
    }
}

/// Module path → (out, in) of every projection the targets select.
fn adapted_modules(
    base: &BaseShape,
    targets: &Targets,
    layers: &[usize],
) -> BTreeMap<String, (usize, usize)> {
    let mut out = BTreeMap::new();
    for l in layers {
        for ((sub, proj), dims) in PROJECTIONS.iter().zip(base.dims) {
            let module = format!("model.layers.{l}.{sub}.{proj}");
            if targets.matches(&module) {
                out.insert(module, dims);
            }
        }
    }
    out
}
