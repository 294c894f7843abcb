//! Hugging Face safetensors in and out: one `model.safetensors` or the shards listed in
//! `model.safetensors.index.json`; f32, f16 and bf16 on disk, converted to the compute dtype.
//! Files are memory-mapped and converted one tensor at a time.
//!
//! Names and shapes are checked against the config before any weight is read: every missing,
//! unexpected or mis-shaped tensor is named in one error.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;

use crate::model::config::Qwen3Config;
use crate::model::qwen3::{
    Attention, DecoderLayer, Embedding, LmHead, Mlp, Proj, Qwen3, Qwen3Model, RmsNorm,
};

pub(crate) const SINGLE_FILE: &str = "model.safetensors";
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// One weight in the checkpoint's layout: HF name, HF shape (`[out, in]` for projections),
/// row-major f32 values.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// On-disk element type for [`save_model`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveDtype {
    F32,
    F16,
    BF16,
}

/// A run's `final/` keeps the dtype its weights were trained in: a bf16 base with merged
/// adapters is already rounded to bf16, so an f32 copy would only double the file.
impl From<crate::model::backend::Precision> for SaveDtype {
    fn from(p: crate::model::backend::Precision) -> Self {
        match p {
            crate::model::backend::Precision::F32 => SaveDtype::F32,
            crate::model::backend::Precision::F16 => SaveDtype::F16,
            crate::model::backend::Precision::Bf16 => SaveDtype::BF16,
            crate::model::backend::Precision::Auto => {
                unreachable!("a run resolves `auto` against its device before it saves a model")
            }
        }
    }
}

impl SaveDtype {
    fn tag(self) -> &'static str {
        match self {
            SaveDtype::F32 => "F32",
            SaveDtype::F16 => "F16",
            SaveDtype::BF16 => "BF16",
        }
    }
    fn width(self) -> usize {
        match self {
            SaveDtype::F32 => 4,
            _ => 2,
        }
    }
    pub(crate) fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::F16 => "float16",
            SaveDtype::BF16 => "bfloat16",
        }
    }
}

/// Where each tensor of a model is stored: a single file or the shards of an index.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    let single = dir.join(SINGLE_FILE);
    if index.is_file() {
        let shards = read_index(&index)?;
        let missing: Vec<&String> = shards.iter().filter(|s| !dir.join(s).is_file()).collect();
        if !missing.is_empty() {
            bail!(
                "{}: lists shards that are not in the folder: {}",
                index.display(),
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        return Ok(shards.into_iter().map(|s| dir.join(s)).collect());
    }
    if single.is_file() {
        return Ok(vec![single]);
    }
    refuse_pickle(dir)?;
    bail!(
        "{}: no {SINGLE_FILE} and no {INDEX_FILE}; a model folder needs Hugging Face safetensors weights",
        dir.display()
    )
}

/// Refuse pickle checkpoints, saying why and how to convert.
pub(crate) fn refuse_pickle(dir: &Path) -> Result<()> {
    for name in ["pytorch_model.bin", "pytorch_model.bin.index.json"] {
        if dir.join(name).exists() {
            bail!(
                "{}: found {name} but no safetensors weights. Pickle checkpoints are refused: \
                 loading one can run arbitrary code. Convert it once in Python with \
                 `AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out, safe_serialization=True)`",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The shard file names listed in an index, in first-seen order.
pub(crate) fn read_index(index: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", index.display()))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .with_context(|| format!("{}: no `weight_map` object", index.display()))?;
    let mut shards: Vec<String> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().with_context(|| {
            format!(
                "{}: weight_map[{name:?}] is not a file name",
                index.display()
            )
        })?;
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            bail!(
                "{}: weight_map[{name:?}] = {file:?} is not a plain file name",
                index.display()
            );
        }
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
    }
    Ok(shards)
}

/// The largest tensor of [`expected_tensors`]: its name and shape (on a GPU, the weight that
/// needs the largest buffer).
pub fn largest_tensor(config: &Qwen3Config) -> (String, Vec<usize>) {
    expected_tensors(config)
        .into_iter()
        .max_by_key(|(_, shape)| shape.iter().product::<usize>())
        .unwrap_or_default()
}

/// The tensors a Qwen3 checkpoint holds for `config`, with their HF shapes.
pub fn expected_tensors(config: &Qwen3Config) -> Vec<(String, Vec<usize>)> {
    let (h, d) = (config.hidden_size, config.head_dim);
    let q = config.num_attention_heads * d;
    let kv = config.num_key_value_heads * d;
    let i = config.intermediate_size;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![config.vocab_size, h],
    )];
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut push = |n: &str, s: Vec<usize>| out.push((format!("{p}.{n}"), s));
        push("input_layernorm.weight", vec![h]);
        push("self_attn.q_proj.weight", vec![q, h]);
        push("self_attn.k_proj.weight", vec![kv, h]);
        push("self_attn.v_proj.weight", vec![kv, h]);
        push("self_attn.o_proj.weight", vec![h, q]);
        if config.attention_bias {
            push("self_attn.q_proj.bias", vec![q]);
            push("self_attn.k_proj.bias", vec![kv]);
            push("self_attn.v_proj.bias", vec![kv]);
            push("self_attn.o_proj.bias", vec![h]);
        }
        push("self_attn.q_norm.weight", vec![d]);
        push("self_attn.k_norm.weight", vec![d]);
        push("post_attention_layernorm.weight", vec![h]);
        push("mlp.gate_proj.weight", vec![i, h]);
        push("mlp.up_proj.weight", vec![i, h]);
        push("mlp.down_proj.weight", vec![h, i]);
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !config.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![config.vocab_size, h]));
    }
    out
}

