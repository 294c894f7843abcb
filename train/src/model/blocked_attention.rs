//! The attention core in blocks of query rows, of Burn operations, so it runs on any backend:
//! `softmax(q·kᵀ·scale + mask)·v` and its gradients, one `[b, heads, chunk, s]` block of scores at
//! a time, each block reading only the keys its causal rows can see. Layer recomputation
//! (`crate::recompute`) runs a GPU's training step through it; the CPU has its own core in tiles
//! ([`flash`](super::flash)).
//!
//! On an f16 base the matrix products run in f16 ([`Products`]): a GPU's tensor cores take 16-bit
//! operands only. At the 4B shape (2 × 2048 tokens, recompute) the attention's products are an
//! eighth of a training step's arithmetic: 13.0 of 102.5 TFLOP, nine products of 40 GFLOP per
//! layer beside the projections' three passes of 29.8 TFLOP. The scores stay within f16's range
//! by construction ([`Operands`]); the softmax and every output stay f32.

use burn::tensor::{Bool, DType, FloatDType, Tensor};

use crate::model::qwen3::Qwen3;

/// `t` (`[b, heads, s, d]`, its heads grouped by the key/value head they share) as
/// `[b, kv_heads, s·groups, d]`: each key/value head's query rows in order, the `groups` heads
/// of a row side by side. A block of rows is then one contiguous slab of it ([`rows`], a view)
/// that the block's products read as they are, where rows cut from `[b, heads, s, d]` and
/// merged with the heads were a copy a block: one copy a tensor a pass instead of one a block.
fn by_rows(t: &Tensor<4>, kvh: usize) -> Tensor<4> {
    let [b, h, s, d] = t.dims();
    let groups = h / kvh;
    if groups == 1 {
        return t.clone();
    }
    t.clone()
        .reshape([b, kvh, groups, s, d])
        .swap_dims(2, 3)
        .reshape([b, kvh, s * groups, d])
}

/// `t` (`[b, kv_heads, s, d]`) laid out densely in that order: a copy only where it is not. The
/// values come from `[b, s, kv_heads, d]` as a view, whose rows a product cannot read in place
/// (cubecl counts a batch axis with a stride below the rows' as highly permuted and copies the
/// operand): so one copy a pass, where each block's product copied its rows of it.
fn dense(t: &Tensor<4>) -> Tensor<4> {
    let dims = t.dims();
    t.clone()
        .reshape([dims.iter().product::<usize>()])
        .reshape(dims)
}

/// The rows `c0..c0 + c` of `t` as [`by_rows`] lays it out: `[b, kv_heads, c·groups, d]`.
fn rows(t: &Tensor<4>, groups: usize, c0: usize, c: usize) -> Tensor<4> {
    t.clone().narrow(2, c0 * groups, c * groups)
}

/// A block's result, `[b, kv_heads, c·groups, d]` as [`rows`] orders it, as `[b, kv_heads,
/// groups, c, d]` (a view), for [`from_blocks`].
fn by_heads(t: Tensor<4>, groups: usize) -> Tensor<5> {
    let [b, kvh, n, d] = t.dims();
    t.reshape([b, kvh, n / groups, groups, d]).swap_dims(2, 3)
}

/// The blocks' results ([`by_heads`]) concatenated on their rows, as `[b, heads, s, d]`.
/// Burn's fusion writes a concatenation in the order its inputs lie in memory (rows, then
/// heads), so merging the heads back copies it once a pass (as llvmpipe's launches show), where
/// cutting each block's rows out of `[b, heads, s, d]` copied once a block.
fn from_blocks(blocks: Vec<Tensor<5>>) -> Tensor<4> {
    let all = Tensor::cat(blocks, 3);
    let [b, kvh, groups, s, d] = all.dims();
    all.reshape([b, kvh * groups, s, d])
}

