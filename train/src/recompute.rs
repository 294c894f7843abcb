//! Layer recomputation (`[train] recompute = true`): a training step whose activation memory is
//! one decoder layer's worth plus each layer's input, instead of every intermediate of every
//! layer.
//!
//! Burn's autodiff keeps every matmul output of a forward pass until the backward pass, and has
//! no block-level checkpoint API. So the step is built by hand:
//!
//! 1. a forward pass without autodiff that keeps only each layer's input `x_i` (in f16, scaled
//!    per token, on an f16 base: [`Keep`]; and, for the replay by hand, its attention core's
//!    output and row sums);
//! 2. the head (final norm, option logits, loss) on the last output, as an autodiff leaf: its
//!    backward gives the loss gradient `g` of that output;
//! 3. from the top layer down: re-run the layer on `x_i` as a fresh leaf and back-propagate `g`
//!    into it (the backward of `Σ out ⊙ g` is the vector–Jacobian product), which gives the
//!    layer's parameter gradients and the next `g`.
//!
//! A LoRA run on the CPU does step 3 without a tape: [`replay`] writes the layer's backward out by
//! hand. Elsewhere the layer is replayed through Burn's tape, as follows.
//!
//! Within a layer the attention core is not taped at all. On the CPU, [`flash`] computes it and
//! its gradient in tiles of queries and keys, with no score tensor. On other backends
//! [`BlockedCore`] does, block by block of queries, of Burn operations (in f16 on an f16 base),
//! so at most one `[b, heads, chunk, s]` block of scores (and its two gradient-sized siblings)
//! is alive at a time. The layer is taped in two halves around the core, `x → (q, k, v)` and
//! `(x, heads) → out`; the second, token by token as it is, in pieces of tokens
//! ([`finish_pieces`]): a LoRA layer's intermediate-sized tensors are most of its tape. Where
//! only adapters train, that second half replays by hand instead ([`finish_by_hand`]), in the
//! same pieces.
//!
//! The gradients equal those of the ordinary pass up to float rounding (tests in
//! `trainer_tests.rs`). LoRA dropout is refused with recompute: the recomputed pass would draw
//! other masks than the forward pass that produced the stored inputs.

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{DType, Device, FloatDType, Tensor};

use crate::model::blocked_attention::{BlockedCore, Products, RowMax, RowStats};
use crate::model::f16_safety::ProductChecks;
use crate::model::flash;
use crate::model::qwen3::{
    Batch, DecoderLayer, GPU_LENGTH_MULTIPLE, LayerInputs, Qwen3, whole_multiple_rows,
};
use crate::{finish_by_hand, replay};

/// At most this many attention scores in one block (`b · heads · chunk · s`): 64 Mi f32 values,
/// 256 MiB per block.
pub(crate) const SCORE_BLOCK: usize = 1 << 26;

/// A long sequence's attention goes in about this many blocks of queries: block `i` reads only
/// the keys up to its last row (the mask is causal), so `n` blocks cost `(n + 1) / 2n` of the
/// whole `s × s`. Measured at the 0.6B shape on the CPU (2 × 1030 tokens, 16 heads): one block's
/// forward and backward 1.67 s per layer, 3 to 6 blocks 0.81–0.87 s (docs/results.md). A GPU,
/// which runs these blocks, pays its host about 23 launches a block a layer in a training step
/// (the first pass, the replay, the backward; llvmpipe at hidden 512): 4 blocks compute 62.5 %
/// of the square where 6 computed 58 %, for a third fewer of the blocks' launches; at the 4B a
/// quarter of 2048 rows is also the most [`SCORE_BLOCK`] allows (docs/results.md, "Four
/// attention blocks on a GPU").
const CAUSAL_BLOCKS: usize = 4;
/// Fewer query rows than this per block cost more in per-block work than the skip saves.
const MIN_ROWS: usize = 128;

/// Query rows per attention block for a batch of `b` rows of `s` tokens and `heads` heads: about
/// `s / CAUSAL_BLOCKS` rows (at least `MIN_ROWS`), and never a block over `max_scores` scores
/// ([`SCORE_BLOCK`], or what the device's largest buffer holds: `qwen3::score_budget`). A
/// multiple of [`GPU_LENGTH_MULTIPLE`] where the budget allows: a GPU's batch length is one, so
/// every block's rows and the keys it reads (`e`, a multiple of the rows) are too, and each
/// product's rows and inner length divide into f16's widest vectors and a tensor core's tiles.
/// At the 4B's 2 x 2048 tokens, 512 rows.
pub(crate) fn query_chunk(b: usize, heads: usize, s: usize, max_scores: usize) -> usize {
    let budget = whole_multiple_rows(max_scores / (b * heads * s).max(1));
    let causal = s
        .div_ceil(CAUSAL_BLOCKS)
        .max(MIN_ROWS)
        .next_multiple_of(GPU_LENGTH_MULTIPLE);
    budget.min(causal).clamp(1, s.max(1))
}