/// Little-endian tensor bytes of a floating dtype to f32: the one safetensors decoder (model
/// weights and PEFT adapters alike).
pub(crate) fn decode_f32(bytes: &[u8], dtype: StDtype) -> Result<Vec<f32>> {
    Ok(match dtype {
        StDtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        StDtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StDtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StDtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect(),
        other => {
            bail!("dtype {other:?} is not a floating-point weight type (F32, F16, BF16 or F64)")
        }
    })
}

/// A read-only set of named tensors, converted to f32 on read: a checkpoint on disk
/// ([`SafetensorsDir`]), tensors in memory ([`MemorySource`]), or a wrapper such as the exporter's
/// LoRA merge.
pub trait WeightSource: Send + Sync {
    /// Every tensor name, sorted.
    fn names(&self) -> Vec<String>;
    /// The shape of a tensor, `None` when there is no such tensor.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// The tensor's values in row-major order, converted to f32.
    fn read_f32(&self, name: &str) -> Result<Vec<f32>>;
}

/// Compare the names and shapes `weights` holds with what `config` needs; one error lists every
/// problem. Tolerated extras: `lm_head.weight` of a tied model (the tie wins, as in
/// transformers) and the `rotary_emb.inv_freq` buffers old checkpoints carry (recomputed from the
/// config).
pub fn check_tensors(config: &Qwen3Config, weights: &dyn WeightSource, origin: &str) -> Result<()> {
    let expected = expected_tensors(config);
    let mut missing = Vec::new();
    let mut misshaped = Vec::new();
    for (name, shape) in &expected {
        match weights.shape(name) {
            None => missing.push(name.clone()),
            Some(found) if &found != shape => {
                misshaped.push(format!("{name}: expected {shape:?}, found {found:?}"))
            }
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let unexpected: Vec<String> = weights
        .names()
        .into_iter()
        .filter(|n| !known.contains(n.as_str()))
        .filter(|n| !(config.tie_word_embeddings && n == "lm_head.weight"))
        .filter(|n| !n.ends_with("rotary_emb.inv_freq"))
        .collect();
    if missing.is_empty() && misshaped.is_empty() && unexpected.is_empty() {
        return Ok(());
    }
    let mut msg = format!("{origin}: the weights do not match config.json");
    for (title, items) in [
        ("missing", &missing),
        ("mis-shaped", &misshaped),
        ("unexpected", &unexpected),
    ] {
        if !items.is_empty() {
            let shown: Vec<&str> = items.iter().take(20).map(String::as_str).collect();
            let more = if items.len() > 20 {
                format!(" … and {} more", items.len() - 20)
            } else {
                String::new()
            };
            msg.push_str(&format!(
                "\n  {title} ({}): {}{more}",
                items.len(),
                shown.join(", ")
            ));
        }
    }
    bail!(msg)
}

/// Where one tensor lies: which file, its dtype and shape, its absolute byte range.
struct Entry {
    file: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

struct Mapped {
    path: PathBuf,
    mmap: Mmap,
}

/// Memory-mapped safetensors files read as one set of names: a model folder's weights
/// ([`SafetensorsDir::open`]) or given files ([`SafetensorsDir::open_files`]).
pub struct SafetensorsDir {
    files: Vec<Mapped>,
    entries: BTreeMap<String, Entry>,
}

impl SafetensorsDir {
    /// The weights of a model folder: the shards of its index, or its single file
    /// ([`weight_files`]).
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_files(&weight_files(dir)?)
    }

    /// One or more safetensors files as one set of names; a name stored twice is an error.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::new();
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        for (i, path) in paths.iter().enumerate() {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: the map is read-only; a file changed underneath us while loading is the
            // same hazard every safetensors reader accepts.
            let mmap = unsafe { Mmap::map(&file) }
                .with_context(|| format!("memory-mapping {}", path.display()))?;
            // Parsing the whole file checks that the header's offsets cover the data exactly.
            let st = SafeTensors::deserialize(&mmap).map_err(|e| {
                anyhow::anyhow!("{}: not a valid safetensors file: {e}", path.display())
            })?;
            for (name, view) in st.tensors() {
                if let Some(prev) = entries.get(&name) {
                    bail!(
                        "tensor {name:?} is stored twice: in {} and {}",
                        paths[prev.file].display(),
                        path.display()
                    );
                }
                let start = view.data().as_ptr() as usize - mmap.as_ptr() as usize;
                let entry = Entry {
                    file: i,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    start,
                    end: start + view.data().len(),
                };
                entries.insert(name, entry);
            }
            files.push(Mapped {
                path: path.clone(),
                mmap,
            });
        }
        Ok(Self { files, entries })
    }

    /// Drop the mapped pages of a tensor that has been copied out, so that loading a checkpoint
    /// does not keep the whole file resident beside the model (an 8 GB bf16 file would otherwise
    /// count fully in the process's memory until the load ends). The pages are read again from
    /// the file if the tensor is read again.
    fn release(&self, e: &Entry) {
        #[cfg(unix)]
        {
            // SAFETY: the map is a read-only file mapping and no slice into this range outlives
            // the read (the values were copied out); DONTNEED on such a mapping only drops
            // pages, which a later access faults back in from the file.
            let _ = unsafe {
                self.files[e.file].mmap.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    e.start,
                    e.end - e.start,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = e;
    }

    /// Compare the stored names and shapes with what `config` needs ([`check_tensors`]).
    pub fn check(&self, config: &Qwen3Config, origin: &str) -> Result<()> {
        check_tensors(config, self, origin)
    }
}

impl WeightSource for SafetensorsDir {
    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.shape.clone())
    }

    /// Read a tensor as f32 (converting f16/bf16/f64).
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("tensor {name:?} not found"))?;
        let f = &self.files[e.file];
        let out = decode_f32(&f.mmap[e.start..e.end], e.dtype)
            .with_context(|| format!("{}: tensor {name:?}", f.path.display()))?;
        self.release(e);
        Ok(out)
    }
}