/// The dtype of the blocked attention core's matrix products (`q·kᵀ` and `P·v`; backward `dO·vᵀ`,
/// `Pᵀ·dO`, `dS·k` and `dSᵀ·q`): f32, or a half type. Everything between them (the mask,
/// the softmax, the row sums of the backward pass) and every output stay f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Products {
    F32,
    /// The products' operands and results in this type (f16 or bf16), as PyTorch's autocast runs
    /// attention on a 16-bit base. A GPU's tensor cores take only 16-bit operands: an f32
    /// product runs on its plain cores.
    Half(FloatDType),
}

impl Products {
    /// f16 on an f16 base, else f32.
    pub(crate) fn of(model: &Qwen3) -> Self {
        Self::for_weights(model.dtype())
    }

    /// f16 for weights in f16 (a Vulkan GPU's base), else f32. A bf16 base (Metal, the CPU)
    /// keeps f32 until a Mac measures it: in a trial of recompute.rs's bf16 test with bf16
    /// products, the tiny model's adapter gradients moved by 6.3e-2 relative L2 from f32
    /// attention's; f16 products move them by 6.7e-3 (its f16 test).
    pub(crate) fn for_weights(dtype: DType) -> Self {
        match dtype {
            DType::F16 => Products::Half(FloatDType::F16),
            _ => Products::F32,
        }
    }
}

/// The largest magnitude a score takes in f16 before it is multiplied back to its value: 2^14,
/// a factor of four below f16's largest finite value (65 504).
const SCORE_PEAK: f32 = 16384.0;

/// `q`, `k` and `v` as the products read them. For half products the scores are computed as
/// `σ · ((q · scale / σ) · kᵀ)`: `σ ≥ 1` is chosen on the device from the largest query and key
/// norms so that no score can pass [`SCORE_PEAK`] in the half type (by Cauchy–Schwarz,
/// `|q·k| ≤ |q|·|k|`), whatever the magnitudes; no value is read back to the host.
pub(crate) struct Operands {
    /// `q`, or `q · scale / σ` in the half type.
    pub(crate) q: Tensor<4>,
    k: Tensor<4>,
    /// `kᵀ`, `[b, kv_heads, d, s]`.
    kt: Tensor<4>,
    pub(crate) v: Tensor<4>,
    /// σ as `[1, 1, 1, 1]` for half products.
    sigma: Option<Tensor<4>>,
    scale: f64,
    products: Products,
}

impl Operands {
    pub(crate) fn new(
        q: &Tensor<4>,
        k: &Tensor<4>,
        v: &Tensor<4>,
        scale: f64,
        products: Products,
    ) -> Self {
        let (q, k, v, sigma) = match products {
            Products::F32 => (q.clone(), k.clone(), v.clone(), None),
            Products::Half(dtype) => {
                // σ only bounds the scores' range: it leaves their values, so no gradient goes
                // through it
                let largest = |t: &Tensor<4>| {
                    let [b, h, s, _] = t.dims();
                    let norms = t.clone().detach().square().sum_dim(3);
                    crate::model::reduce::max(norms.reshape([b * h * s]))
                };
                let sigma = (largest(q) * largest(k))
                    .sqrt()
                    .mul_scalar(scale / SCORE_PEAK as f64)
                    .clamp_min(1.0)
                    .reshape([1, 1, 1, 1]);
                let q = (q.clone() * sigma.clone().recip().mul_scalar(scale)).cast(dtype);
                (q, k.clone().cast(dtype), v.clone().cast(dtype), Some(sigma))
            }
        };
        Operands {
            kt: k.clone().swap_dims(2, 3),
            q,
            k,
            v,
            sigma,
            scale,
            products,
        }
    }

    /// `t` as the products read it: itself in f32, else cast to the half type.
    pub(crate) fn operand(&self, t: &Tensor<4>) -> Tensor<4> {
        match self.products {
            Products::F32 => t.clone(),
            Products::Half(dtype) => t.clone().cast(dtype),
        }
    }

    /// A product's result in f32.
    pub(crate) fn result(&self, t: Tensor<4>) -> Tensor<4> {
        match self.products {
            Products::F32 => t,
            Products::Half(_) => t.cast(FloatDType::F32),
        }
    }