/// The loss (as `head` computes it from the last decoder layer's output `[b, s, hidden]`) and the
/// gradients of every trainable parameter, by layer recomputation. `model` is on an autodiff
/// device. A non-finite loss returns no gradients. The forward pass flags its f16 products in
/// `checks` (the replays compute the same products again, and are not flagged twice). Where the
/// replay runs by hand, `keep_attention` keeps each layer's attention output and row sums from
/// the forward pass for it (memory for a sixth of the step's work); else the replay computes
/// them again. The gradients are the same bits either way. Through the tape, at most about
/// `finish_bytes` of a layer's second half's tape is alive at a time ([`finish_pieces`];
/// [`FINISH_BUDGET`] by default).
pub(crate) fn loss_and_grads(
    model: &Qwen3,
    batch: &Batch,
    head: impl FnOnce(Tensor<3>) -> Tensor<1>,
    checks: Option<&ProductChecks>,
    keep_attention: bool,
    finish_bytes: usize,
) -> (f32, GradientsParams) {
    let heads = model
        .model
        .layers
        .first()
        .map_or(1, |l| l.self_attn.num_heads);
    // DECISION_ATTENTION=blocks runs the blocked path on the CPU too: the comparison
    // docs/results.md measures.
    let blocks = std::env::var("DECISION_ATTENTION").is_ok_and(|v| v == "blocks");
    let core = if model.device().inner() == Device::flex() && !blocks {
        CoreKind::Tiles
    } else {
        CoreKind::Blocks(query_chunk(
            batch.len(),
            heads,
            batch.seq_len(),
            crate::model::qwen3::score_budget(&model.device()),
        ))
    };
    // DECISION_REPLAY=taped keeps the tape where the replay could run by hand, for comparison.
    let taped = std::env::var("DECISION_REPLAY").is_ok_and(|v| v == "taped");
    let replay = if matches!(core, CoreKind::Tiles) && !taped && replay::applies(model) {
        Replay::ByHand { keep_attention }
    } else {
        Replay::Taped {
            finish_bytes,
            finish_by_hand: !taped && model.model.layers.iter().all(finish_by_hand::applies),
        }
    };
    loss_and_grads_with(model, batch, head, core, replay, Keep::of(model), checks)
}

/// How the first pass keeps each layer's input for the replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Keep {
    /// As computed, in f32.
    Exact,
    /// In f16, scaled per token ([`Kept::scaled`]): an f16 base's (a Vulkan GPU's) runs, where
    /// the layer inputs are a third of the step's activations at the 4B (1.41 of 4.13 GiB in
    /// f32) and PyTorch's checkpointing keeps them in 16 bits.
    Scaled,
}

impl Keep {
    /// Scaled f16 on an f16 base, else exact. `DECISION_SAVED_INPUTS=f32` keeps an f16 base's
    /// inputs exact, for comparison (docs/results.md).
    fn of(model: &Qwen3) -> Self {
        let exact = std::env::var("DECISION_SAVED_INPUTS").is_ok_and(|v| v == "f32");
        if model.dtype() == DType::F16 && !exact {
            Keep::Scaled
        } else {
            Keep::Exact
        }
    }
}

/// A layer's input as the first pass keeps it for the replay: `values` as computed (f32), or,
/// with `peak`, `values · peak / SCALED_PEAK`, `values` in f16 and `peak` each token's largest
/// magnitude (`[b, s, 1]`, f32).
struct Kept {
    values: Tensor<3>,
    peak: Option<Tensor<3>>,
}

/// The largest magnitude of a token's values as kept in f16: 2^14, a factor of two below f16's
/// largest finite value (65 504), so the scale's rounding can never push one over it.
const SCALED_PEAK: f32 = 16384.0;

impl Kept {
    fn new(x: &Tensor<3>, keep: Keep) -> Self {
        match keep {
            Keep::Exact => Kept {
                values: x.clone(),
                peak: None,
            },
            Keep::Scaled => Self::scaled(x),
        }
    }

    /// `x` in half the bytes, for any magnitude: each token (a row of `[b, s, hidden]`) is
    /// divided by its largest magnitude and multiplied by [`SCALED_PEAK`] before the cast, so
    /// nothing overflows f16 however loud the residual stream (Qwen-family models carry channels
    /// in the thousands, and f16 ends at 65 504). Read back, each element is within f16's
    /// rounding of itself (2^-11 relative), or, below 2^-28 of its token's largest (f16's
    /// subnormals), within 2^-39 of that largest. A token of zeros stays zeros.
    fn scaled(x: &Tensor<3>) -> Self {
        let peak = x.clone().abs().max_dim(2).clamp_min(1e-30);
        let values =
            (x.clone() * peak.clone().recip().mul_scalar(SCALED_PEAK)).cast(FloatDType::F16);
        Kept {
            values,
            peak: Some(peak),
        }
    }

    /// The input in f32, as the replay reads it.
    fn restore(self) -> Tensor<3> {
        match self.peak {
            None => self.values,
            Some(peak) => self.values.cast(FloatDType::F32) * peak.div_scalar(SCALED_PEAK),
        }
    }
}

/// How each layer's backward runs in step 3: through Burn's tape, or written out by hand
/// ([`replay`]: LoRA on the CPU, with the attention core in tiles).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Replay {
    /// Through the tape, with at most `finish_bytes` of the second half's tape (or of what its
    /// replay by hand holds, the same tensors) alive at a time ([`finish_pieces`]); the second
    /// half by hand where `finish_by_hand` ([`finish_by_hand`]: the base frozen).
    Taped {
        finish_bytes: usize,
        finish_by_hand: bool,
    },
    /// By hand, reusing the first pass's attention where `keep_attention`.
    ByHand { keep_attention: bool },
}

/// How the attention core runs outside the tape: in tiles on the CPU ([`flash`]), or in blocks
/// of this many query rows built of Burn operations (any backend).
#[derive(Clone, Copy, Debug)]
pub(crate) enum CoreKind {
    Tiles,
    Blocks(usize),
}

/// The attention core of one step, with what it needs of the mask.
enum Core<'a> {
    Tiles(&'a flash::Mask),
    Blocks(Box<BlockedCore>),
}