/// Tensors held in memory: derived weights, and tests.
#[derive(Default, Clone)]
pub struct MemorySource {
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

impl MemorySource {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape does not match data"
        );
        self.tensors.insert(name.into(), (shape, data));
    }
}

impl WeightSource for MemorySource {
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|(s, _)| s.clone())
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.tensors
            .get(name)
            .map(|(_, d)| d.clone())
            .with_context(|| format!("no tensor named `{name}`"))
    }
}

/// Load a checkpoint into a model on `device`, computing in `dtype` (F32 or F16).
pub fn load_model(
    config: &Qwen3Config,
    files: &[PathBuf],
    origin: &str,
    device: &Device,
    dtype: DType,
) -> Result<Qwen3> {
    let ckpt = SafetensorsDir::open_files(files)?;
    ckpt.check(config, origin)?;
    build_model(config, device, dtype, |name| {
        let data = ckpt.read_f32(name)?;
        // A NaN or infinite weight would score every state with `confidence: null` (issue 19):
        // refuse the checkpoint here, naming the tensor.
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            let bad = data.iter().filter(|x| !x.is_finite()).count();
            bail!(
                "{origin}: tensor {name:?} holds {bad} non-finite value(s) (the first, {}, at \
                 element {i}); the checkpoint is corrupt or was saved after a diverged run",
                data[i]
            );
        }
        Ok(data)
    })
}