    /// The scores `q·kᵀ·scale` in f32 of queries `qc` (rows of [`Self::q`]) over the first `e`
    /// keys.
    pub(crate) fn scores(&self, qc: Tensor<4>, e: usize) -> Tensor<4> {
        self.scaled(self.product(qc, e))
    }

    /// `qc·kᵀ` over the first `e` keys, in the products' dtype.
    fn product(&self, qc: Tensor<4>, e: usize) -> Tensor<4> {
        qc.matmul(self.kt.clone().narrow(3, 0, e))
    }

    /// A product `qc·kᵀ` as scores: scaled, in f32.
    fn scaled<const D: usize>(&self, product: Tensor<D>) -> Tensor<D> {
        match &self.sigma {
            None => product.mul_scalar(self.scale),
            Some(sigma) => product.cast(FloatDType::F32) * sigma.clone().reshape([1; D]),
        }
    }

    /// The scores of one block of queries over the first `e` keys, the mask added,
    /// `[b, kv_heads, c·groups, e]`: from the block's queries `qc` (rows of [`Self::q`] as
    /// [`rows`] takes them) and the block's additive mask `bias` (`[b, 1, c, 1, e]`: 0 or −∞;
    /// [`BlockedCore`] holds it). With `e = c0 + c` nothing is lost: the mask is causal, so the
    /// rows `c0..c0 + c` give the later keys probability 0, and the block costs `e / s` of a full
    /// one.
    fn block_scores(&self, qc: Tensor<4>, bias: &Tensor<5>) -> Tensor<4> {
        let [b, kvh, cg] = [qc.dims()[0], qc.dims()[1], qc.dims()[2]];
        let e = bias.dims()[4];
        self.scores_by_row(qc, bias).reshape([b, kvh, cg, e])
    }

    /// [`Self::block_scores`] in the bias's shape, `[b, kv_heads, c, groups, e]`. The product
    /// takes that shape before it is scaled, so that the element-wise work on the scores (the
    /// scale, the bias, and in the backward the probabilities) fuses into one launch, where a
    /// reshape between them split it in two.
    fn scores_by_row(&self, qc: Tensor<4>, bias: &Tensor<5>) -> Tensor<5> {
        let [b, kvh, cg] = [qc.dims()[0], qc.dims()[1], qc.dims()[2]];
        let [_, _, c, _, e] = bias.dims();
        let product = self.product(qc, e).reshape([b, kvh, c, cg / c, e]);
        self.scaled(product) + bias.clone()
    }

    /// `softmax(scores)·v` over the last axis of `scores` (`[.., n, e]`, the mask in them) and
    /// `v`'s first `e` rows, with the softmax's division after the product: `exp(scores − max)·v`
    /// divided by the row sums of `exp(scores − max)`. So the division reads the `d`-wide output
    /// instead of the `e`-wide scores, where Burn's attention ran it as a launch of its own over
    /// the whole block (docs/results.md, "Scoring's attention through Burn's fusion"). The sums
    /// are taken after the product: taken before it, Burn's fusion planner ran 19 operations of
    /// scoring's layer unfused.
    pub(crate) fn weighted_values(&self, scores: Tensor<4>, e: usize) -> Tensor<4> {
        let (out, _, _) = self.weighted_values_with_sums(scores, e);
        out
    }

    /// The weighted values, the rows' largest scores and the sums of `exp(scores − max)`.
    fn weighted_values_with_sums(
        &self,
        scores: Tensor<4>,
        e: usize,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let max = scores.clone().max_dim(3);
        let (out, sums) = self.weigh((scores - max.clone()).exp(), e);
        (out, max, sums)
    }

    /// [`Self::weighted_values_with_sums`] of a block's queries `qc` under its `bias` (as
    /// [`Self::block_scores`] takes them), with `max` given: a first pass's rows' largest scores
    /// ([`RowMax`]). `exp(scores − max)` then fuses with the scores' scale and bias into one
    /// launch, where the rows' maxima took a reduction and a launch of their own. The first
    /// pass's scores may differ from these by a rounding (an f16 base's replay restores its
    /// input from f16), which moves only the sums, by about as much: the softmax stays exact.
    fn weighted_values_under(
        &self,
        qc: Tensor<4>,
        bias: &Tensor<5>,
        max: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let e = bias.dims()[4];
        let (out, sums) = self.weigh(self.exp_scores_less(qc, bias, max.clone()), e);
        (out, max, sums)
    }

