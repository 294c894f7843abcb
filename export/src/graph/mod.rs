//! The graph description: the decoder's computation, described once, that every model-file writer
//! lowers (ONNX in [`crate::onnx`], Core ML in its own module). Writers never look at the model
//! config; everything they need is here, so the files cannot drift apart.
//!
//! # Shape of the description
//!
//! A [`Graph`] is a small SSA program:
//! - **values** ([`ValueId`]) are typed tensors ([`ValueType`]: a [`DType`] and a shape of
//!   [`Dim`]s, where `batch`, `seq` and `options` are symbolic and everything else is fixed);
//! - **inputs** are named values with no producer (`input_ids`, `attention_mask`,
//!   `option_token_ids`, contracts section 5);
//! - **nodes** ([`Node`]) each compute exactly one new value from earlier values and constants, in
//!   topological order (a writer walks `graph.nodes` front to back);
//! - **constants** ([`Const`], [`ConstId`]) are weights (named as in the Hugging Face checkpoint,
//!   with LoRA already merged) or small derived tensors (RoPE's inverse frequencies). Their data is
//!   read on demand with [`Graph::const_f32`] / [`Graph::const_bytes`], one tensor at a time;
//! - **outputs** are named values (`option_logits`, `option_probs`).
//!
//! Every node carries its output type, so a writer that must declare types per operation (Core ML's
//! MIL does) reads them from [`Graph::value`] instead of inferring them.
//!
//! # Precision policy (decided here, not by writers)
//!
//! With [`DType::F16`] weights the residual stream, projections, RoPE and attention inputs are f16;
//! every RMSNorm runs in f32 behind explicit [`Op::Cast`] nodes; attention scores are softmaxed in
//! f32 ([`Op::Attention`]); the final hidden state stays f32, and the option logits, temperature and
//! softmax are f32. Norm weights are always f32. A writer lowers each op exactly as documented and
//! adds no casts of its own beyond what an op's definition states.
//!
//! # The ops
//!
//! Shapes use `b` = batch, `s` = sequence, `o` = options, `h` = hidden size. See [`Op`] for each
//! op's exact definition. Tokens are left-padded: the last position (`s - 1`) is the answer slot of
//! every row.

mod qwen3;

use std::fmt;
use std::sync::Arc;

use anyhow::{Context, Result, bail};

pub use qwen3::{GraphOptions, build_qwen3, expected_weights};

use crate::Qwen3Config;
use decision_train::model::weights::WeightSource;

/// The value written into [`Op::AttentionBias`] at masked positions. Finite on purpose: a fully
/// masked row (a padding query) then softmaxes to finite values instead of NaN, so padding can never
/// poison the real rows; `exp(-1e4)` is exactly 0 in f32 and f16, so unmasked rows are unaffected.
pub(crate) const MASKED: f32 = -1.0e4;

/// Element type of a value or constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    I64,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::I64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I64 => "i64",
        }
    }
}

/// One dimension of a value's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Rows in the batch (symbol `batch`).
    Batch,
    /// Tokens per row (symbol `seq`).
    Seq,
    /// Options per decision (symbol `options`; one count per batch).
    Options,
    Fixed(usize),
}

impl Dim {
    /// The symbolic name of a runtime dimension, `None` for a fixed one.
    pub(crate) fn symbol(self) -> Option<&'static str> {
        match self {
            Dim::Batch => Some("batch"),
            Dim::Seq => Some("seq"),
            Dim::Options => Some("options"),
            Dim::Fixed(_) => None,
        }
    }

    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            _ => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            other => f.write_str(other.symbol().expect("symbolic")),
        }
    }
}

/// The type of a value: element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl ValueType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> Self {
        Self { dtype, shape }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The last dimension, which every op here requires to be fixed when it reads it.
    pub(crate) fn last_fixed(&self) -> Option<usize> {
        self.shape.last().and_then(|d| d.fixed())
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(Dim::to_string).collect();
        write!(f, "{}[{}]", self.dtype.name(), dims.join(","))
    }
}

/// A value in the graph (an input or a node's output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub usize);

/// A constant tensor in the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConstId(pub usize);

/// Where a constant's values come from.
#[derive(Debug, Clone)]
pub enum ConstSource {
    /// A tensor of the weight source, by its Hugging Face name (LoRA already merged).
    Weight(String),
    /// Values computed by the builder (small: RoPE inverse frequencies).
    Values(Vec<f32>),
}