/// Assemble a model from HF-layout tensors returned by `get(name)`.
pub(crate) fn build_model(
    config: &Qwen3Config,
    device: &Device,
    dtype: DType,
    mut get: impl FnMut(&str) -> Result<Vec<f32>>,
) -> Result<Qwen3> {
    let mut matrices: HashMap<String, Tensor<2>> = HashMap::new();
    let mut vectors: HashMap<String, Tensor<1>> = HashMap::new();
    for (name, shape) in expected_tensors(config) {
        let data = get(&name)?;
        let n: usize = shape.iter().product();
        if data.len() != n {
            bail!("tensor {name:?}: {} values for shape {shape:?}", data.len());
        }
        if let [rows, cols] = shape[..] {
            let t = if name.ends_with("_proj.weight") {
                TensorData::new(transpose_host(&data, rows, cols), [cols, rows])
            } else {
                TensorData::new(data, [rows, cols])
            };
            matrices.insert(name, Tensor::<2>::from_data(t, (device, dtype)));
        } else {
            vectors.insert(
                name,
                Tensor::<1>::from_data(TensorData::new(data, [n]), (device, dtype)),
            );
        }
    }
    let mut m = |name: &str| matrices.remove(name).expect("expected matrix loaded");
    let mut v = |name: &str| vectors.remove(name).expect("expected vector loaded");
    let eps = config.rms_norm_eps;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut attn_proj = |n: &str| {
            let bias = config
                .attention_bias
                .then(|| v(&format!("{p}.self_attn.{n}.bias")));
            Proj::new(m(&format!("{p}.self_attn.{n}.weight")), bias)
        };
        let q_proj = attn_proj("q_proj");
        let k_proj = attn_proj("k_proj");
        let v_proj = attn_proj("v_proj");
        let o_proj = attn_proj("o_proj");
        let mlp = Mlp {
            gate_proj: Proj::new(m(&format!("{p}.mlp.gate_proj.weight")), None),
            up_proj: Proj::new(m(&format!("{p}.mlp.up_proj.weight")), None),
            down_proj: Proj::new(m(&format!("{p}.mlp.down_proj.weight")), None),
        };
        let mut norm = |n: &str| RmsNorm::new(v(&format!("{p}.{n}.weight")), eps);
        layers.push(DecoderLayer {
            input_layernorm: norm("input_layernorm"),
            self_attn: Attention {
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                q_norm: norm("self_attn.q_norm"),
                k_norm: norm("self_attn.k_norm"),
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_key_value_heads,
                head_dim: config.head_dim,
            },
            post_attention_layernorm: norm("post_attention_layernorm"),
            mlp,
        });
    }
    let embed = m("model.embed_tokens.weight");
    let lm_head = (!config.tie_word_embeddings).then(|| LmHead {
        weight: Param::from_tensor(m("lm_head.weight")),
    });
    Ok(Qwen3 {
        model: Qwen3Model {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm: RmsNorm::new(v("model.norm.weight"), eps),
        },
        lm_head,
        tokens: None,
        rope_theta: config.rope_theta,
    })
}