    /// `exp(scores − per_row)` of a block's queries `qc` under its `bias`, `[b, kv_heads,
    /// c·groups, e]`, with one value a row in `per_row` (`[b, kv_heads, c·groups, 1]`: the rows'
    /// largest scores, or their log-sum-exp), taken in the bias's shape so that it fuses with
    /// the scores' scale and bias into one launch ([`Self::scores_by_row`]).
    fn exp_scores_less(&self, qc: Tensor<4>, bias: &Tensor<5>, per_row: Tensor<4>) -> Tensor<4> {
        let [b, kvh, cg] = [qc.dims()[0], qc.dims()[1], qc.dims()[2]];
        let [_, _, c, _, e] = bias.dims();
        // reshaped before the product: reshaped after it, Burn's fusion planner ran `exp` in a
        // launch of its own (on llvmpipe 2 more a layer in the replay's forward and 2 in the
        // backward, at 2 blocks)
        let per_row = per_row.reshape([b, kvh, c, cg / c, 1]);
        (self.scores_by_row(qc, bias) - per_row)
            .exp()
            .reshape([b, kvh, cg, e])
    }

    /// `weights · v` over `v`'s first `e` rows, divided by the weights' row sums; and the sums.
    fn weigh(&self, weights: Tensor<4>, e: usize) -> (Tensor<4>, Tensor<4>) {
        let out = self
            .operand(&weights)
            .matmul(self.v.clone().narrow(2, 0, e));
        let sums = weights.sum_dim(3);
        (self.result(out) / sums.clone(), sums)
    }
}

/// One block of query rows, `c0..c0 + rows`, which reads the keys `0..c0 + rows` (the mask is
/// causal), with its part of the batch's mask as an additive bias, `[b, 1, rows, 1, c0 + rows]`
/// (0 where a query sees a key, −∞ elsewhere), for the rows as [`rows`] orders them.
struct Block {
    c0: usize,
    rows: usize,
    bias: Tensor<5>,
}

/// What [`BlockedCore::forward_saving`] leaves for [`BlockedCore::backward`]: each block's rows'
/// log-sum-exp of their scaled, masked scores (`[b, kv_heads, rows·groups, 1]`, ordered as
/// [`rows`] takes them), and the products' operands, which the backward reads as they are
/// instead of building them again: `q`'s rows by key/value head and `v` dense (a copy each), and
/// on an f16 base also σ (two row norms, two maxima) and three casts. On llvmpipe (f32) that is
/// two launches a layer fewer in each step; on an f16 base about eight (estimated: llvmpipe's
/// OpenGL has no f16). The operands then stay alive while the layer's second half replays: at
/// the 4B (f16) 48 MiB, which the plan already counts beside that half's tape.
pub(crate) struct RowStats {
    lse: Vec<Tensor<4>>,
    ops: Operands,
}

/// Each block's rows' largest scaled, masked scores (`[b, kv_heads, rows·groups, 1]`), as a
/// first pass ([`BlockedCore::forward`]) found them: a layer's replay
/// ([`BlockedCore::forward_saving`]) subtracts them before `exp`. 4 bytes a query head a token
/// (512 KiB a layer at the 4B's 2 × 2048 tokens).
pub(crate) struct RowMax(Vec<Tensor<4>>);

/// The blocked core as one step runs it: its blocks of query rows and the dtype of the products.
/// The blocks' biases are cut from the mask once a step and read by every layer's passes, where
/// cutting them in each pass copied them each time (a launch a block a pass: about 650 a step at
/// the 4B).
pub(crate) struct BlockedCore {
    blocks: Vec<Block>,
    products: Products,
}

