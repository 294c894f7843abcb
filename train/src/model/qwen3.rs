//! Qwen3 decoder in Burn, as Hugging Face `transformers` defines `Qwen3ForCausalLM`.
//!
//! Field names follow the Hugging Face parameter names (`model.layers.0.self_attn.q_proj.weight`,
//! ...), so a module path is the checkpoint name. Every projection is a [`Proj`]: the one place a
//! LoRA adapter hooks in.
//!
//! Batches are left-padded: the last position of every row is the answer slot. Position ids come
//! from the attention mask, and a padded position never influences a real one, so a row's output
//! does not depend on the rest of the batch.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::silu;
use burn::tensor::module::{attention, embedding, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, FloatDType};

use crate::model::blocked_attention::{Operands, Products};
use crate::model::config::Qwen3Config;
use crate::model::cpu_ops;
use crate::model::f16_safety::ProductChecks;
use crate::model::flash;

/// A linear projection `y = x·W (+ b)`, with `W` held as `[d_in, d_out]` (Burn's layout; the
/// checkpoint's `[d_out, d_in]` is transposed on load and save).
#[derive(Module, Debug)]
pub struct Proj {
    pub weight: Param<Tensor<2>>,
    pub bias: Option<Param<Tensor<1>>>,
    /// A LoRA adapter (trainer, `crate::model::lora`): adds `s·(x·A)·B` to the output.
    pub lora: Option<crate::model::lora::LoraAdapter>,
}

impl Proj {
    pub fn new(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            lora: None,
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward_checked(x, None, "")
    }

    /// [`Self::forward`], with an f16 product's output flagged in `checks` (under `path`, the
    /// projection's path inside its layer) when it is not finite.
    pub(crate) fn forward_checked<const D: usize>(
        &self,
        x: Tensor<D>,
        checks: Option<&ProductChecks>,
        path: &'static str,
    ) -> Tensor<D> {
        // Fold the leading axes into rows: one `[rows, d_in]·[d_in, d_out]` product instead of a
        // broadcast batched matmul of small per-row matrices, and in the backward pass one weight
        // gradient product instead of one per batch row plus a sum.
        let dims = x.dims();
        let d_in = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let x = x.reshape([rows, d_in]);
        let weight = self.weight.val();
        let bias = self.bias.as_ref().map(|b| b.val());
        let y = if x.dtype() == weight.dtype() {
            linear(x.clone(), weight, bias)
        } else if weight.dtype() == DType::BF16 && bias.is_none() && cpu_ops::on_plain_cpu(&x) {
            // Over every thread (flex converts on one), by AVX512_BF16 where the CPU has it.
            cpu_ops::Bf16Weight::new(weight, false).product(x.clone())
        } else {
            // A bf16 / f16 base: the product in the weights' dtype, the output back in the
            // activations' (f32), so the residual stream and the adapter's delta stay f32.
            let dtype = x.dtype();
            let half = weight.dtype();
            let y = linear(x.clone().cast(half), weight, bias);
            if let Some(c) = checks.filter(|_| half == DType::F16) {
                c.record(path, &y);
            }
            y.cast(dtype)
        };
        let y = match &self.lora {
            // Untaped on the CPU dropout is off: the low-rank term adds itself in its product.
            Some(ad) if cpu_ops::on_plain_cpu(&y) && y.dtype() == ad.lora_a.val().dtype() => {
                let xa = in_f32(x).matmul(ad.lora_a.val());
                cpu_ops::add_product(y, xa, ad.lora_b.val(), ad.scaling)
            }
            Some(adapter) => y + adapter.delta(x),
            None => y,
        };
        let mut out = dims;
        out[D - 1] = self.dims()[1];
        y.reshape(out)
    }

    /// `[d_in, d_out]`.
    pub fn dims(&self) -> [usize; 2] {
        self.weight.shape().dims()
    }
}

/// Qwen3's RMSNorm over the last axis: `w · x / sqrt(mean(x²) + eps)`, computed in f32.
#[derive(Module, Debug)]
pub struct RmsNorm {
    pub weight: Param<Tensor<1>>,
    pub eps: f64,
}

impl RmsNorm {
    pub fn new(weight: Tensor<1>, eps: f64) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            eps,
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        if cpu_ops::on_plain_cpu(&x) {
            return cpu_ops::rms_norm(x, self.weight.val(), self.eps);
        }
        self.forward_generic(x)
    }

    /// [`Self::forward`] in Burn operations, on any device (a tape derives its backward), with
    /// `r = 1 / sqrt(mean(x²) + eps)`: `(x · w) · r` without a tape, `(x · r) · w` on one. Burn's
    /// fusion (0.22) plans a GPU layer's operations whole with the first; with `x / rms · w` its
    /// planner built blocks that depend on each other around the MLP and ran the whole stretch
    /// one launch per operation (docs/results.md, "Burn's fusion and the norm's order"). On a
    /// tape the first would keep `x · w` for the backward pass, a tensor of `x`'s size more per
    /// norm; the second keeps `x` and `r`, as `x / rms · w` did.
    pub(crate) fn forward_generic<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let x = in_f32(x);
        let w = in_f32(self.weight.val()).unsqueeze();
        let r = |x: Tensor<D>| (x.square().mean_dim(D - 1) + self.eps).sqrt().recip();
        if x.is_tracked() {
            (x.clone() * r(x)) * w
        } else {
            // `x · w` first: the planner fuses more in this order (180 launches to score 8
            // states of the tiny base on llvmpipe, against 212 with `r` first)
            let xw = x.clone() * w;
            xw * r(x)
        }
    }
}