/// `[rows, cols]` → `[cols, rows]`, blocked for cache friendliness.
fn transpose_host(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const B: usize = 32;
    let mut out = vec![0f32; data.len()];
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    out[c * rows + r] = data[r * cols + c];
                }
            }
        }
    }
    out
}

enum Held {
    Proj(Tensor<2>),
    Plain2(Tensor<2>),
    Plain1(Tensor<1>),
}

fn held_params(model: &Qwen3) -> Vec<(String, Held)> {
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        Held::Plain2(model.model.embed_tokens.weight.val()),
    )];
    for (l, layer) in model.model.layers.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let a = &layer.self_attn;
        out.push((
            format!("{p}.input_layernorm.weight"),
            Held::Plain1(layer.input_layernorm.weight.val()),
        ));
        for (n, proj) in [
            ("q_proj", &a.q_proj),
            ("k_proj", &a.k_proj),
            ("v_proj", &a.v_proj),
            ("o_proj", &a.o_proj),
        ] {
            out.push((
                format!("{p}.self_attn.{n}.weight"),
                Held::Proj(proj.weight.val()),
            ));
        }
        for (n, proj) in [
            ("q_proj", &a.q_proj),
            ("k_proj", &a.k_proj),
            ("v_proj", &a.v_proj),
            ("o_proj", &a.o_proj),
        ] {
            if let Some(b) = &proj.bias {
                out.push((format!("{p}.self_attn.{n}.bias"), Held::Plain1(b.val())));
            }
        }
        out.push((
            format!("{p}.self_attn.q_norm.weight"),
            Held::Plain1(a.q_norm.weight.val()),
        ));
        out.push((
            format!("{p}.self_attn.k_norm.weight"),
            Held::Plain1(a.k_norm.weight.val()),
        ));
        out.push((
            format!("{p}.post_attention_layernorm.weight"),
            Held::Plain1(layer.post_attention_layernorm.weight.val()),
        ));
        let m = &layer.mlp;
        for (n, proj) in [
            ("gate_proj", &m.gate_proj),
            ("up_proj", &m.up_proj),
            ("down_proj", &m.down_proj),
        ] {
            out.push((format!("{p}.mlp.{n}.weight"), Held::Proj(proj.weight.val())));
        }
    }
    out.push((
        "model.norm.weight".to_string(),
        Held::Plain1(model.model.norm.weight.val()),
    ));
    if let Some(head) = &model.lm_head {
        out.push((
            "lm_head.weight".to_string(),
            Held::Plain2(head.weight.val()),
        ));
    }
    out
}

fn materialize(name: String, held: Held) -> HfTensor {
    let (shape, data) = match held {
        Held::Proj(w) => {
            let t = w.transpose();
            (t.dims().to_vec(), t.into_data())
        }
        Held::Plain2(t) => (t.dims().to_vec(), t.into_data()),
        Held::Plain1(t) => (t.dims().to_vec(), t.into_data()),
    };
    let data = data
        .convert_dtype(DType::F32)
        .try_into_vec::<f32>()
        .expect("f32 after conversion");
    HfTensor { name, shape, data }
}

/// The model's weights in checkpoint layout, one at a time (names as Hugging Face writes them;
/// projections `[out, in]`). Nothing is read from the device until the iterator reaches it.
pub fn hf_tensors(model: &Qwen3) -> impl Iterator<Item = HfTensor> + '_ {
    held_params(model)
        .into_iter()
        .map(|(name, held)| materialize(name, held))
}