impl BlockedCore {
    /// For a batch whose `mask` (`[b, 1, s, s]`, true where a query may not see a key) the
    /// layer inputs carry.
    pub(crate) fn new(mask: &Tensor<4, Bool>, chunk: usize, products: Products) -> Self {
        let [b, _, s, _] = mask.dims();
        let chunk = chunk.max(1);
        let bias = Tensor::<4>::zeros(mask.dims(), &mask.device())
            .mask_fill(mask.clone(), f32::NEG_INFINITY);
        let blocks = (0..s)
            .step_by(chunk)
            .map(|c0| {
                let rows = chunk.min(s - c0);
                let e = c0 + rows;
                let bias = bias.clone().narrow(2, c0, rows).narrow(3, 0, e);
                Block {
                    c0,
                    rows,
                    bias: bias.reshape([b, 1, rows, 1, e]),
                }
            })
            .collect();
        Self { blocks, products }
    }

    /// The blocks, after checking that they cover the `s` query rows of the step's tensors.
    fn blocks(&self, s: usize) -> &[Block] {
        let covered = self.blocks.last().map_or(0, |l| l.c0 + l.rows);
        assert_eq!(
            covered, s,
            "the blocks were cut for another sequence length"
        );
        &self.blocks
    }

    /// Scaled dot-product attention with grouped key/value heads, `softmax(q·kᵀ·scale + bias)·v`.
    /// `q` is `[b, heads, s, d]`, `k` and `v` `[b, kv_heads, s, d]`, all f32; returns
    /// `[b, heads, s, d]` in f32, and each block's rows' largest scores, which a replay of the
    /// same layer ([`Self::forward_saving`]) takes instead of finding them again.
    pub(crate) fn forward(
        &self,
        qkv: (&Tensor<4>, &Tensor<4>, &Tensor<4>),
        scale: f64,
    ) -> (Tensor<4>, RowMax) {
        let ops = self.operands(qkv, scale);
        let (out, max, _) = self.forward_blocks(&ops, None, false);
        (out, RowMax(max))
    }

    /// [`Self::forward`] again, and what [`Self::backward`] reads of it: each block's rows'
    /// log-sum-exp (a small element-wise launch a block). With a first pass's rows' maxima
    /// (`first`), each block skips finding them: a reduction and a launch fewer a block.
    pub(crate) fn forward_saving(
        &self,
        qkv: (&Tensor<4>, &Tensor<4>, &Tensor<4>),
        scale: f64,
        first: Option<&RowMax>,
    ) -> (Tensor<4>, RowStats) {
        let ops = self.operands(qkv, scale);
        let (out, _, lse) = self.forward_blocks(&ops, first, true);
        (out, RowStats { lse, ops })
    }

    /// The products' operands of `q` (`[b, heads, s, d]`), `k` and `v` (`[b, kv_heads, s, d]`).
    fn operands(&self, (q, k, v): (&Tensor<4>, &Tensor<4>, &Tensor<4>), scale: f64) -> Operands {
        let kvh = k.dims()[1];
        Operands::new(&by_rows(q, kvh), k, &dense(v), scale, self.products)
    }

    /// The output, each block's rows' largest scores (or `first`'s) and, when `saving`, their
    /// log-sum-exp.
    fn forward_blocks(
        &self,
        ops: &Operands,
        first: Option<&RowMax>,
        saving: bool,
    ) -> (Tensor<4>, Vec<Tensor<4>>, Vec<Tensor<4>>) {
        // `q`'s rows by key/value head, `[b, kv_heads, s·groups, d]`, over `k`'s `s`
        let s = ops.k.dims()[2];
        let groups = ops.q.dims()[2] / s;
        if let Some(RowMax(max)) = first {
            assert_eq!(max.len(), self.blocks.len(), "the first pass's blocks");
        }
        let (mut outs, mut maxima, mut lse) = (Vec::new(), Vec::new(), Vec::new());
        for (
            i,
            &Block {
                c0,
                rows: c,
                ref bias,
            },
        ) in self.blocks(s).iter().enumerate()
        {
            // Causal: rows up to c0 + c see no key beyond it.
            let e = c0 + c;
            let qc = rows(&ops.q, groups, c0, c);
            let (out, max, sums) = match first {
                None => ops.weighted_values_with_sums(ops.block_scores(qc, bias), e),
                Some(RowMax(max)) => ops.weighted_values_under(qc, bias, max[i].clone()),
            };
            if saving {
                // Each row's log-sum-exp, from which the backward takes the probabilities in one
                // element-wise pass, `exp(scores − lse)`, as FlashAttention's backward does,
                // instead of a softmax's two reductions and the launches between them.
                lse.push(max.clone() + sums.log());
            }
            maxima.push(max);
            outs.push(by_heads(out, groups));
        }
        (from_blocks(outs), maxima, lse)
    }