/// `t` in f32: itself when it already is, else a cast. Activations (the residual stream, norms,
/// attention, the loss) are f32 whatever the weights' dtype: a bf16 base computes only its
/// matrix products in bf16 ([`Proj::forward`]), as autocast does. With bf16 activations a LoRA
/// retrain of the demo plateaued at 0.95 accuracy where f32 reached 0.99 (README).
pub(crate) fn in_f32<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(FloatDType::F32)
    }
}

/// Token embedding, `[vocab, hidden]` as in the checkpoint.
#[derive(Module, Debug)]
pub struct Embedding {
    pub weight: Param<Tensor<2>>,
}

/// The output projection, `[vocab, hidden]` as in the checkpoint (absent when tied).
#[derive(Module, Debug)]
pub struct LmHead {
    pub weight: Param<Tensor<2>>,
}

/// Rows of the token embedding that train while the rest of it stays frozen (PEFT's trainable
/// tokens): `values` replaces rows `ids` of the embedding, and of the LM head when it is tied.
#[derive(Module, Debug)]
pub struct TrainableTokens {
    /// `[ids.len(), hidden]`, f32, initialised to the embedding's rows.
    pub values: Param<Tensor<2>>,
    /// The token ids, in `values`' row order.
    pub ids: Vec<u32>,
}

impl TrainableTokens {
    /// For each of `tokens`, its row in `values` plus one (0: not a trainable token), or `None`
    /// when none of them is.
    fn slots(&self, tokens: impl Iterator<Item = u32>) -> Option<Vec<i64>> {
        let slots: Vec<i64> = tokens
            .map(|t| {
                self.ids
                    .iter()
                    .position(|&i| i == t)
                    .map_or(0, |p| p as i64 + 1)
            })
            .collect();
        slots.iter().any(|&s| s > 0).then_some(slots)
    }

    /// `rows` (`[k, hidden]`, one per token of `tokens`, f32) with the trainable tokens' rows
    /// replaced by their values; `values` is this module's value on `rows`' device.
    fn replace_rows(&self, rows: Tensor<2>, values: Tensor<2>, tokens: &[u32]) -> Tensor<2> {
        let Some(slots) = self.slots(tokens.iter().copied()) else {
            return rows;
        };
        let device = rows.device();
        let [k, _] = rows.dims();
        let keep: Vec<f32> = slots.iter().map(|&s| (s == 0) as u8 as f32).collect();
        let keep = Tensor::<2>::from_data(TensorData::new(keep, [k, 1]), &device);
        let slots = Tensor::<1, Int>::from_data(TensorData::new(slots, [k]), &device);
        rows * keep + Self::padded(values).select(0, slots)
    }

    /// `values` below a row of zeros (slot 0).
    fn padded(values: Tensor<2>) -> Tensor<2> {
        let [_, h] = values.dims();
        let zero = Tensor::<2>::zeros([1, h], &values.device());
        Tensor::cat(vec![zero, values], 0)
    }
}