/// A constant tensor: its name (the Hugging Face weight name for weights), the element type it is
/// stored in, its shape and its source. Linear weights keep Hugging Face's `[out, in]` layout.
#[derive(Debug, Clone)]
pub struct Const {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub source: ConstSource,
}

impl Const {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for weights of the checkpoint, false for builder-made constants.
    pub fn is_weight(&self) -> bool {
        matches!(self.source, ConstSource::Weight(_))
    }
}

/// The operations. Every op yields one value; its output type is stored with the node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    /// `table[ids]`. `ids`: i64 `[b, s]`; `table`: `[vocab, h]` → `[b, s, h]` in the table's dtype.
    Embedding { table: ConstId, ids: ValueId },
    /// `x · weightᵀ (+ bias)`. `weight` in Hugging Face layout `[out, in]` (ONNX writers transpose
    /// it for MatMul; Core ML's `linear` takes it as is); `x`: `[.., in]` → `[.., out]`, same dtype.
    Linear {
        x: ValueId,
        weight: ConstId,
        bias: Option<ConstId>,
    },
    /// `x / sqrt(mean(x², last axis) + eps) · weight`, entirely in f32 (`x`, `weight` and the
    /// result are f32; the builder casts around it).
    RmsNorm {
        x: ValueId,
        weight: ConstId,
        eps: f32,
    },
    /// Element type conversion.
    Cast { x: ValueId, to: DType },
    /// `[b, s, heads·head_dim]` → reshape `[b, s, heads, head_dim]` → transpose → `[b, heads, s,
    /// head_dim]`.
    SplitHeads {
        x: ValueId,
        heads: usize,
        head_dim: usize,
    },
    /// The inverse of [`Op::SplitHeads`]: `[b, heads, s, head_dim]` → `[b, s, heads·head_dim]`.
    MergeHeads { x: ValueId },
    /// Position ids from the left-padded attention mask: i64 `[b, s]` →
    /// `max(cumsum(mask, axis 1) − 1, 0)`; real tokens count 0, 1, 2, … from their first token.
    PositionIds { mask: ValueId },
    /// RoPE angles: `f32(positions)[.., None] · inv_freq` → f32 `[b, s, head_dim/2]`; `inv_freq`
    /// is the f32 constant `[head_dim/2]`, `1 / theta^(2i/head_dim)`.
    RopeAngles {
        positions: ValueId,
        inv_freq: ConstId,
    },
    /// Element-wise cosine.
    Cos { x: ValueId },
    /// Element-wise sine.
    Sin { x: ValueId },
    /// Rotary embedding, rotate-half (Qwen / Llama / GPT-NeoX) convention, not interleaved.
    /// `x`: `[b, heads, s, d]`; `cos`, `sin`: `[b, s, d/2]`, same dtype as `x`, broadcast over
    /// heads. With `c = concat(cos, cos)`, `n = concat(sin, sin)` on the last axis and
    /// `rotate_half(x) = concat(−x[.., d/2:], x[.., :d/2])`: `x · c + rotate_half(x) · n`.
    Rope {
        x: ValueId,
        cos: ValueId,
        sin: ValueId,
    },
    /// Additive attention bias from the left-padded mask: f32 `[b, 1, s, s]`, 0 where key `j ≤`
    /// query `i` and `mask[b, j] = 1`, else `masked` ([`MASKED`]).
    AttentionBias { mask: ValueId, masked: f32 },
    /// Causal self-attention with grouped-query heads. `q`: `[b, hq, s, d]`; `k`, `v`: `[b, hkv, s,
    /// d]` with `hq` a multiple of `hkv`, query head `i` reading key/value head `i / (hq/hkv)` (each
    /// kv head repeated consecutively, as transformers' `repeat_kv`); `bias`: f32 `[b, 1, s, s]`.
    /// `scores = (q · kᵀ) · scale` in the inputs' dtype, then in f32: `softmax(scores + bias)` over
    /// keys, cast back to the inputs' dtype, `· v` → `[b, hq, s, d]`.
    Attention {
        q: ValueId,
        k: ValueId,
        v: ValueId,
        bias: ValueId,
        scale: f32,
    },
    /// `x · sigmoid(x)`.
    Silu { x: ValueId },
    /// Element-wise product, same shapes.
    Mul { a: ValueId, b: ValueId },
    /// Element-wise sum, same shapes.
    Add { a: ValueId, b: ValueId },
    /// `x[:, s − 1, :]`: `[b, s, h]` → `[b, h]` (the answer slot under left padding).
    LastPosition { x: ValueId },
    /// Label logits: `hidden`: f32 `[b, h]`; `ids`: i64 `[b, o]`; `table`: `[vocab, h]` (the LM
    /// head, or the embedding when tied). Rows `table[ids]` are cast to f32 and dotted with
    /// `hidden`: f32 `[b, o]`. Only the offered labels' rows are touched, never the vocabulary.
    OptionLogits {
        hidden: ValueId,
        table: ConstId,
        ids: ValueId,
    },
    /// `x / divisor` (the temperature; a division, not a multiplication by the reciprocal).
    DivScalar { x: ValueId, divisor: f32 },
    /// Softmax over the last axis.
    Softmax { x: ValueId },
}