    /// The gradients `(dq, dk, dv)` of [`Self::forward`] given its output `out`, the rows'
    /// statistics `stats` ([`Self::forward_saving`]) and the output's gradient `d_out`, block by
    /// block: with `P = exp(q·kᵀ·scale + bias − lse)` the block's probabilities, `dv += Pᵀ·dO`,
    /// `dS = P ⊙ (dO·vᵀ − rowsum(dO ⊙ O))·scale`, `dq = dS·k`, `dk += dSᵀ·q`. For half products
    /// the row sums are `rowsum(P ⊙ dP)` (equal in exact arithmetic), `dS` is rounded before its
    /// products without `scale`, and `dq` and `dk` take `scale` and σ after them (see
    /// [`Operands`]).
    pub(crate) fn backward(
        &self,
        out: &Tensor<4>,
        RowStats { lse, ops }: &RowStats,
        d_out: &Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, h, s, d] = out.dims();
        let kvh = ops.k.dims()[1];
        let groups = h / kvh;
        let scale = ops.scale;
        let vt = ops.v.clone().swap_dims(2, 3);
        // f32 takes the rows' `rowsum(dO ⊙ O)` (see below), for all rows at once: a block's
        // rows of them cost two launches each
        let delta = ops
            .sigma
            .is_none()
            .then(|| by_rows(&(d_out.clone() * out.clone()).sum_dim(3), kvh));
        let d_out = by_rows(&ops.operand(d_out), kvh);
        assert_eq!(
            lse.len(),
            self.blocks.len(),
            "the rows' statistics of each block"
        );
        // Last block first: it reads every key (`e = s`), so its `dk` and `dv` start the sums,
        // and the earlier blocks add theirs to the first `e` rows.
        let (mut dk, mut dv) = (None, None);
        let mut dq = Vec::new();
        for (
            &Block {
                c0,
                rows: c,
                ref bias,
            },
            lse,
        ) in self.blocks(s).iter().zip(lse).rev()
        {
            // Causal: the block's rows reach keys 0..e only, and only those get gradients.
            let e = c0 + c;
            let qc = rows(&ops.q, groups, c0, c);
            let p = ops.exp_scores_less(qc.clone(), bias, lse.clone());
            let doc = rows(&d_out, groups, c0, c);
            let pt = ops.operand(&p).swap_dims(2, 3);
            add_rows(&mut dv, ops.result(pt.matmul(doc.clone())), [b, kvh, s, d]);
            let dp = ops.result(doc.clone().matmul(vt.clone().narrow(3, 0, e)));
            let (dq_c, dk_c) = match &ops.sigma {
                None => {
                    let delta = delta.as_ref().expect("f32 products take the rows' sums");
                    let delta = rows(delta, groups, c0, c);
                    let ds = (p * (dp - delta)).mul_scalar(scale);
                    let dq_c = ds.clone().matmul(ops.k.clone().narrow(2, 0, e));
                    (dq_c, ds.swap_dims(2, 3).matmul(qc))
                }
                Some(sigma) => {
                    // `rowsum(P ⊙ dP)`, equal to `rowsum(dO ⊙ O)` in exact arithmetic, here from
                    // the same rounded `dP` it is taken from: every row of `dS` then sums to zero
                    // as a softmax's gradient does, and a saturated row (one key at probability
                    // 1) gets none. From `O`, the products' rounding left `dS` at 1.3e-3 of the
                    // f32 path's `dq` (relative L2) and made a saturated row's gradient noise.
                    let delta = (p.clone() * dp.clone()).sum_dim(3);
                    let ds = ops.operand(&(p * (dp - delta)));
                    let dq_c = ops.result(ds.clone().matmul(ops.k.clone().narrow(2, 0, e)));
                    let dk_c = ops.result(ds.swap_dims(2, 3).matmul(qc));
                    (dq_c.mul_scalar(scale), dk_c * sigma.clone())
                }
            };
            dq.push(by_heads(dq_c, groups));
            add_rows(&mut dk, dk_c, [b, kvh, s, d]);
        }
        dq.reverse();
        let whole = "the last block reads every key";
        (from_blocks(dq), dk.expect(whole), dv.expect(whole))
    }
}