#[derive(Module, Debug)]
pub struct Attention {
    pub q_proj: Proj,
    pub k_proj: Proj,
    pub v_proj: Proj,
    pub o_proj: Proj,
    pub q_norm: RmsNorm,
    pub k_norm: RmsNorm,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl Attention {
    pub fn forward(
        &self,
        x: Tensor<3>,
        inputs: &LayerInputs,
        checks: Option<&ProductChecks>,
    ) -> Tensor<3> {
        let (q, k, v) = self.qkv(x, inputs, checks);
        if let Some(tiles) = &inputs.tiles {
            let scale = self.scale() as f32;
            #[cfg(target_arch = "x86_64")]
            if self.q_proj.weight.val().dtype() == DType::BF16 && cpu_ops::native_bf16() {
                let out = flash::forward_in_bf16(&q, &k, &v, tiles, scale);
                return self.output(out, checks);
            }
            let (out, _) = flash::forward(&q, &k, &v, tiles, scale);
            return self.output(out, checks);
        }
        let out = self.core(q, k, v, inputs.mask.clone());
        self.output(out, checks)
    }

    /// Attention of queries `[b, heads, n, d]` over keys and values `[b, kv_heads, s, d]` under
    /// `mask` `[b, 1, n, s]`, in blocks of query rows whose scores fit [`score_budget`].
    fn core(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: Tensor<4, Bool>) -> Tensor<4> {
        let budget = score_budget(&q.device());
        self.core_in_blocks(q, k, v, mask, budget)
    }

    /// [`Self::core`] with at most `max_scores` attention scores (`b · heads · rows · s`) per
    /// block of query rows. The scores are materialised (as Burn's GPU attention does without
    /// autotuning, its fallback): the 4B model's evaluation at 16 rows of 2048 tokens in one
    /// block would ask for one 8 GiB buffer (past the 4 GiB storage-buffer range Vulkan drivers
    /// commonly state, unless cubecl takes 64-bit indexing) and three such tensors, far past the
    /// plan.
    pub(crate) fn core_in_blocks(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        mask: Tensor<4, Bool>,
        max_scores: usize,
    ) -> Tensor<4> {
        let groups = self.num_heads / self.num_kv_heads;
        let (k, v) = (repeat_kv(k, groups), repeat_kv(v, groups));
        let [b, h, n, _] = q.dims();
        let s = k.dims()[2];
        // a multiple of 16 rows where the budget allows, as `recompute::query_chunk` takes them
        let rows = whole_multiple_rows(max_scores / (b * h * s).max(1)).clamp(1, n.max(1));
        let options = AttentionModuleOptions {
            scale: Some(self.scale()),
            softcap: None,
            is_causal: false,
        };
        // Untaped, the core in Burn operations, as the recomputed step's is: Burn's fusion fuses
        // the mask and the softmax into few kernels, where Burn's attention (its fallback without
        // autotuning) runs beneath fusion, its mask, subtraction and division one launch each
        // over the whole block of scores (docs/results.md, "Scoring's attention through Burn's
        // fusion"); and on an f16 base the products in f16 (`blocked_attention::Products`). On a
        // tape, Burn's attention in f32: its backward would carry the products' gradients in f16,
        // where the unscaled loss of a test's model with a loud residual stream lost 15 % of some
        // adapters' gradients to underflow.
        let products = Products::for_weights(self.q_proj.weight.val().dtype());
        let ops = (!q.is_tracked()).then(|| Operands::new(&q, &k, &v, self.scale(), products));
        let q = ops.as_ref().map_or(q, |ops| ops.q.clone());
        let block = |q: Tensor<4>, mask: Tensor<4, Bool>| match &ops {
            None => attention(q, k.clone(), v.clone(), Some(mask), None, options),
            Some(ops) => {
                let scores = ops.scores(q, s).mask_fill(mask, f32::NEG_INFINITY);
                ops.weighted_values(scores, s)
            }
        };
        if rows >= n {
            return block(q, mask);
        }
        let blocks = (0..n)
            .step_by(rows)
            .map(|r0| {
                let r = rows.min(n - r0);
                block(q.clone().narrow(2, r0, r), mask.clone().narrow(2, r0, r))
            })
            .collect();
        Tensor::cat(blocks, 2)
    }

    /// Queries `[b, heads, s, d]`, keys and values `[b, kv_heads, s, d]`: projected, normed
    /// (q, k) and rotated (q, k), before the key/value heads are shared out.
    pub fn qkv(
        &self,
        x: Tensor<3>,
        inputs: &LayerInputs,
        checks: Option<&ProductChecks>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, s, _] = x.dims();
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        if cpu_ops::on_plain_cpu(&x) {
            let (cos, sin) = (&inputs.cos, &inputs.sin);
            let heads = |proj: &Proj, norm: &RmsNorm, n: usize, path| {
                let x = proj.forward_checked(x.clone(), checks, path);
                cpu_ops::norm_rope_heads(x, n, norm.weight.val(), norm.eps, cos, sin)
            };
            let q = heads(&self.q_proj, &self.q_norm, h, "self_attn.q_proj");
            let k = heads(&self.k_proj, &self.k_norm, kvh, "self_attn.k_proj");
            let v = self
                .v_proj
                .forward_checked(x, checks, "self_attn.v_proj")
                .reshape([b, s, kvh, d])
                .swap_dims(1, 2);
            return (q, k, v);
        }
        let (cos, sin) = (&inputs.cos, &inputs.signed_sin);
        let q = self.q_norm.forward(
            self.q_proj
                .forward_checked(x.clone(), checks, "self_attn.q_proj")
                .reshape([b, s, h, d]),
        );
        let k = self.k_norm.forward(
            self.k_proj
                .forward_checked(x.clone(), checks, "self_attn.k_proj")
                .reshape([b, s, kvh, d]),
        );
        let v = self
            .v_proj
            .forward_checked(x, checks, "self_attn.v_proj")
            .reshape([b, s, kvh, d])
            .swap_dims(1, 2);
        let q = rope(q.swap_dims(1, 2), cos, sin);
        let k = rope(k.swap_dims(1, 2), cos, sin);
        (q, k, v)
    }

    /// The attention scale, `1/√head_dim`.
    pub fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    /// The heads' outputs `[b, heads, s, d]` through `o_proj`: `[b, s, hidden]`.
    pub fn output(&self, heads: Tensor<4>, checks: Option<&ProductChecks>) -> Tensor<3> {
        let [b, h, s, d] = heads.dims();
        self.o_proj.forward_checked(
            heads.swap_dims(1, 2).reshape([b, s, h * d]),
            checks,
            "self_attn.o_proj",
        )
    }
}

/// RoPE of `x` (`[b, heads, s, d]`):
/// `x·cos + rotate_half(x)·sin` (Qwen's rotate-half convention, not interleaved pairs), with
/// `cos` and `signed_sin` as [`LayerInputs`] holds them (`[b, 1, s, d]`). `rotate_half(x)` is
/// `x` with its halves swapped and the first negated: here the swap is a flip of the axis of
/// halves, one launch, and the sign is in `signed_sin`, where `cat` took a launch a half and
/// its backward two more each (15 launches a layer of a training step on llvmpipe).
pub(crate) fn rope(x: Tensor<4>, cos: &Tensor<4>, signed_sin: &Tensor<4>) -> Tensor<4> {
    let [b, h, s, d] = x.dims();
    let swapped = x
        .clone()
        .reshape([b, h, s, 2, d / 2])
        .flip([3])
        .reshape([b, h, s, d]);
    x * cos.clone() + swapped * signed_sin.clone()
}

/// `sin` (`[.., d]`) with its first half negated, as [`rope`] reads it.
pub(crate) fn signed_sin(sin: &Tensor<4>) -> Tensor<4> {
    let half = sin.dims()[3] / 2;
    let first = sin.clone().narrow(3, 0, half).neg();
    Tensor::cat(vec![first, sin.clone().narrow(3, half, half)], 3)
}

/// `[b, kv_heads, s, d]` → `[b, kv_heads·groups, s, d]`, each kv head serving `groups` query heads.
pub(crate) fn repeat_kv(x: Tensor<4>, groups: usize) -> Tensor<4> {
    if groups == 1 {
        return x;
    }
    let [b, kvh, s, d] = x.dims();
    x.reshape([b, kvh, 1, s, d])
        .expand([b, kvh, groups, s, d])
        .reshape([b, kvh * groups, s, d])
}

#[derive(Module, Debug)]
pub struct Mlp {
    pub gate_proj: Proj,
    pub up_proj: Proj,
    pub down_proj: Proj,
}