impl Op {
    /// The values this op reads, in order.
    pub fn inputs(&self) -> Vec<ValueId> {
        match *self {
            Op::Embedding { ids, .. } => vec![ids],
            Op::Linear { x, .. }
            | Op::RmsNorm { x, .. }
            | Op::Cast { x, .. }
            | Op::SplitHeads { x, .. }
            | Op::MergeHeads { x }
            | Op::Cos { x }
            | Op::Sin { x }
            | Op::Silu { x }
            | Op::LastPosition { x }
            | Op::DivScalar { x, .. }
            | Op::Softmax { x } => vec![x],
            Op::PositionIds { mask } | Op::AttentionBias { mask, .. } => vec![mask],
            Op::RopeAngles { positions, .. } => vec![positions],
            Op::Rope { x, cos, sin } => vec![x, cos, sin],
            Op::Attention { q, k, v, bias, .. } => vec![q, k, v, bias],
            Op::Mul { a, b } | Op::Add { a, b } => vec![a, b],
            Op::OptionLogits { hidden, ids, .. } => vec![hidden, ids],
        }
    }

    /// The constants this op reads.
    pub fn consts(&self) -> Vec<ConstId> {
        match *self {
            Op::Embedding { table, .. } | Op::OptionLogits { table, .. } => vec![table],
            Op::Linear { weight, bias, .. } => std::iter::once(weight).chain(bias).collect(),
            Op::RmsNorm { weight, .. } => vec![weight],
            Op::RopeAngles { inv_freq, .. } => vec![inv_freq],
            _ => vec![],
        }
    }

    /// A short lower-case name for listings.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Embedding { .. } => "embedding",
            Op::Linear { .. } => "linear",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Cast { .. } => "cast",
            Op::SplitHeads { .. } => "split_heads",
            Op::MergeHeads { .. } => "merge_heads",
            Op::PositionIds { .. } => "position_ids",
            Op::RopeAngles { .. } => "rope_angles",
            Op::Cos { .. } => "cos",
            Op::Sin { .. } => "sin",
            Op::Rope { .. } => "rope",
            Op::AttentionBias { .. } => "attention_bias",
            Op::Attention { .. } => "attention",
            Op::Silu { .. } => "silu",
            Op::Mul { .. } => "mul",
            Op::Add { .. } => "add",
            Op::LastPosition { .. } => "last_position",
            Op::OptionLogits { .. } => "option_logits",
            Op::DivScalar { .. } => "div_scalar",
            Op::Softmax { .. } => "softmax",
        }
    }
}

/// One step of the program: `output = op(..)`, with a readable, unique `name`
/// (`layers.3.self_attn.q_proj`) that writers use for their node names.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub name: String,
    pub op: Op,
    pub output: ValueId,
}

/// Facts about the model the graph computes, for manifests and writers' metadata.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub architecture: &'static str,
    pub config: Qwen3Config,
    /// Element type of the (non-norm) weights.
    pub dtype: DType,
    /// The temperature the graph divides the option logits by.
    pub temperature: f32,
}

/// The decoder graph. Build it with [`build_qwen3`]; read it with the accessors.
#[derive(Clone)]
pub struct Graph {
    values: Vec<ValueType>,
    consts: Vec<Const>,
    inputs: Vec<(String, ValueId)>,
    nodes: Vec<Node>,
    outputs: Vec<(String, ValueId)>,
    facts: ModelFacts,
    weights: Arc<dyn WeightSource>,
}