/// Adds a block's gradient of the first `e` keys' rows (`part`, `[b, kv_heads, e, d]`) into
/// `sum` (`shape`), which the first block taken (the last, `e = s`) starts.
fn add_rows(sum: &mut Option<Tensor<4>>, part: Tensor<4>, shape: [usize; 4]) {
    *sum = Some(match sum.take() {
        None => {
            assert_eq!(part.dims(), shape, "the first block taken reads every key");
            part
        }
        Some(sum) => {
            let [b, kvh, e, d] = part.dims();
            let head = [0..b, 0..kvh, 0..e, 0..d];
            let added = sum.clone().slice(head.clone()) + part;
            sum.slice_assign(head, added)
        }
    });
}

#[cfg(test)]
mod tests {
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{Distribution, Tensor};

    use super::*;
    use crate::model::qwen3::{Batch, LayerInputs};
    use crate::trainer_tests::{relative_l2, values};

    /// Two rows, the second left-padded: the mask matters.
    fn batch() -> Batch {
        let a: &[u32] = &[3, 7, 1, 9, 4, 2, 8];
        let b: &[u32] = &[5, 8, 6];
        Batch::left_padded(&[a, b], 0)
    }

    /// The blocked core's output and its three gradients against Burn's attention and its
    /// autodiff, with 4 query heads over 4, 2 and 1 key/value heads (groups of 1, 2 and 4), in
    /// blocks of 1, 3 and all 7 rows. f32 throughout: within 1e-5 absolute.
    #[test]
    fn blocked_attention_matches_burns() {
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(5);
        let [b, h, s, d] = [2, 4, 7, 8];
        let normal =
            |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let inputs = LayerInputs::new(&batch(), d, 10000.0, &device);
        for kvh in [4, 2, 1] {
            let (q, k, v) = (
                normal([b, h, s, d]),
                normal([b, kvh, s, d]),
                normal([b, kvh, s, d]),
            );
            let d_out = normal([b, h, s, d]);
            let [qa, ka, va] = [&q, &k, &v].map(|t| t.clone().autodiff().require_grad());
            let want = burn::tensor::module::attention(
                qa.clone(),
                crate::model::qwen3::repeat_kv(ka.clone(), h / kvh),
                crate::model::qwen3::repeat_kv(va.clone(), h / kvh),
                Some(inputs.mask.clone()),
                None,
                AttentionModuleOptions {
                    scale: Some(0.3),
                    softcap: None,
                    is_causal: false,
                },
            );
            let mut grads = (want.clone() * d_out.clone()).backward();
            let want_grads = [qa, ka, va].map(|t| t.grad_remove(&mut grads).expect("a gradient"));
            let want = want.inner();
            for chunk in [1, 3, 7] {
                let core = BlockedCore::new(&inputs.mask, chunk, Products::F32);
                let (got, stats) = core.forward_saving((&q, &k, &v), 0.3, None);
                let diff = (got.clone() - want.clone())
                    .abs()
                    .max()
                    .into_scalar::<f32>();
                assert!(diff <= 1e-5, "{kvh} key/value heads, chunk {chunk}: {diff}");
                let (dq, dk, dv) = core.backward(&got, &stats, &d_out);
                for ((name, got), want) in
                    ["dq", "dk", "dv"].iter().zip([dq, dk, dv]).zip(&want_grads)
                {
                    let diff = (got - want.clone()).abs().max().into_scalar::<f32>();
                    assert!(
                        diff <= 1e-5,
                        "{kvh} key/value heads, chunk {chunk}, {name}: {diff}"
                    );
                }
            }
        }
    }