impl Mlp {
    pub fn forward(&self, x: Tensor<3>, checks: Option<&ProductChecks>) -> Tensor<3> {
        let gate = self
            .gate_proj
            .forward_checked(x.clone(), checks, "mlp.gate_proj");
        let up = self.up_proj.forward_checked(x, checks, "mlp.up_proj");
        let act = if cpu_ops::on_plain_cpu(&gate) {
            cpu_ops::silu_mul(gate, up)
        } else if gate.is_tracked() || up.is_tracked() {
            silu_mul_taped(gate, up)
        } else {
            silu(gate) * up
        };
        self.down_proj.forward_checked(act, checks, "mlp.down_proj")
    }
}

/// `silu(gate) · up` on a tape, keeping two intermediate-sized tensors for its backward pass
/// where Burn's `silu(gate) * up` keeps four (gate, its sigmoid, SiLU and up): the two partial
/// derivatives, `∂/∂gate = up · σ(gate) · (1 + gate · (1 − σ(gate)))` and `∂/∂up = silu(gate)`,
/// computed off the tape. The tape sees `act + (lin − lin)`, with `lin = gate · ∂/∂gate +
/// up · ∂/∂up` taped and its second copy detached: the value is `act` to the bit (a tensor minus
/// its own bits is zero), and the gradient reaching `lin` is `act`'s. At the 4B that is two
/// `[tokens, 9728]` f32 tensors less in each layer's replay, 0.30 GiB at 2 x 2048 tokens.
pub(crate) fn silu_mul_taped<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    let (g, u) = (gate.clone().detach(), up.clone().detach());
    let sig = burn::tensor::activation::sigmoid(g.clone());
    let silu = g.clone() * sig.clone();
    let act = silu.clone() * u.clone();
    let d_gate = u * sig.clone() * (g * sig.neg().add_scalar(1.0)).add_scalar(1.0);
    let lin = gate * d_gate + up * silu;
    act + (lin.clone() - lin.detach())
}

#[derive(Module, Debug)]
pub struct DecoderLayer {
    pub input_layernorm: RmsNorm,
    pub self_attn: Attention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: Mlp,
}

impl DecoderLayer {
    pub fn forward(
        &self,
        x: Tensor<3>,
        inputs: &LayerInputs,
        checks: Option<&ProductChecks>,
    ) -> Tensor<3> {
        let x = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), inputs, checks);
        x.clone()
            + self
                .mlp
                .forward(self.post_attention_layernorm.forward(x), checks)
    }

    /// [`Self::forward`]'s output at the last position only, `[b, hidden]`: all the answer slot
    /// reads of the last layer. Keys and values span every position; the attention's query, its
    /// output projection and the MLP run for the last one alone (at 0.6B shapes the last layer
    /// would otherwise be 1/28 of a forward pass spent on positions nothing reads).
    pub(crate) fn forward_last(&self, x: Tensor<3>, inputs: &LayerInputs) -> Tensor<2> {
        let [b, s, hidden] = x.dims();
        let (q, k, v) = self.attention_inputs(x.clone(), inputs, None);
        let last = |t: Tensor<4>| t.narrow(2, s - 1, 1);
        let heads = self
            .self_attn
            .core(last(q), k, v, inputs.mask.clone().narrow(2, s - 1, 1));
        self.finish(x.narrow(1, s - 1, 1), heads, None)
            .reshape([b, hidden])
    }

    /// The layer's seven projections with their paths inside it (`self_attn.q_proj` ...
    /// `mlp.down_proj`).
    pub fn projections(&self) -> [(&'static str, &Proj); 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            ("self_attn.q_proj", &a.q_proj),
            ("self_attn.k_proj", &a.k_proj),
            ("self_attn.v_proj", &a.v_proj),
            ("self_attn.o_proj", &a.o_proj),
            ("mlp.gate_proj", &m.gate_proj),
            ("mlp.up_proj", &m.up_proj),
            ("mlp.down_proj", &m.down_proj),
        ]
    }

    /// [`Self::projections`], mutable.
    pub(crate) fn projections_mut(&mut self) -> [(&'static str, &mut Proj); 7] {
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        [
            ("self_attn.q_proj", &mut a.q_proj),
            ("self_attn.k_proj", &mut a.k_proj),
            ("self_attn.v_proj", &mut a.v_proj),
            ("self_attn.o_proj", &mut a.o_proj),
            ("mlp.gate_proj", &mut m.gate_proj),
            ("mlp.up_proj", &mut m.up_proj),
            ("mlp.down_proj", &mut m.down_proj),
        ]
    }

    /// The first half of [`forward`](Self::forward), up to the attention core: `(q, k, v)` as
    /// [`Attention::qkv`] returns them.
    pub(crate) fn attention_inputs(
        &self,
        x: Tensor<3>,
        inputs: &LayerInputs,
        checks: Option<&ProductChecks>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        self.self_attn
            .qkv(self.input_layernorm.forward(x), inputs, checks)
    }

    /// The second half: the layer's output from its input `x` and the attention heads' outputs
    /// `[b, heads, s, d]`.
    pub fn finish(
        &self,
        x: Tensor<3>,
        heads: Tensor<4>,
        checks: Option<&ProductChecks>,
    ) -> Tensor<3> {
        let x = x + self.self_attn.output(heads, checks);
        x.clone()
            + self
                .mlp
                .forward(self.post_attention_layernorm.forward(x), checks)
    }
}

#[derive(Module, Debug)]
pub struct Qwen3Model {
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

/// `Qwen3ForCausalLM`: the decoder and its LM head (`None` when tied to the embedding).
#[derive(Module, Debug)]
pub struct Qwen3 {
    pub model: Qwen3Model,
    pub lm_head: Option<LmHead>,
    /// Embedding rows that train in a LoRA run (`[lora] trainable_tokens`), until merged.
    pub tokens: Option<TrainableTokens>,
    /// RoPE base, kept with the weights so the forward pass needs nothing else.
    pub rope_theta: f64,
}

/// A left-padded batch of token ids on the host. Row `i` holds its tokens at the end; the
/// positions before them are padding (`attention_mask` 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub input_ids: Vec<Vec<u32>>,
    pub attention_mask: Vec<Vec<u8>>,
}