impl Graph {
    /// Named inputs, in interface order.
    pub fn inputs(&self) -> &[(String, ValueId)] {
        &self.inputs
    }

    /// Named outputs, in interface order.
    pub fn outputs(&self) -> &[(String, ValueId)] {
        &self.outputs
    }

    /// The program, in topological order.
    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn consts(&self) -> &[Const] {
        &self.consts
    }

    pub fn constant(&self, id: ConstId) -> &Const {
        &self.consts[id.0]
    }

    /// The type of a value.
    pub fn value(&self, id: ValueId) -> &ValueType {
        &self.values[id.0]
    }

    pub fn facts(&self) -> &ModelFacts {
        &self.facts
    }

    /// A constant's values as f32 (whatever its storage dtype), row-major, shape-checked.
    pub(crate) fn const_f32(&self, id: ConstId) -> Result<Vec<f32>> {
        let c = self.constant(id);
        let data = match &c.source {
            ConstSource::Values(v) => v.clone(),
            ConstSource::Weight(name) => self.weights.read_f32(name)?,
        };
        if data.len() != c.numel() {
            bail!(
                "constant `{}` has {} values, its shape {:?} needs {}",
                c.name,
                data.len(),
                c.shape,
                c.numel()
            );
        }
        Ok(data)
    }

    /// A constant's bytes in its storage dtype, little-endian (f16 by round-to-nearest-even).
    pub(crate) fn const_bytes(&self, id: ConstId) -> Result<Vec<u8>> {
        let c = self.constant(id);
        let data = self.const_f32(id)?;
        Ok(match c.dtype {
            DType::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DType::F16 => data
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
            DType::I64 => data
                .iter()
                .flat_map(|x| (*x as i64).to_le_bytes())
                .collect(),
        })
    }

    /// Total bytes of all constants in their storage dtypes.
    pub(crate) fn const_bytes_total(&self) -> u64 {
        self.consts
            .iter()
            .map(|c| (c.numel() * c.dtype.size()) as u64)
            .sum()
    }

    /// Number of weight parameters (tied tables counted once).
    pub fn parameter_count(&self) -> u64 {
        self.consts
            .iter()
            .filter(|c| c.is_weight())
            .map(|c| c.numel() as u64)
            .sum()
    }

    /// Check the program's invariants: every node reads only values defined before it, produces a
    /// fresh value, and every output is defined. Builders call this; writers may rely on it.
    pub fn validate(&self) -> Result<()> {
        let mut defined = vec![false; self.values.len()];
        for (_, id) in &self.inputs {
            defined[id.0] = true;
        }
        for node in &self.nodes {
            for input in node.op.inputs() {
                if !defined.get(input.0).copied().unwrap_or(false) {
                    bail!(
                        "node `{}` reads %{} before it is defined",
                        node.name,
                        input.0
                    );
                }
            }
            for c in node.op.consts() {
                if c.0 >= self.consts.len() {
                    bail!("node `{}` reads a missing constant", node.name);
                }
            }
            let slot = defined
                .get_mut(node.output.0)
                .context("output out of range")?;
            if *slot {
                bail!("node `{}` redefines %{}", node.name, node.output.0);
            }
            *slot = true;
        }
        for (name, id) in &self.outputs {
            if !defined[id.0] {
                bail!("output `{name}` is never computed");
            }
        }
        Ok(())
    }
}

impl fmt::Display for Graph {
    /// A readable listing, one line per input, node and output:
    /// `%7 = linear(%6, @model.layers.0.self_attn.q_proj.weight) : f32[batch,seq,64]  # layers.0...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, id) in &self.inputs {
            writeln!(f, "input {name} = %{} : {}", id.0, self.value(*id))?;
        }
        for node in &self.nodes {
            let mut args: Vec<String> = node
                .op
                .inputs()
                .iter()
                .map(|v| format!("%{}", v.0))
                .collect();
            args.extend(
                node.op
                    .consts()
                    .iter()
                    .map(|c| format!("@{}", self.constant(*c).name)),
            );
            writeln!(
                f,
                "%{} = {}({}) : {}  # {}",
                node.output.0,
                node.op.kind(),
                args.join(", "),
                self.value(node.output),
                node.name
            )?;
        }
        for (name, id) in &self.outputs {
            writeln!(f, "output {name} = %{}", id.0)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