impl<'a> Core<'a> {
    fn new(kind: CoreKind, inputs: &'a LayerInputs, products: Products) -> Self {
        match kind {
            CoreKind::Tiles => Core::Tiles(
                inputs
                    .tiles
                    .as_ref()
                    .expect("the tiles' mask is built on the plain CPU device"),
            ),
            CoreKind::Blocks(chunk) => {
                Core::Blocks(Box::new(BlockedCore::new(&inputs.mask, chunk, products)))
            }
        }
    }

    /// The first pass: the output, and what the layer's replay reads of it.
    fn forward(
        &self,
        qkv: (&Tensor<4>, &Tensor<4>, &Tensor<4>),
        scale: f64,
    ) -> (Tensor<4>, FirstPass) {
        match self {
            Core::Tiles(mask) => {
                let (q, k, v) = qkv;
                let (out, saved) = flash::forward(q, k, v, mask, scale as f32);
                (out, FirstPass::Tiles(saved))
            }
            Core::Blocks(core) => {
                let (out, max) = core.forward(qkv, scale);
                (out, FirstPass::Blocks(max))
            }
        }
    }

    /// [`Self::forward`] for the replay, with what [`Self::backward`] reads of it: the tiles'
    /// row sums, or the blocks' rows' log-sum-exp, these from the first pass's rows' maxima.
    fn forward_saving(
        &self,
        qkv: (&Tensor<4>, &Tensor<4>, &Tensor<4>),
        scale: f64,
        first: Option<&RowMax>,
    ) -> (Tensor<4>, Saved) {
        match self {
            Core::Tiles(mask) => {
                let (q, k, v) = qkv;
                let (out, saved) = flash::forward(q, k, v, mask, scale as f32);
                (out, Saved::Tiles(saved))
            }
            Core::Blocks(core) => {
                let (out, stats) = core.forward_saving(qkv, scale, first);
                (out, Saved::Blocks(Box::new(stats)))
            }
        }
    }

    fn backward(
        &self,
        qkv: (&Tensor<4>, &Tensor<4>, &Tensor<4>),
        (out, saved): (&Tensor<4>, &Saved),
        d_out: &Tensor<4>,
        scale: f64,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        match (self, saved) {
            (Core::Tiles(mask), Saved::Tiles(saved)) => {
                let (q, k, v) = qkv;
                flash::backward(q, k, v, out, saved, d_out, mask, scale as f32)
            }
            (Core::Blocks(core), Saved::Blocks(stats)) => core.backward(out, stats, d_out),
            _ => unreachable!("the core's backward reads what its own forward pass saved"),
        }
    }
}

/// What the attention core's first pass leaves for the layer's replay: the tiles' row sums (the
/// replay by hand reads them), or the blocks' rows' maxima.
enum FirstPass {
    Tiles(flash::Saved),
    Blocks(RowMax),
}

/// What the attention core's forward pass in the replay leaves for its backward.
enum Saved {
    Tiles(flash::Saved),
    Blocks(Box<RowStats>),
}

/// By default (`[train] replay_piece_mib`), at most about this many bytes of tape for the
/// second half of a layer's replay (`finish`, everything after the attention core) at a time:
/// four blocks of scores' worth ([`SCORE_BLOCK`] f32 values each), 1 GiB. The tape is never
/// alive beside the core's three blocks of scores (their forward frees them before the half
/// replays, the backward computes them after it), so a piece up to their size costs no memory
/// at the step's peak, and one past it only its excess. At the 4B (2 x 2048 tokens) the whole is
/// 0.88 GiB, 0.74 of it intermediate-sized, so it replays in one piece, 0.13 GiB past the
/// scores' 0.75. Each piece more replays the half's kernels again: on llvmpipe about 94
/// launches a piece a layer, 31 of them products, most of those the adapters' small ones
/// (docs/results.md). So the budget trades memory for launches: 512 MiB would take 2 pieces at
/// the 4B, 0.13 GiB less for about 63 launches a layer more.
pub(crate) const FINISH_BUDGET: usize = 4 * SCORE_BLOCK * 4;

/// Bytes of tape per token of a LoRA layer's second half replayed through the tape (hidden
/// `h`, `qd` query heads' width, intermediate `i`; f32 activations): the adapters' inputs (the
/// heads' outputs, the post-attention norm's output, the SwiGLU product), the residual, SwiGLU's
/// two partial derivatives (`crate::model::qwen3::silu_mul_taped`), and the two
/// intermediate-sized gradients its backward holds beside them. `crate::plan` counts the same.
pub(crate) fn finish_bytes_per_token([h, qd, i]: [usize; 3]) -> usize {
    (qd + 2 * h + 5 * i) * 4
}

/// Tokens of each row per piece of `finish` in the replay of a batch of `b` rows of `s` tokens:
/// as few pieces as keep each one's tape within about `budget` ([`FINISH_BUDGET`]), all as long
/// but the last, which may be shorter. Where `s` is a multiple of [`GPU_LENGTH_MULTIPLE`] (a
/// GPU's batches), so is every piece, the last too, and they run the kernels of one shape class.
/// `s` (one piece) where the whole fits, and where the base trains too (full fine-tuning: each
/// piece would add a copy of the layer's weight gradients).
pub(crate) fn finish_pieces(
    b: usize,
    s: usize,
    dims: [usize; 3],
    lora: bool,
    budget: usize,
) -> usize {
    let tape = b * s * finish_bytes_per_token(dims);
    let pieces = tape.div_ceil(budget.max(1)).max(1);
    if !lora || pieces == 1 {
        return s.max(1);
    }
    let rows = s.div_ceil(pieces);
    let whole = rows.next_multiple_of(GPU_LENGTH_MULTIPLE);
    if s.is_multiple_of(GPU_LENGTH_MULTIPLE) {
        whole.min(s)
    } else {
        rows
    }
}

