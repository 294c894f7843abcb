//! Named weights, read one tensor at a time.
//!
//! The exporter never holds the whole model in memory: the graph description names its weights,
//! and a writer asks a [`WeightSource`] for each tensor (as f32) when it writes it. A Hugging Face
//! checkpoint is memory-mapped ([`SafetensorsDir`]); LoRA merging wraps a source
//! ([`crate::lora::MergedSource`]); tests and derived tensors use [`MemorySource`].

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// A read-only set of named tensors, converted to f32 on read.
pub trait WeightSource: Send + Sync {
    /// Every tensor name, sorted.
    fn names(&self) -> Vec<String>;
    /// The shape of a tensor, `None` when there is no such tensor.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// The tensor's values in row-major order, converted to f32.
    fn read_f32(&self, name: &str) -> Result<Vec<f32>>;
}

struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard file.
    start: usize,
    end: usize,
}

/// The safetensors weights of a Hugging Face model folder: `model.safetensors`, or the shards listed
/// in `model.safetensors.index.json`. Files are memory-mapped.
pub struct SafetensorsDir {
    files: Vec<PathBuf>,
    maps: Vec<Mmap>,
    entries: BTreeMap<String, Entry>,
}

impl SafetensorsDir {
    /// Open the weights of a model folder.
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            let text = std::fs::read_to_string(&index)
                .with_context(|| format!("reading {}", index.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not valid JSON", index.display()))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .with_context(|| format!("{}: field `weight_map` missing", index.display()))?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else if dir.join("pytorch_model.bin").is_file() {
            bail!(
                "{}: only pickle weights (pytorch_model.bin), which can execute code when loaded; \
                 convert them to safetensors first (transformers: model.save_pretrained(dir, \
                 safe_serialization=True))",
                dir.display()
            );
        } else {
            bail!(
                "{}: no model.safetensors or model.safetensors.index.json",
                dir.display()
            );
        };
        Self::open_files(&files)
    }

    /// Open one or more safetensors files as one set of names.
    pub fn open_files(files: &[PathBuf]) -> Result<Self> {
        let mut maps = Vec::new();
        let mut entries = BTreeMap::new();
        for (shard, path) in files.iter().enumerate() {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: the file is opened read-only and not modified while mapped; a concurrent
            // writer elsewhere would be a user error that at worst yields wrong values, which the
            // parity gate catches.
            let map = unsafe { Mmap::map(&file) }
                .with_context(|| format!("memory-mapping {}", path.display()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| anyhow::anyhow!("{}: not a safetensors file: {e}", path.display()))?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (start, end) = info.data_offsets;
                if entries.contains_key(&name) {
                    bail!(
                        "{}: tensor `{name}` also appears in another shard",
                        path.display()
                    );
                }
                entries.insert(
                    name,
                    Entry {
                        shard,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: base + start,
                        end: base + end,
                    },
                );
            }
            maps.push(map);
        }
        Ok(Self {
            files: files.to_vec(),
            maps,
            entries,
        })
    }

    /// The on-disk dtype of a tensor (for reporting), e.g. `"BF16"`.
    pub fn dtype(&self, name: &str) -> Option<String> {
        self.entries.get(name).map(|e| format!("{:?}", e.dtype))
    }
}

impl WeightSource for SafetensorsDir {
    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.shape.clone())
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("no tensor named `{name}`"))?;
        let bytes = &self.maps[e.shard][e.start..e.end];
        let file = &self.files[e.shard];
        decode_f32(bytes, e.dtype).with_context(|| format!("{}: tensor `{name}`", file.display()))
    }
}

/// Little-endian tensor bytes of a floating dtype to f32.
pub fn decode_f32(bytes: &[u8], dtype: Dtype) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect(),
        other => bail!("dtype {other:?} is not a floating-point weight type"),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_half_precision_formats() {
        let bf = half::bf16::from_f32(1.5).to_le_bytes();
        assert_eq!(decode_f32(&bf, Dtype::BF16).unwrap(), vec![1.5]);
        let h = half::f16::from_f32(-0.25).to_le_bytes();
        assert_eq!(decode_f32(&h, Dtype::F16).unwrap(), vec![-0.25]);
        assert!(decode_f32(&[0u8; 4], Dtype::I32).is_err());
    }
}