    /// The blocked core with its products in f16 and in bf16 against f32: the output and the
    /// three gradients, at a trained model's magnitudes and with queries and keys loud enough that
    /// a plain f16 product of the scores is infinite, which σ keeps finite. Relative L2 tolerances
    /// of a few roundings of the half type (2^-11 for f16, 2^-8 for bf16); measured at most
    /// 8.5e-4 in f16 (dk) and 6.3e-3 in bf16 (dq).
    #[test]
    fn half_products_match_f32_within_their_rounding() {
        let _rng = crate::trainer_tests::device_rng();
        let device = burn::tensor::Device::flex();
        device.seed(21);
        let [b, h, kvh, d] = [2, 4, 2, 8];
        let (long, short): (Vec<u32>, Vec<u32>) = ((1..=40).collect(), (1..=23).collect());
        let rows = Batch::left_padded(&[&long, &short], 0);
        let s = rows.seq_len();
        let inputs = LayerInputs::new(&rows, d, 10000.0, &device);
        let normal =
            |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let (q, k) = (normal([b, h, s, d]).mul_scalar(2.0), normal([b, kvh, s, d]));
        let (v, d_out) = (normal([b, kvh, s, d]), normal([b, h, s, d]));
        let scale = 1.0 / (d as f64).sqrt();
        let chunk = 9;
        let run = |q: &Tensor<4>, k: &Tensor<4>, products| {
            let core = BlockedCore::new(&inputs.mask, chunk, products);
            let (out, stats) = core.forward_saving((q, k, &v), scale, None);
            let (dq, dk, dv) = core.backward(&out, &stats, &d_out);
            [out, dq, dk, dv].map(values)
        };
        let names = ["out", "dq", "dk", "dv"];
        let f16 = Products::Half(FloatDType::F16);
        let bf16 = Products::Half(FloatDType::BF16);
        for (products, tol) in [(f16, 2e-3), (bf16, 1.5e-2)] {
            let want = run(&q, &k, Products::F32);
            let got = run(&q, &k, products);
            for ((name, got), want) in names.iter().zip(&got).zip(&want) {
                let r = relative_l2(got, want);
                assert!(
                    r <= tol,
                    "{products:?} {name}: relative L2 {r:e} over {tol:e}"
                );
                assert_ne!(
                    got, want,
                    "{products:?} {name}: the half type rounded nothing"
                );
            }
        }

        // Scores past f16's range: each query's softmax picks its largest key, so the output
        // and dv follow the f32 path, and dq and dk are about zero in both; all finite.
        let (q, k) = (q.mul_scalar(150.0), k.mul_scalar(300.0));
        let plain = (q.clone().mul_scalar(scale).cast(FloatDType::F16)).matmul(
            k.clone()
                .cast(FloatDType::F16)
                .swap_dims(2, 3)
                .repeat_dim(1, h / kvh),
        );
        assert!(
            values(plain.cast(FloatDType::F32))
                .iter()
                .any(|x| !x.is_finite()),
            "the loud scores overflow a plain f16 product"
        );
        let want = run(&q, &k, Products::F32);
        let got = run(&q, &k, f16);
        let largest = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, name) in names.iter().enumerate() {
            assert!(
                got[i].iter().all(|x| x.is_finite()),
                "loud {name}: not finite"
            );
            if i == 0 || i == 3 {
                let r = relative_l2(&got[i], &want[i]);
                assert!(r <= 2e-3, "loud {name}: relative L2 {r:e}");
            } else {
                // f32 gives 1.7e-4 and 2.3e-4 here; the half path's rows of dS sum to zero
                let (g, w) = (largest(&got[i]), largest(&want[i]));
                assert!(g <= 1e-3 && w <= 1e-3, "loud {name}: {g:e} (f32 {w:e})");
            }
        }
    }
}