/// [`finish_pieces`] for `layer`.
fn finish_rows(layer: &DecoderLayer, b: usize, s: usize, budget: usize) -> usize {
    let [qd, h] = layer.self_attn.o_proj.dims();
    let [_, i] = layer.mlp.gate_proj.dims();
    let lora = layer
        .projections()
        .iter()
        .all(|(_, p)| !p.weight.val().is_require_grad());
    finish_pieces(b, s, [h, qd, i], lora, budget)
}

/// The replay of `finish` ((x, heads) → the layer's output; each token's on its own) and `g`
/// pushed back through it, `rows` tokens of each row at a time, so that one piece's tape (or,
/// `by_hand`, what [`finish_by_hand`] holds, the same tensors) is alive at once. Accumulates the
/// layer's parameter gradients in `acc`; returns the gradients of the heads `[b, heads, s, d]`
/// and of `x` `[b, s, hidden]`.
fn finish_backward(
    model: &Qwen3,
    layer: &DecoderLayer,
    (x, heads): (Tensor<3>, &Tensor<4>),
    g: Tensor<3>,
    (rows, by_hand): (usize, bool),
    acc: &mut GradientsAccumulator<Qwen3>,
) -> (Tensor<4>, Tensor<3>) {
    let s = x.dims()[1];
    let (mut g_heads, mut g_x) = (Vec::new(), Vec::new());
    for r0 in (0..s).step_by(rows.max(1)) {
        let r = rows.min(s - r0);
        let piece = (
            x.clone().narrow(1, r0, r),
            heads.clone().narrow(2, r0, r),
            g.clone().narrow(1, r0, r),
        );
        let (gh, gx, grads) = if by_hand {
            let mut grads = GradientsParams::new();
            let (x, heads, g) = piece;
            let (gh, gx) = finish_by_hand::finish_backward(layer, x, heads, g, &mut grads);
            (gh, gx, grads)
        } else {
            finish_taped(layer, piece)
        };
        g_heads.push(gh);
        g_x.push(gx);
        acc.accumulate(model, grads);
    }
    if g_x.len() == 1 {
        return (g_heads.remove(0), g_x.remove(0));
    }
    (Tensor::cat(g_heads, 2), Tensor::cat(g_x, 1))
}

/// One piece of [`finish_backward`] through the tape: the gradients of the heads and of `x`,
/// and the layer's parameter gradients.
fn finish_taped(
    layer: &DecoderLayer,
    (x, heads, g): (Tensor<3>, Tensor<4>, Tensor<3>),
) -> (Tensor<4>, Tensor<3>, GradientsParams) {
    let x = x.autodiff().require_grad();
    let heads = heads.autodiff().require_grad();
    let y = layer.finish(x.clone(), heads.clone(), None);
    // Burn seeds a backward pass with ones of its root's shape, so `y ⊙ g` as the root pushes
    // `g` into `y` as its sum would, without the sum's reduction of the whole piece.
    let mut grads = (y * g).backward();
    let g_heads = heads
        .grad_remove(&mut grads)
        .expect("heads feed the output");
    let g_x = x
        .grad_remove(&mut grads)
        .expect("the residual feeds the output");
    (g_heads, g_x, GradientsParams::from_grads(grads, layer))
}