/// On a GPU a batch runs at a length that is a multiple of this. Burn's GPU kernels are compiled
/// for the shape class they meet (the vector width a tensor's last dimension divides by, whether
/// a matmul's rows fill its tiles), so batches of ragged lengths keep compiling new kernels for
/// their first hundreds of steps; at multiples of 16 (f16's widest vector is 8, a tensor-core tile
/// 16) they compile no new kind after their first few (docs/results.md, "Batch lengths on a GPU").
/// The CPU compiles nothing and pads nothing.
pub const GPU_LENGTH_MULTIPLE: usize = 16;

/// Query rows for an attention block that may hold at most `rows`: a multiple of
/// [`GPU_LENGTH_MULTIPLE`] below it, or `rows` itself when that is fewer than one multiple.
pub(crate) fn whole_multiple_rows(rows: usize) -> usize {
    if rows >= GPU_LENGTH_MULTIPLE {
        rows - rows % GPU_LENGTH_MULTIPLE
    } else {
        rows
    }
}

/// The length a batch whose longest row has `longest` tokens runs at, on a GPU or on the CPU.
pub fn run_length(longest: usize, gpu: bool) -> usize {
    if gpu {
        longest.next_multiple_of(GPU_LENGTH_MULTIPLE)
    } else {
        longest
    }
}

impl Batch {
    /// Left-pad token sequences to the longest one with `pad_id`.
    pub fn left_padded(rows: &[&[u32]], pad_id: u32) -> Self {
        let seq = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        Self::left_padded_to(rows, pad_id, seq)
    }

    /// Left-pad token sequences with `pad_id` to the length they run at on `device`
    /// ([`run_length`]): the longest row's on the CPU, a multiple of [`GPU_LENGTH_MULTIPLE`] on a
    /// GPU. Padding changes no row's logits.
    pub fn left_padded_on(rows: &[&[u32]], pad_id: u32, device: &Device) -> Self {
        let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let gpu = *device != Device::flex();
        Self::left_padded_to(rows, pad_id, run_length(longest, gpu))
    }

    /// Left-pad token sequences with `pad_id` to `seq` tokens, at least the longest row's.
    pub fn left_padded_to(rows: &[&[u32]], pad_id: u32, seq: usize) -> Self {
        debug_assert!(rows.iter().all(|r| r.len() <= seq));
        let mut input_ids = Vec::with_capacity(rows.len());
        let mut attention_mask = Vec::with_capacity(rows.len());
        for row in rows {
            let pad = seq - row.len();
            let mut ids = vec![pad_id; pad];
            ids.extend_from_slice(row);
            let mut mask = vec![0u8; pad];
            mask.extend(std::iter::repeat_n(1u8, row.len()));
            input_ids.push(ids);
            attention_mask.push(mask);
        }
        Self {
            input_ids,
            attention_mask,
        }
    }

    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    pub fn seq_len(&self) -> usize {
        self.input_ids.first().map_or(0, Vec::len)
    }