/// Names and HF shapes of the model's weights, without reading them.
pub(crate) fn hf_shapes(model: &Qwen3) -> Vec<(String, Vec<usize>)> {
    held_params(model)
        .into_iter()
        .map(|(name, held)| {
            let shape = match held {
                Held::Proj(w) => {
                    let [a, b] = w.dims();
                    vec![b, a]
                }
                Held::Plain2(t) => t.dims().to_vec(),
                Held::Plain1(t) => t.dims().to_vec(),
            };
            (name, shape)
        })
        .collect()
}

/// Write tensors as one safetensors file, atomically, streaming one tensor at a time.
/// `shapes` must list the tensors in the order `tensors` yields them.
pub fn write_safetensors(
    path: &Path,
    shapes: &[(String, Vec<usize>)],
    tensors: impl Iterator<Item = HfTensor>,
    dtype: SaveDtype,
) -> Result<()> {
    let pt = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_with(path, shapes, tensors, dtype, &pt)
}

/// [`write_safetensors`] with the header's `__metadata__` given.
pub(crate) fn write_safetensors_with(
    path: &Path,
    shapes: &[(String, Vec<usize>)],
    tensors: impl Iterator<Item = HfTensor>,
    dtype: SaveDtype,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut header = serde_json::Map::new();
    let meta = metadata
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    header.insert("__metadata__".into(), Value::Object(meta));
    let mut offset = 0usize;
    for (name, shape) in shapes {
        let n: usize = shape.iter().product();
        let end = offset + n * dtype.width();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype.tag(), "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header_bytes = serde_json::to_vec(&Value::Object(header))?;
    while header_bytes.len() % 8 != 0 {
        header_bytes.push(b' ');
    }
    let mut out = decision_data::atomic::AtomicFile::create(path)?;
    out.write_all(&(header_bytes.len() as u64).to_le_bytes())?;
    out.write_all(&header_bytes)?;
    let mut count = 0;
    for (t, (name, shape)) in tensors.zip(shapes) {
        if &t.name != name || &t.shape != shape {
            bail!("internal: tensor order differs from the header at {name}");
        }
        let mut buf = Vec::with_capacity(t.data.len() * dtype.width());
        match dtype {
            SaveDtype::F32 => t
                .data
                .iter()
                .for_each(|x| buf.extend_from_slice(&x.to_le_bytes())),
            SaveDtype::F16 => t
                .data
                .iter()
                .for_each(|x| buf.extend_from_slice(&half::f16::from_f32(*x).to_le_bytes())),
            SaveDtype::BF16 => t
                .data
                .iter()
                .for_each(|x| buf.extend_from_slice(&half::bf16::from_f32(*x).to_le_bytes())),
        }
        out.write_all(&buf)
            .with_context(|| format!("writing {}", path.display()))?;
        count += 1;
    }
    if count != shapes.len() {
        bail!(
            "internal: {} tensors written, {} declared",
            count,
            shapes.len()
        );
    }
    out.commit()
}

/// Save `config.json` + `model.safetensors` in the Hugging Face layout.
pub(crate) fn save_model(
    model: &Qwen3,
    config: &Qwen3Config,
    dir: &Path,
    dtype: SaveDtype,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cfg = config.to_hf_json();
    cfg["torch_dtype"] = Value::String(dtype.torch_name().into());
    decision_data::atomic::write_json_atomic(dir.join("config.json"), &cfg)?;
    let shapes = hf_shapes(model);
    write_safetensors(&dir.join(SINGLE_FILE), &shapes, hf_tensors(model), dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_transpose() {
        let data: Vec<f32> = (0..35 * 70).map(|x| x as f32).collect();
        let t = transpose_host(&data, 35, 70);
        for r in 0..35 {
            for c in 0..70 {
                assert_eq!(t[c * 35 + r], data[r * 70 + c]);
            }
        }
    }
}