/// A root whose backward pass pushes the cotangents `dq`, `dk` and `dv` into the tensors `q`
/// (`[b, heads, s, d]`), `k` and `v` (`[b, kv_heads, s, d]`) they belong to, as
/// `Σ q ⊙ dq + Σ k ⊙ dk + Σ v ⊙ dv` would, without its three reductions of whole tensors: Burn
/// seeds a backward pass with ones of the root's shape, so the root is `q ⊙ dq` plus
/// `(k ⊙ dk + v ⊙ dv) / groups` broadcast over the `groups` query heads of each key/value head,
/// whose backward adds the `groups` copies of `1 / groups` back up (exactly 1 where `groups` is
/// a power of two, as in Qwen3-0.6B, -4B and -8B; within an f32 rounding elsewhere). Both terms
/// are laid out `[b, kv_heads, groups, s, d]` for the sum, a broadcast Burn's fusion plans with
/// the products: repeated to `[b, heads, s, d]` first (`repeat_kv`), the key/value term was a
/// copy and the sum a launch of its own (llvmpipe: two launches a layer more in each step).
fn seeding_root(
    (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
    (dq, dk, dv): (Tensor<4>, Tensor<4>, Tensor<4>),
) -> Tensor<4> {
    let [b, h, s, d] = q.dims();
    let kvh = k.dims()[1];
    let groups = h / kvh;
    let kv = (k * dk + v * dv).div_scalar(groups as f64);
    let by_kv = |t: Tensor<4>| t.reshape([b, kvh, groups, s, d]);
    let root = by_kv(q) * by_kv(dq) + kv.reshape([b, kvh, 1, s, d]);
    root.reshape([b, h, s, d])
}

/// [`loss_and_grads`] with the attention core run as `kind` says.
fn loss_and_grads_with(
    model: &Qwen3,
    batch: &Batch,
    head: impl FnOnce(Tensor<3>) -> Tensor<1>,
    kind: CoreKind,
    replay: Replay,
    keep: Keep,
    checks: Option<&ProductChecks>,
) -> (f32, GradientsParams) {
    let plain = model.device().inner();
    let inputs = LayerInputs::new(batch, model.head_dim(), model.rope_theta, &plain);
    let embed = &model.model.embed_tokens.weight;
    let core = Core::new(kind, &inputs, Products::of(model));

    // 1. Forward without a tape, keeping each layer's input; the attention core as `core` runs it.
    let tokens = model.token_values();
    let mut x = model.embed(
        embed.val().inner(),
        tokens.clone().map(|t| t.inner()),
        batch,
    );
    // The replay by hand also keeps each layer's attention output and row sums, so its forward
    // skips the attention core (a sixth of a step's work at 2048 tokens).
    let mut saved = Vec::with_capacity(model.model.layers.len());
    let mut attention = Vec::new();
    let mut maxima = Vec::with_capacity(model.model.layers.len());
    for (i, layer) in model.model.layers.iter().enumerate() {
        saved.push(Kept::new(&x, keep));
        if let Some(c) = checks {
            c.at_layer(i);
        }
        let layer = layer.valid();
        let (q, k, v) = layer.attention_inputs(x.clone(), &inputs, checks);
        let (heads, first) = core.forward((&q, &k, &v), layer.self_attn.scale());
        match (replay, first) {
            (Replay::ByHand { keep_attention }, FirstPass::Tiles(sums)) => {
                attention.push(keep_attention.then(|| (heads.clone(), sums)));
            }
            (Replay::ByHand { .. }, FirstPass::Blocks(_)) => {
                unreachable!("the replay by hand runs the attention core in tiles")
            }
            // 4 bytes a query head a token, kept for the layer's replay
            (Replay::Taped { .. }, FirstPass::Blocks(max)) => maxima.push(Some(max)),
            (Replay::Taped { .. }, FirstPass::Tiles(_)) => maxima.push(None),
        }
        x = layer.finish(x, heads, checks);
    }

    // 2. The head, from the last output as a leaf.
    let mut acc = GradientsAccumulator::<Qwen3>::new();
    let top = x.autodiff().require_grad();
    let loss = head(top.clone());
    let value: f32 = loss.clone().into_scalar();
    if !value.is_finite() {
        return (value, GradientsParams::new());
    }
    let mut grads = loss.backward();
    let mut g = top
        .grad_remove(&mut grads)
        .expect("the loss depends on the last layer");
    acc.accumulate(model, GradientsParams::from_grads(grads, model));

    // 3. Layers from the top down: by hand where only adapters train on the CPU (`replay`),
    // else through Burn's tape.
    if let Replay::ByHand { .. } = replay {
        let Core::Tiles(mask) = &core else {
            unreachable!("the replay by hand runs the attention core in tiles")
        };
        let mut by_hand = GradientsParams::new();
        let layers = model.model.layers.iter().zip(saved).zip(attention);
        for ((layer, x_in), attention) in layers.rev() {
            let x_in = x_in.restore();
            g = replay::layer_backward(layer, x_in, attention, &inputs, mask, g, &mut by_hand);
        }
        acc.accumulate(model, by_hand);
        saved = Vec::new();
    }
    for ((layer, x_in), max) in model.model.layers.iter().zip(saved).zip(maxima).rev() {
        let x_in = x_in.restore();
        let scale = layer.self_attn.scale();
        // (q, k, v) from x, taped.
        let xa = x_in.clone().autodiff().require_grad();
        let (q, k, v) = layer.attention_inputs(xa.clone(), &inputs, None);
        let [qp, kp, vp] = [&q, &k, &v].map(|t| t.clone().inner());
        let (out, saved) = core.forward_saving((&qp, &kp, &vp), scale, max.as_ref());
        // (x, heads) → layer output, taped or by hand, and g pushed through it, in pieces of
        // tokens.
        let Replay::Taped {
            finish_bytes,
            finish_by_hand,
        } = replay
        else {
            unreachable!("the replay by hand took every layer")
        };
        let rows = finish_rows(layer, batch.len(), batch.seq_len(), finish_bytes);
        let pieces = (rows, finish_by_hand);
        let (g_heads, g_xc) = finish_backward(model, layer, (x_in, &out), g, pieces, &mut acc);
        // The attention core by hand, then (q, k, v)'s gradients through their tape.
        let (dq, dk, dv) = core.backward((&qp, &kp, &vp), (&out, &saved), &g_heads, scale);
        let mut grads = seeding_root((q, k, v), (dq, dk, dv)).backward();
        let g_xa = xa.grad_remove(&mut grads).expect("q, k, v depend on x");
        acc.accumulate(model, GradientsParams::from_grads(grads, layer));
        g = g_xa + g_xc;
    }

    // The embedding, when it trains (full fine-tuning), or its trainable tokens (LoRA).
    // A batch without any trainable token leaves the embedding's output frozen.
    if embed.is_require_grad() || model.trainable_tokens_in(batch) {
        let e = model.embed(embed.val(), tokens, batch);
        let grads = (e * g).backward();
        acc.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    (value, acc.grads())
}

#[cfg(test)]
mod tests {
    use burn::module::{Module, Param};
    use burn::optim::GradientsParams;
    use burn::tensor::{Distribution, Tensor};

    use super::*;
    use crate::loss::{LossTargets, batch_loss};
    use crate::model::config::Qwen3Config;
    use crate::model::qwen3::{Batch, Qwen3, init_random};
    use crate::trainer_tests::{gradients, values};

    fn config(tied: bool) -> Qwen3Config {
        Qwen3Config::from_json(&serde_json::json!({
            "model_type": "qwen3", "vocab_size": 16, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": tied, "max_position_embeddings": 64
        }))
        .unwrap()
    }

    /// Two rows, the second left-padded: the mask and position ids matter.
    fn batch() -> Batch {
        let a: &[u32] = &[3, 7, 1, 9, 4, 2, 8];
        let b: &[u32] = &[5, 8, 6];
        Batch::left_padded(&[a, b], 0)
    }

    /// The decision loss plus a next-token term, so every position's hidden state matters.
    fn head(model: &Qwen3) -> impl FnOnce(Tensor<3>) -> Tensor<1> + '_ {
        move |decoded: Tensor<3>| {
            let [b, s, h] = decoded.dims();
            let hidden = model.model.norm.forward(decoded);
            let last = hidden.clone().narrow(1, s - 1, 1).reshape([b, h]);
            let logits = model.token_logits(last, &[10, 11, 12]);
            let t = LossTargets::build(&[(3, 1, Some(vec![0.2, 0.7, 0.1])), (2, 0, None)], 0.3);
            let (absent, q, onehot) = t.tensors(&logits.device());
            let all = model.logits(hidden).sum().mul_scalar(0.01);
            batch_loss(logits, absent, q, onehot, 0.5) + all
        }
    }

    /// The taped replay as full fine-tuning's run makes it (or `DECISION_REPLAY=taped`).
    const TAPED: Replay = Replay::Taped {
        finish_bytes: FINISH_BUDGET,
        finish_by_hand: false,
    };
    /// The taped replay with its second half by hand, as a GPU's LoRA run makes it.
    const HAND_FINISH: Replay = Replay::Taped {
        finish_bytes: FINISH_BUDGET,
        finish_by_hand: true,
    };
    /// [`HAND_FINISH`] in [`IN_PIECES`]' pieces.
    const HAND_FINISH_IN_PIECES: Replay = Replay::Taped {
        finish_bytes: 3000,
        finish_by_hand: true,
    };
    /// The taped replay with the second half in pieces of 2 tokens (and a last of 1) of the
    /// 7-token batch: 736 bytes of tape a token at [`config`]'s widths, 10 304 in all.
    const IN_PIECES: Replay = Replay::Taped {
        finish_bytes: 3000,
        finish_by_hand: false,
    };

    #[test]
    fn the_second_half_replays_in_pieces_within_budget() {
        assert_eq!(finish_bytes_per_token([16, 32, 24]), 736);
        assert_eq!(finish_pieces(2, 7, [16, 32, 24], true, 3000), 2);
        // within budget, or where the base trains: one piece
        assert_eq!(finish_pieces(2, 7, [16, 32, 24], true, FINISH_BUDGET), 7);
        assert_eq!(finish_pieces(2, 7, [16, 32, 24], false, 3000), 7);
        // the 4B (hidden 2560, 32 heads of 128, intermediate 9728), 2 x 2048 tokens: 0.88 GiB of
        // tape, within 512 MiB in 2 pieces of 1024 tokens; at batch 1, one piece
        let four_b = [2560, 4096, 9728];
        let half = 512 << 20;
        assert_eq!(finish_pieces(2, 2048, four_b, true, half), 1024);
        assert!(2 * 1024 * finish_bytes_per_token(four_b) <= half);
        assert_eq!(finish_pieces(1, 2048, four_b, true, half), 2048);
        assert_eq!(finish_pieces(2, 3072, four_b, true, half), 1024);
        // a GPU's lengths are multiples of 16, and so are its pieces; a CPU's need not be
        assert_eq!(finish_pieces(2, 2064, four_b, true, half), 1040);
        assert_eq!(finish_pieces(2, 2050, four_b, true, half), 1025);
        // by default the 4B's 2 x 2048 tokens replay whole, 2 x 4096 in 2 pieces
        assert_eq!(finish_pieces(2, 2048, four_b, true, FINISH_BUDGET), 2048);
        assert_eq!(finish_pieces(2, 4096, four_b, true, FINISH_BUDGET), 2048);
    }

    /// How far a recomputed step may be from the taped pass: the loss (relative), each gradient
    /// tensor (relative in L2 norm), and each element (against the tensor's largest).
    #[derive(Clone, Copy)]
    struct Tol {
        loss: f32,
        rel: f64,
        element: f32,
    }

    /// In f32: each tensor within 3e-5 relative in L2 norm, every element within 1e-4 of the
    /// tensor's largest. (An untaped pass adds each adapter's term inside its product, a fused
    /// multiply-add that the taped pass rounds in two steps: 1.02e-5 on one small gradient.)
    const F32_TOL: Tol = Tol {
        loss: 1e-5,
        rel: 3e-5,
        element: 1e-4,
    };

    /// Recomputed gradients against the ordinary taped pass: the same parameters and the same
    /// loss, within `tol`.
    fn assert_same_gradients(
        model: &Qwen3,
        core: CoreKind,
        replay: Replay,
        keep: Keep,
        tol: Tol,
    ) -> usize {
        let b = batch();
        let loss = head(model)(model.decode(&b));
        let want_loss: f32 = loss.clone().into_scalar();
        let want = gradients(model, &GradientsParams::from_grads(loss.backward(), model));
        let (got_loss, grads) =
            loss_and_grads_with(model, &b, head(model), core, replay, keep, None);
        let got = gradients(model, &grads);
        let loss_off = (want_loss - got_loss).abs() / want_loss.abs().max(1.0);
        assert!(loss_off <= tol.loss, "loss off by {loss_off:e} relative");
        let names = |g: &[(String, Vec<f32>)]| g.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&want),
            names(&got),
            "the same parameters get gradients"
        );
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(scale > 0.0, "{name}: a zero gradient proves nothing");
            // `tol.rel` relative in L2 norm over the tensor, and no element off by more than
            // `tol.element` of the tensor's largest: summation order differs (blocks, grouped
            // heads), so single small elements can differ by a few ulps of the large ones.
            let rel = crate::trainer_tests::relative_l2(g, w);
            let diff = w
                .iter()
                .zip(g)
                .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(rel <= tol.rel, "{name}: relative L2 difference {rel:e}");
            assert!(
                diff <= tol.element * scale,
                "{name}: |Δ| {diff} against max |g| {scale}"
            );
        }
        want.len()
    }

    #[test]
    fn full_fine_tuning_gradients_match_the_taped_pass() {
        // Seeded under the trainer tests' lock on Burn's process-wide generator, so the weights
        // (and so the float rounding compared) are the same on every run.
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(11);
        for tied in [false, true] {
            let model = init_random(&config(tied), 0.3, &device)
                .train()
                .set_require_grad(true);
            // every weight of 3 layers (11 each), embedding, final norm, and the untied head
            assert!(!crate::replay::applies(&model), "the norms and bases train");
            assert!(!model.model.layers.iter().any(finish_by_hand::applies));
            let n = assert_same_gradients(&model, CoreKind::Blocks(2), TAPED, Keep::Exact, F32_TOL);
            assert_eq!(n, 3 * 11 + 2 + usize::from(!tied));
            assert_same_gradients(&model, CoreKind::Blocks(64), TAPED, Keep::Exact, F32_TOL);
            assert_same_gradients(&model, CoreKind::Tiles, TAPED, Keep::Exact, F32_TOL);
        }
    }

    /// LoRA with trainable tokens: row 3 is in the batch (the embedding), row 11 is a label the
    /// head reads (through the tied head only); row 13 alone is in no batch (a token of the
    /// vocabulary that the states do not use: found with Qwen3's real tokenizer), where the
    /// embedding's output does not train and only a tied head gives the row a gradient.
    #[test]
    fn lora_gradients_match_the_taped_pass() {
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(12);
        for (tied, tokens) in [
            (false, vec![3, 11]),
            (true, vec![3, 11]),
            (false, vec![13]),
            (true, vec![13]),
        ] {
            let rows_read = usize::from(tied || tokens.contains(&3));
            let model = lora_model(init_random(&config(tied), 0.3, &device), tokens);
            assert!(crate::replay::applies(&model));
            // the adapters, 2 matrices on each of 7 projections of 3 layers, and the token rows
            // where anything reads them
            for (core, replay) in [
                (CoreKind::Blocks(3), TAPED),
                (CoreKind::Blocks(3), IN_PIECES),
                (CoreKind::Blocks(3), HAND_FINISH),
                (CoreKind::Blocks(3), HAND_FINISH_IN_PIECES),
                (CoreKind::Tiles, TAPED),
                (CoreKind::Tiles, KEPT),
                (CoreKind::Tiles, RECOMPUTED),
            ] {
                let n = assert_same_gradients(&model, core, replay, Keep::Exact, F32_TOL);
                assert_eq!(n, 3 * 7 * 2 + rows_read);
            }
        }
    }

    const KEPT: Replay = Replay::ByHand {
        keep_attention: true,
    };
    const RECOMPUTED: Replay = Replay::ByHand {
        keep_attention: false,
    };

    /// The replay by hand with the first pass's attention kept, and with it computed again,
    /// gives the same loss and the same gradients to the bit, in f32 and on a bf16 base: the same
    /// kernels run on the same q, k and v.
    #[test]
    fn keeping_the_attention_changes_no_bit() {
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(14);
        let base = init_random(&config(false), 0.3, &device);
        let bf16 = crate::trainer_tests::cast_weights(base.clone(), burn::tensor::FloatDType::BF16);
        for model in [lora_model(base, vec![]), lora_model(bf16, vec![])] {
            let run = |replay| {
                let b = batch();
                let (loss, g) = loss_and_grads_with(
                    &model,
                    &b,
                    head(&model),
                    CoreKind::Tiles,
                    replay,
                    Keep::Exact,
                    None,
                );
                (loss.to_bits(), gradients(&model, &g))
            };
            let (kept, recomputed) = (run(KEPT), run(RECOMPUTED));
            assert_eq!(kept.1.len(), 3 * 7 * 2);
            assert_eq!(kept.0, recomputed.0, "loss");
            for ((name, a), (_, b)) in kept.1.iter().zip(&recomputed.1) {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(a), bits(b), "{name}");
            }
        }
    }

    /// A layer's input kept in f16 reads back within f16's rounding at any magnitude: tokens
    /// of 1e6 (which a plain f16 cast makes infinite), of 1e-3, mixed across 12 orders of
    /// magnitude, and of zeros.
    #[test]
    fn scaled_layer_inputs_read_back_within_f16_rounding_at_any_magnitude() {
        let device = burn::tensor::Device::flex();
        let rows: [[f32; 4]; 4] = [
            [1.0e6, -3.5e5, 7.0, -1.0e6],
            [1.0e-3, -2.5e-4, 7.7e-3, 0.0],
            [4.0e4, -1.0e-8, 3.0, 1.0e-3],
            [0.0; 4],
        ];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let x = Tensor::<3>::from_data(
            burn::tensor::TensorData::new(flat.clone(), [2, 2, 4]),
            &device,
        );
        let plain = values(x.clone().cast(FloatDType::F16).cast(FloatDType::F32));
        assert!(
            plain.iter().any(|v| v.is_infinite()),
            "a plain f16 cast overflows"
        );

        let kept = Kept::new(&x, Keep::Scaled);
        assert!(kept.peak.is_some());
        assert_eq!(kept.values.dtype(), DType::F16);
        let back = values(kept.restore());
        for (row, (want, got)) in rows.iter().zip(flat.chunks(4).zip(back.chunks(4))) {
            let peak = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (w, g) in want.iter().zip(got) {
                let bound = w.abs() * 2f32.powi(-11) + peak * 2f32.powi(-39);
                assert!((w - g).abs() <= bound, "{w} read back as {g} (row {row:?})");
            }
        }
        let exact = values(Kept::new(&x, Keep::Exact).restore());
        assert_eq!(exact, flat);
    }

    /// LoRA on an f16 base (a Vulkan GPU's run) replays from layer inputs kept in f16, and its
    /// gradients match the ordinary taped pass to f16's rounding: on random weights, and with an
    /// embedding of about 1e5 (kept in f32 beside the f16 projections), whose residual stream a
    /// plain f16 copy would make infinite. The blocked core computes the attention's products
    /// in f16 ([`Products`]); the taped pass and the CPU's tiles in f32. Measured: the tiles at
    /// most 3.0e-3 relative in L2 norm (3.7e-3 of a tensor's largest element), replayed from
    /// exact inputs 6e-7; the blocks 6.7e-3, the loss 4.2e-4. For scale, the same adapters'
    /// gradients over this f16 base and over its f32 original differ by up to 7.0e-3.
    #[test]
    fn lora_on_an_f16_base_replays_from_inputs_kept_in_f16() {
        use burn::tensor::FloatDType;
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(15);
        let base = init_random(&config(false), 0.3, &device);
        assert_eq!(Keep::of(&base), Keep::Exact);
        let bf16 = crate::trainer_tests::cast_weights(base.clone(), FloatDType::BF16);
        assert_eq!(Keep::of(&bf16), Keep::Exact);
        let half = crate::trainer_tests::cast_weights(base, FloatDType::F16);
        assert_eq!(Keep::of(&half), Keep::Scaled);

        let mut loud = half.clone();
        let e = loud
            .model
            .embed_tokens
            .weight
            .val()
            .cast(FloatDType::F32)
            .mul_scalar(3e5);
        loud.model.embed_tokens.weight = Param::from_tensor(e);
        for model in [half, loud] {
            let model = lora_model(model, vec![]);
            // The blocks compute the attention's products in f16; the tiles (the CPU's) and
            // the taped pass in f32.
            let blocks = Tol {
                loss: 1e-3,
                rel: 1e-2,
                element: 2e-2,
            };
            let tiles = Tol {
                loss: 1e-5,
                rel: 5e-3,
                element: 1e-2,
            };
            for (core, tol) in [(CoreKind::Blocks(3), blocks), (CoreKind::Tiles, tiles)] {
                for replay in [TAPED, HAND_FINISH] {
                    let n = assert_same_gradients(&model, core, replay, Keep::Scaled, tol);
                    assert_eq!(n, 3 * 7 * 2);
                }
            }
        }
    }

    /// `base` with rank-2 adapters on all seven projections, `tokens` training beside them, and
    /// random `B`s (B = 0 at initialisation would leave A's gradients zero).
    fn lora_model(base: Qwen3, tokens: Vec<u32>) -> Qwen3 {
        let spec = crate::model::lora::LoraSpec {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: crate::run_config::LORA_TARGETS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            tokens,
        };
        let mut model = crate::model::lora::attach(base.train(), &spec, 1);
        let device = model.device();
        for layer in 0..model.model.layers.len() {
            for (_, proj) in crate::model::lora::projections_mut(&mut model, layer) {
                let ad = proj.lora.as_mut().unwrap();
                let dims = ad.lora_b.shape().dims::<2>();
                let b = Tensor::<2>::random(dims, Distribution::Normal(0.0, 0.3), &device);
                ad.lora_b = Param::initialized(ad.lora_b.id, b.require_grad());
            }
        }
        model
    }

    /// On a bf16 base the replay by hand rounds where Burn's cast–product–cast does: its
    /// gradients match the taped pass's to a few bf16 roundings (the products' f32 sums may
    /// land on the other side of a bf16 rounding boundary), and the taped replay's as closely.
    #[test]
    fn lora_on_a_bf16_base_replays_by_hand() {
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(13);
        let base = init_random(&config(false), 0.3, &device);
        let base = crate::trainer_tests::cast_weights(base, burn::tensor::FloatDType::BF16);
        let model = lora_model(base, vec![3]);
        assert!(crate::replay::applies(&model));
        let tol = Tol {
            loss: 1e-5,
            rel: 2e-3,
            element: 2e-2,
        };
        for replay in [TAPED, HAND_FINISH, KEPT, RECOMPUTED] {
            let n = assert_same_gradients(&model, CoreKind::Tiles, replay, Keep::Exact, tol);
            assert_eq!(n, 3 * 7 * 2 + 1);
        }
    }

    #[test]
    fn query_chunks_keep_a_block_within_budget() {
        // about a quarter of the rows, rounded up to a multiple of 16 (1030 / 4 is 258)
        assert_eq!(query_chunk(1, 32, 2048, SCORE_BLOCK), 512);
        assert_eq!(query_chunk(1, 2, 8, SCORE_BLOCK), 8);
        assert_eq!(query_chunk(2, 16, 200, SCORE_BLOCK), 128);
        assert_eq!(query_chunk(2, 16, 1030, SCORE_BLOCK), 272);
        // a budget of 100 rows a block: 96, the multiple of 16 below it
        assert_eq!(query_chunk(1, 3, 1000, 3 * 1000 * 100), 96);
        // under 16 rows a block, what the budget allows
        assert_eq!(query_chunk(64, 32, 8192, SCORE_BLOCK), 4);
        let c = query_chunk(2, 32, 2048, SCORE_BLOCK);
        assert!(2 * 32 * c * 2048 <= SCORE_BLOCK && c >= 1);
        // a device whose largest buffer holds 32 Mi f32 values (llvmpipe's OpenGL): blocks that
        // the budget bounds halve, and the causal cap stays where it was the smaller
        assert_eq!(query_chunk(64, 32, 8192, 1 << 25), 2);
        assert_eq!(query_chunk(2, 32, 2048, 1 << 25), 256);
        assert_eq!(query_chunk(1, 32, 2048, 1 << 25), 512);
    }
}