    /// Position ids from the mask: a row's first real token is position 0, padding gets 0.
    pub fn position_ids(&self) -> Vec<Vec<usize>> {
        self.attention_mask
            .iter()
            .map(|mask| {
                let mut next = 0usize;
                mask.iter()
                    .map(|&m| {
                        if m != 0 {
                            next += 1;
                            next - 1
                        } else {
                            0
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// What every layer needs besides the hidden states: rotary tables and the attention mask.
pub struct LayerInputs {
    /// `[b, 1, s, head_dim]`
    pub cos: Tensor<4>,
    pub sin: Tensor<4>,
    /// `sin` with the first half of each row negated ([`signed_sin`]), as [`rope`] reads it.
    pub signed_sin: Tensor<4>,
    /// `[b, 1, s, s]`, true = masked out.
    pub mask: Tensor<4, Bool>,
    /// The same mask for [`flash`]'s tiles, on the plain CPU device only: there the untaped
    /// forward pass (scoring, evaluation) runs attention in tiles that skip what the causal mask
    /// removes, instead of the backend's attention over every query-key pair.
    pub(crate) tiles: Option<flash::Mask>,
}

impl LayerInputs {
    /// Causal attention restricted to real tokens. A padding query attends to itself only, so
    /// no row of the softmax is empty on any backend.
    pub fn new(batch: &Batch, head_dim: usize, rope_theta: f64, device: &Device) -> Self {
        let (b, s) = (batch.len(), batch.seq_len());
        let half = head_dim / 2;
        // As transformers: inv_freq in f32, freqs = position · inv_freq in f32.
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / rope_theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
            .collect();
        let positions = batch.position_ids();
        let mut cos = Vec::with_capacity(b * s * head_dim);
        let mut sin = Vec::with_capacity(b * s * head_dim);
        for row in &positions {
            for &p in row {
                let freqs: Vec<f32> = inv_freq.iter().map(|f| p as f32 * f).collect();
                for _ in 0..2 {
                    cos.extend(freqs.iter().map(|f| f.cos()));
                    sin.extend(freqs.iter().map(|f| f.sin()));
                }
            }
        }
        let mut mask = Vec::with_capacity(b * s * s);
        for row in &batch.attention_mask {
            for q in 0..s {
                for (k, &real) in row.iter().enumerate() {
                    let allowed = k <= q && (real != 0 || k == q);
                    mask.push(!allowed);
                }
            }
        }
        let float = |v: Vec<f32>| {
            Tensor::<4>::from_data(
                TensorData::new(v, [b, 1, s, head_dim]),
                (device, DType::F32),
            )
        };
        // DECISION_ATTENTION=blocks keeps the backend's attention, for comparison (docs/results.md).
        let blocks = std::env::var("DECISION_ATTENTION").is_ok_and(|v| v == "blocks");
        let tiles = (cpu_ops::is_plain_cpu(device) && !blocks)
            .then(|| flash::Mask::from_masked(&mask, b, s));
        let sin = float(sin);
        Self {
            cos: float(cos),
            signed_sin: signed_sin(&sin),
            sin,
            mask: Tensor::<4, Bool>::from_data(TensorData::new(mask, [b, 1, s, s]), device),
            tiles,
        }
    }
}

impl Qwen3 {
    pub fn device(&self) -> Device {
        self.model.embed_tokens.weight.device()
    }

    pub fn dtype(&self) -> DType {
        self.model.embed_tokens.weight.val().dtype()
    }

    pub fn head_dim(&self) -> usize {
        self.model
            .layers
            .first()
            .map_or(0, |l| l.self_attn.head_dim)
    }

    /// The LM head matrix `[vocab, hidden]` (the embedding when tied), without the trainable
    /// tokens' rows ([`Self::lm_rows`] has them).
    fn lm_head_weight(&self) -> Tensor<2> {
        match &self.lm_head {
            Some(head) => head.weight.val(),
            None => self.model.embed_tokens.weight.val(),
        }
    }

    /// The trainable tokens that also act on the LM head: all of them when it is tied.
    fn head_tokens(&self) -> Option<&TrainableTokens> {
        self.tokens.as_ref().filter(|_| self.lm_head.is_none())
    }

    /// Rows `token_ids` of the LM head, f32 `[k, hidden]`, the trainable tokens' rows replaced
    /// when the head is tied.
    pub(crate) fn lm_rows(&self, token_ids: &[u32]) -> Tensor<2> {
        let device = self.device();
        let idx: Vec<i64> = token_ids.iter().map(|&t| t as i64).collect();
        let n = idx.len();
        let rows = in_f32(self.lm_head_weight().select(
            0,
            Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &device),
        ));
        match self.head_tokens() {
            Some(t) => t.replace_rows(rows, t.values.val(), token_ids),
            None => rows,
        }
    }

    pub(crate) fn ids_tensor(batch: &Batch, device: &Device) -> Tensor<2, Int> {
        let (b, s) = (batch.len(), batch.seq_len());
        let flat: Vec<i64> = batch
            .input_ids
            .iter()
            .flatten()
            .map(|&t| t as i64)
            .collect();
        Tensor::<2, Int>::from_data(TensorData::new(flat, [b, s]), device)
    }

    /// The f32 token embeddings `[b, s, hidden]` of `batch`, looked up in `weight` (the
    /// embedding's value, on whichever device the caller works), with the trainable tokens'
    /// rows taken from `tokens` (their values on the same device).
    pub fn embed(&self, weight: Tensor<2>, tokens: Option<Tensor<2>>, batch: &Batch) -> Tensor<3> {
        let device = weight.device();
        let x = in_f32(embedding(weight, Self::ids_tensor(batch, &device)));
        let (Some(t), Some(values)) = (&self.tokens, tokens) else {
            return x;
        };
        let [b, s, h] = x.dims();
        let ids: Vec<u32> = batch.input_ids.iter().flatten().copied().collect();
        t.replace_rows(x.reshape([b * s, h]), values, &ids)
            .reshape([b, s, h])
    }

    /// Whether any of the batch's tokens is a trainable token.
    pub(crate) fn trainable_tokens_in(&self, batch: &Batch) -> bool {
        self.tokens
            .as_ref()
            .is_some_and(|t| t.slots(batch.input_ids.iter().flatten().copied()).is_some())
    }

    /// The trainable tokens' values, when the model has any.
    pub(crate) fn token_values(&self) -> Option<Tensor<2>> {
        self.tokens.as_ref().map(|t| t.values.val())
    }

    /// Hidden states of every position after the last decoder layer, before the final norm.
    pub fn decode(&self, batch: &Batch) -> Tensor<3> {
        self.decode_checked(batch, None)
    }

    /// [`Self::decode`], with every f16 product flagged in `checks`.
    pub(crate) fn decode_checked(
        &self,
        batch: &Batch,
        checks: Option<&ProductChecks>,
    ) -> Tensor<3> {
        self.decode_layers(batch, self.model.layers.len(), checks).0
    }

    /// The hidden states after the first `layers` decoder layers, and the inputs they took.
    fn decode_layers(
        &self,
        batch: &Batch,
        layers: usize,
        checks: Option<&ProductChecks>,
    ) -> (Tensor<3>, LayerInputs) {
        let device = self.device();
        let inputs = LayerInputs::new(batch, self.head_dim(), self.rope_theta, &device);
        let mut x = self.embed(
            self.model.embed_tokens.weight.val(),
            self.token_values(),
            batch,
        );
        for (i, layer) in self.model.layers[..layers].iter().enumerate() {
            if let Some(c) = checks {
                c.at_layer(i);
            }
            x = layer.forward(x, &inputs, checks);
        }
        (x, inputs)
    }

    /// Final-norm hidden state at the last position (the answer slot): `[b, hidden]`. The last
    /// layer computes that position alone ([`DecoderLayer::forward_last`]).
    pub(crate) fn last_hidden(&self, batch: &Batch) -> Tensor<2> {
        let n = self.model.layers.len();
        let (x, inputs) = self.decode_layers(batch, n.saturating_sub(1), None);
        let x = match self.model.layers.last() {
            Some(last) => last.forward_last(x, &inputs),
            None => {
                let [b, s, h] = x.dims();
                x.narrow(1, s - 1, 1).reshape([b, h])
            }
        };
        self.model.norm.forward(x)
    }

    /// Logits of the given tokens only: `hidden [b, hidden]` × rows `token_ids` of the LM head →
    /// `[b, token_ids.len()]`. The full vocabulary is never multiplied.
    pub(crate) fn token_logits(&self, hidden: Tensor<2>, token_ids: &[u32]) -> Tensor<2> {
        hidden.matmul(self.lm_rows(token_ids).transpose())
    }

    /// Full-vocabulary f32 logits of the given hidden states (`[b, s, hidden]` → `[b, s,
    /// vocab]`), the product in the head's dtype.
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        let w = match self.head_tokens() {
            // The tied head with the trainable rows in place, in the head's dtype.
            Some(t) => {
                let w = self.lm_head_weight();
                let dtype = w.dtype();
                let all: Vec<u32> = (0..w.dims()[0] as u32).collect();
                t.replace_rows(in_f32(w), t.values.val(), &all).cast(dtype)
            }
            None => self.lm_head_weight(),
        };
        if hidden.dtype() == w.dtype() {
            hidden.matmul(w.transpose().unsqueeze())
        } else {
            let dtype = hidden.dtype();
            hidden
                .cast(w.dtype())
                .matmul(w.transpose().unsqueeze())
                .cast(dtype)
        }
    }

    /// Last-position logits of `token_ids` for every row: what scoring and training use.
    pub fn answer_logits(&self, batch: &Batch, token_ids: &[u32]) -> Tensor<2> {
        self.token_logits(self.last_hidden(batch), token_ids)
    }
}

/// Build a model with given weights drawn from `init` (used for `init = "random"` runs and tests).
/// Weights follow transformers' `_init_weights`: normal(0, `std`) for matrices, ones for norms.
pub fn init_random(config: &Qwen3Config, std: f64, device: &Device) -> Qwen3 {
    use burn::tensor::Distribution;
    let normal =
        |dims: [usize; 2]| Tensor::<2>::random(dims, Distribution::Normal(0.0, std), device);
    let ones = |n: usize| Tensor::<1>::ones([n], device);
    let proj = |d_in: usize, d_out: usize, bias: bool| {
        Proj::new(
            normal([d_in, d_out]),
            bias.then(|| Tensor::<1>::zeros([d_out], device)),
        )
    };
    let (h, d) = (config.hidden_size, config.head_dim);
    let q = config.num_attention_heads * d;
    let kv = config.num_key_value_heads * d;
    let eps = config.rms_norm_eps;
    let layers = (0..config.num_hidden_layers)
        .map(|_| DecoderLayer {
            input_layernorm: RmsNorm::new(ones(h), eps),
            self_attn: Attention {
                q_proj: proj(h, q, config.attention_bias),
                k_proj: proj(h, kv, config.attention_bias),
                v_proj: proj(h, kv, config.attention_bias),
                o_proj: proj(q, h, config.attention_bias),
                q_norm: RmsNorm::new(ones(d), eps),
                k_norm: RmsNorm::new(ones(d), eps),
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_key_value_heads,
                head_dim: d,
            },
            post_attention_layernorm: RmsNorm::new(ones(h), eps),
            mlp: Mlp {
                gate_proj: proj(h, config.intermediate_size, false),
                up_proj: proj(h, config.intermediate_size, false),
                down_proj: proj(config.intermediate_size, h, false),
            },
        })
        .collect();
    Qwen3 {
        model: Qwen3Model {
            embed_tokens: Embedding {
                weight: Param::from_tensor(normal([config.vocab_size, h])),
            },
            layers,
            norm: RmsNorm::new(ones(h), eps),
        },
        lm_head: (!config.tie_word_embeddings).then(|| LmHead {
            weight: Param::from_tensor(normal([config.vocab_size, h])),
        }),
        tokens: None,
        rope_theta: config.rope_theta,
    }
}

/// Attention scores per block of query rows on `device`: [`crate::recompute::SCORE_BLOCK`], or
/// fewer where the device's largest buffer holds fewer f32 values (llvmpipe's OpenGL: 32 Mi).
pub(crate) fn score_budget(device: &Device) -> usize {
    let limit = crate::model::backend::largest_buffer(&device.clone().inner())
        .map_or(usize::MAX, |bytes| (bytes / 4) as usize);
    crate::recompute::SCORE_BLOCK.min(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_ids_follow_the_mask() {
        let a: &[u32] = &[5, 6, 7];
        let b: &[u32] = &[9];
        let batch = Batch::left_padded(&[a, b], 0);
        assert_eq!(batch.input_ids, vec![vec![5, 6, 7], vec![0, 0, 9]]);
        assert_eq!(batch.attention_mask, vec![vec![1, 1, 1], vec![0, 0, 1]]);
        assert_eq!(batch.position_ids(), vec![vec![0, 1, 2], vec![0, 0, 0]]);
    }

    /// A GPU runs a batch at a multiple of 16 tokens, the CPU at its longest row's length; the
    /// padding in front of every row, the longest too, changes no row's answer logits.
    #[test]
    fn padding_every_row_further_changes_no_answer_logits() {
        assert_eq!(run_length(9, false), 9);
        assert_eq!(run_length(9, true), 16);
        assert_eq!(run_length(32, true), 32);
        assert_eq!(run_length(33, true), 48);
        let a: &[u32] = &[5, 6, 7];
        let cpu = Batch::left_padded_on(&[a], 0, &Device::flex());
        assert_eq!(cpu.seq_len(), 3);

        let config = crate::trainer_tests::tiny_config(16);
        let device = Device::flex();
        let _rng = crate::trainer_tests::device_rng();
        let model = init_random(&config, 0.5, &device);
        let a: &[u32] = &[3, 7, 1, 9, 4, 2, 11, 12, 1];
        let b: &[u32] = &[5, 8, 6, 2, 3];
        let logits = |batch: &Batch| {
            model
                .answer_logits(batch, &[1, 2, 3, 4])
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        let tight = logits(&Batch::left_padded(&[a, b], 0));
        for seq in [16, 23] {
            let padded = Batch::left_padded_to(&[a, b], 0, seq);
            assert_eq!(padded.seq_len(), seq);
            assert_eq!(padded.input_ids[0][seq - a.len()..], *a);
            let got = logits(&padded);
            let worst = tight
                .iter()
                .zip(&got)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            // the same sums over the same real tokens; masked positions add exact zeros
            assert!(worst < 1e-5, "padded to {seq}: logits moved by {worst}");
        }
    }

    /// The attention core in blocks of query rows (what keeps a GPU's attention within a
    /// buffer) gives the whole core's output, whatever the block: one row, rows that do not
    /// divide the sequence, or all of them; on an f16 base too, whose untaped core computes its
    /// products in f16 (within 2e-3 relative in L2 norm of the f32 core's output; measured
    /// 2.9e-4), or in f32 on a tape.
    #[test]
    fn attention_in_blocks_of_query_rows_equals_the_whole() {
        let config = crate::trainer_tests::tiny_config(16);
        let device = Device::flex();
        let _rng = crate::trainer_tests::device_rng();
        let model = init_random(&config, 0.5, &device);
        let half = crate::trainer_tests::cast_weights(model.clone(), FloatDType::F16);
        let a: &[u32] = &[3, 7, 1, 9, 4, 2, 11];
        let b: &[u32] = &[5, 8, 6];
        let batch = Batch::left_padded(&[a, b], 0);
        let inputs = LayerInputs::new(&batch, 8, 10000.0, &device);
        let x = Tensor::<3>::random(
            [2, 7, 16],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let (q, k, v) = model.model.layers[0].self_attn.qkv(x, &inputs, None);
        let run = |attn: &Attention, max_scores: usize| {
            let out = attn.core_in_blocks(
                q.clone(),
                k.clone(),
                v.clone(),
                inputs.mask.clone(),
                max_scores,
            );
            crate::trainer_tests::values(out)
        };
        let worst = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        };
        for model in [&model, &half] {
            let attn = &model.model.layers[0].self_attn;
            // b · heads · s = 56 scores per query row
            let whole = run(attn, usize::MAX);
            // f16 products: a result may round to the other side in another block's shape, by
            // an f16 step of the largest output (2^-10 of it)
            let top = whole.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let tol = if model.dtype() == DType::F16 {
                top * 2f32.powi(-10)
            } else {
                1e-6
            };
            for rows in [1, 2, 3, 6, 7] {
                let off = worst(&whole, &run(attn, 56 * rows));
                assert!(off <= tol, "{rows} rows per block: off by {off}");
            }
        }
        let want = run(&model.model.layers[0].self_attn, usize::MAX);
        let got = run(&half.model.layers[0].self_attn, usize::MAX);
        let rel = crate::trainer_tests::relative_l2(&got, &want);
        assert!(
            rel <= 2e-3 && rel > 0.0,
            "f16 products against f32: {rel:e}"
        );

        // On a tape, the f16 base's core computes in f32: Burn's attention (its taped form
        // rounds a few results an f32 step apart).
        let taped = half.model.layers[0].self_attn.core_in_blocks(
            q.clone().autodiff().require_grad(),
            k.clone().autodiff(),
            v.clone().autodiff(),
            inputs.mask.clone(),
            usize::MAX,
        );
        let off = worst(&crate::trainer_tests::values(taped.inner()), &want);
        assert!(off <= 1e-6, "taped: off by {off}");
    }

    /// `silu_mul_taped` gives Burn's `silu(gate) * up` to the bit, and the same gradients for
    /// gate and up (within 1e-6 of the largest: the derivative is summed in another order), at
    /// gates from -30 to 30, where the sigmoid saturates.
    #[test]
    fn swiglu_on_the_tape_keeps_burns_values_and_gradients() {
        use crate::trainer_tests::values;
        let device = Device::flex().autodiff();
        let _rng = crate::trainer_tests::device_rng();
        device.seed(31);
        let normal = |std| burn::tensor::Distribution::Normal(0.0, std);
        let gate = Tensor::<2>::random([6, 40], normal(3.0), &device).add(
            Tensor::<1>::from_floats([-30.0, -8.0, 0.0, 8.0, 30.0, 1.0], &device).reshape([6, 1]),
        );
        let up = Tensor::<2>::random([6, 40], normal(1.0), &device);
        let weights = Tensor::<2>::random([6, 40], normal(1.0), &device);
        let run = |taped: bool| {
            let (g, u) = (gate.clone().require_grad(), up.clone().require_grad());
            let act = if taped {
                silu_mul_taped(g.clone(), u.clone())
            } else {
                silu(g.clone()) * u.clone()
            };
            let value = values(act.clone().inner());
            let mut grads = (act * weights.clone()).sum().backward();
            let grad = |t: &Tensor<2>, grads: &mut _| values(t.grad_remove(grads).unwrap());
            (value, grad(&g, &mut grads), grad(&u, &mut grads))
        };
        let (want, taped) = (run(false), run(true));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&want.0), bits(&taped.0), "values");
        for (what, w, t) in [("gate", &want.1, &taped.1), ("up", &want.2, &taped.2)] {
            let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(scale > 0.0);
            let worst = w
                .iter()
                .zip(t)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst <= 1e-6 * scale, "{what}: off by {worst} of {scale}");
        }
    }
}
