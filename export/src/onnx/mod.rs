//! The ONNX writer: lowers the [graph description](crate::graph) to an ONNX model.
//!
//! Opset 18 (the default) decomposes everything into standard ops any runtime has (Gather, MatMul,
//! RMSNorm as Pow/ReduceMean/Add/Sqrt/Div/Mul, RoPE with Slice/Neg/Concat, GQA by Expand, the mask
//! from Range/Greater/Equal/Or/Where, Softmax, SiLU as Sigmoid·Mul). Opset 23 uses the fused
//! `RMSNormalization`, `RotaryEmbedding` and `Attention` ops instead.
//!
//! The protobuf types come from `proto/onnx.proto` (our own subset of the spec) via `prost`.
//! Weights over 2 GB (or always, with [`OnnxOptions::external_data`]) go to `model.onnx.data`, each
//! at a 4096-aligned offset; builder-made constants (shapes, scalars, RoPE frequencies) stay inline.

pub(crate) mod export;
mod lower;
pub mod probes;
pub mod verify;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use decision_data::atomic::AtomicFile;
use prost::Message;

use crate::graph::{DType, Graph};

/// The generated ONNX message types.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// File name of the model inside the bundle.
pub const MODEL_FILE: &str = "model.onnx";
/// File name of the external weights beside it.
pub const DATA_FILE: &str = "model.onnx.data";
/// Above this many bytes of weights the model is written with external data: a protobuf message
/// cannot exceed 2 GiB, and the graph itself needs some room.
pub(crate) const INLINE_LIMIT: u64 = 2_000_000_000;
/// Alignment of every tensor in `model.onnx.data` (a page, so a runtime can memory-map each one).
pub const DATA_ALIGN: u64 = 4096;

/// Which ONNX flavour to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnnxOptions {
    /// 18 (decomposed, the default) or 23 (fused RMSNormalization / RotaryEmbedding / Attention).
    pub opset: i64,
    /// Write the weights to `model.onnx.data` even when they would fit inline.
    pub external_data: bool,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        Self {
            opset: 18,
            external_data: false,
        }
    }
}

/// What [`write_onnx`] wrote.
#[derive(Debug, Clone)]
pub struct OnnxFiles {
    pub model: PathBuf,
    /// `model.onnx.data`, when the weights went there.
    pub data: Option<PathBuf>,
}

/// The ONNX IR version that goes with an opset (onnx's own version table).
fn ir_version(opset: i64) -> i64 {
    if opset >= 23 { 11 } else { 8 }
}

pub(crate) fn elem_type(dtype: DType) -> i32 {
    use pb::tensor_proto::DataType;
    match dtype {
        DType::F32 => DataType::Float as i32,
        DType::F16 => DataType::Float16 as i32,
        DType::I64 => DataType::Int64 as i32,
    }
}

/// Lower `graph` and write `dir/model.onnx` (and `dir/model.onnx.data` when the weights go
/// external). Each file is written atomically.
pub fn write_onnx(graph: &Graph, opts: OnnxOptions, dir: &Path) -> Result<OnnxFiles> {
    if opts.opset != 18 && opts.opset != 23 {
        bail!("--opset must be 18 or 23, got {}", opts.opset);
    }
    let mut lowered = lower::lower(graph, opts.opset)?;
    let external = opts.external_data || graph.const_bytes_total() > INLINE_LIMIT;
    let model_path = dir.join(MODEL_FILE);
    let data_path = dir.join(DATA_FILE);

    // Weights: one tensor at a time, inline or appended to the data file.
    let mut data_file = if external {
        Some(AtomicFile::create(&data_path)?)
    } else {
        None
    };
    let mut offset: u64 = 0;
    let bar = decision_data::progress::task(lowered.weights.len() as u64, "writing ONNX weights");
    for w in &mut lowered.weights {
        let bytes = lowered_weight_bytes(graph, w)?;
        match data_file.as_mut() {
            Some(f) => {
                let pad = offset.next_multiple_of(DATA_ALIGN) - offset;
                f.write_all(&vec![0u8; pad as usize])?;
                offset += pad;
                f.write_all(&bytes)
                    .with_context(|| format!("writing {}", data_path.display()))?;
                w.tensor.data_location = pb::tensor_proto::DataLocation::External as i32;
                w.tensor.external_data = vec![
                    entry("location", DATA_FILE),
                    entry("offset", &offset.to_string()),
                    entry("length", &bytes.len().to_string()),
                ];
                offset += bytes.len() as u64;
            }
            None => w.tensor.raw_data = bytes,
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut model = lowered.model;
    let graph_pb = model.graph.as_mut().expect("lowered model has a graph");
    // Weights first, then the builder's small constants: a reader meets the big ones in file order.
    let mut initializers: Vec<pb::TensorProto> =
        lowered.weights.into_iter().map(|w| w.tensor).collect();
    initializers.append(&mut graph_pb.initializer);
    graph_pb.initializer = initializers;

    let bytes = model.encode_to_vec();
    if let Some(f) = data_file {
        f.commit()?;
    }
    let mut f = AtomicFile::create(&model_path)?;
    f.write_all(&bytes)
        .with_context(|| format!("writing {}", model_path.display()))?;
    f.commit()?;
    Ok(OnnxFiles {
        model: model_path,
        data: external.then_some(data_path),
    })
}

fn entry(key: &str, value: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: key.into(),
        value: value.into(),
    }
}

/// A weight initializer waiting for its bytes.
pub(crate) struct LoweredWeight {
    pub tensor: pb::TensorProto,
    pub source: crate::graph::ConstId,
    /// Stored transposed (`[in, out]`, MatMul's layout) rather than Hugging Face's `[out, in]`.
    pub transposed: bool,
}

fn lowered_weight_bytes(graph: &Graph, w: &LoweredWeight) -> Result<Vec<u8>> {
    if !w.transposed {
        return graph.const_bytes(w.source);
    }
    let c = graph.constant(w.source);
    let (rows, cols) = (c.shape[0], c.shape[1]);
    let data = graph.const_f32(w.source)?;
    let mut t = vec![0f32; data.len()];
    for r in 0..rows {
        for (k, value) in data[r * cols..(r + 1) * cols].iter().enumerate() {
            t[k * rows + r] = *value;
        }
    }
    Ok(match c.dtype {
        DType::F32 => t.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => t
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::I64 => bail!(
            "constant `{}`: an integer matrix cannot be a linear weight",
            c.name
        ),
    })
}

/// Read an ONNX model back (for checks and tests).
pub fn read_model(path: &Path) -> Result<pb::ModelProto> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    pb::ModelProto::decode(bytes.as_slice())
        .with_context(|| format!("{}: not an ONNX model", path.display()))
}

/// The opset version a model imports for the default domain.
pub(crate) fn model_opset(model: &pb::ModelProto) -> Option<i64> {
    model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty())
        .map(|o| o.version)
}
