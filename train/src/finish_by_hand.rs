//! The second half of a layer's replay (`finish`: the attention's output projection, the
//! residual, the post-attention norm, the MLP) and its backward written out in Burn operations,
//! for any backend: what a GPU's LoRA step replays in place of the half's tape.
//!
//! Through Burn's tape that half costs a launch for each operation its derived backward
//! records, and the tape's bookkeeping launches its own: a reduction over a dimension that is
//! already 1 in each norm's backward (Burn's `mean_dim` sums its gradient again), a tensor of
//! ones multiplied in, the adapters' scaling applied to each full-width gradient. With the base
//! frozen the half's backward is short enough to write down, as [`crate::replay`] does on the
//! CPU:
//!
//! - the frozen products `x·W`: `dx = dy·Wᵀ`, in the weights' dtype as the forward's
//!   cast–product–cast computes (`dx = c(c(dy)·Wᵀ)`, what Burn's tape derives from it);
//! - each adapter `s·(x·A)·B`: `dB = s·(x·A)ᵀ·dy`, `u = s·dy·Bᵀ`, `dA = xᵀ·u`, `dx += u·Aᵀ`,
//!   the scaling on the rank-wide tensors;
//! - the norm `w·x·r`, `r = 1/sqrt(mean(x²) + eps)`: `dx = r·(dy·w − x·r²·mean(dy·w·x))`, one
//!   reduction;
//! - SiLU·up: its two partial derivatives, as [`crate::model::qwen3::silu_mul_taped`] takes
//!   them.
//!
//! The forward skips `down_proj`'s frozen product: nothing reads the layer's output here. It
//! holds what the tape held (the adapters' inputs, the residual, the norm's input, the SwiGLU
//! operands and the two intermediate-sized gradients), so `[train] replay_piece_mib` and the
//! memory plan count it the same way. The gradients equal the taped half's up to float rounding
//! (tests in `recompute.rs`). On llvmpipe: 4 launches a layer fewer, and a step at hidden 512
//! 4 % shorter (docs/results.md, "The replay's second half by hand").

use burn::module::Param;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::activation::sigmoid;

use crate::model::qwen3::{DecoderLayer, Proj, RmsNorm, in_f32};

/// Whether `layer`'s second half can replay by hand: its four projections frozen and without
/// biases, and its post-attention norm frozen (LoRA, whatever the base's dtype).
pub(crate) fn applies(layer: &DecoderLayer) -> bool {
    let frozen = |p: &Param<Tensor<1>>| !p.val().is_require_grad();
    let (a, m) = (&layer.self_attn, &layer.mlp);
    frozen(&layer.post_attention_layernorm.weight)
        && [&a.o_proj, &m.gate_proj, &m.up_proj, &m.down_proj]
            .iter()
            .all(|p| p.bias.is_none() && !p.weight.val().is_require_grad())
}

/// One frozen projection and its adapter, as the half's replay reads them (off the tape).
struct Product<'a> {
    proj: &'a Proj,
    w: Tensor<2>,
}

impl<'a> Product<'a> {
    fn new(proj: &'a Proj) -> Self {
        Self {
            proj,
            w: proj.weight.val().inner(),
        }
    }

    /// `x·W` (`x` in f32), in the weights' dtype where it is another, the output in f32.
    fn base(&self, x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
        if x.dtype() == w.dtype() {
            x.matmul(w)
        } else {
            let dtype = x.dtype();
            x.cast(w.dtype()).matmul(w).cast(dtype)
        }
    }

    /// `x·A` when an adapter is attached: what its backward needs of the forward.
    fn adapter_input(&self, x: &Tensor<2>) -> Option<Tensor<2>> {
        self.proj.lora.as_ref().map(|ad| {
            let a = ad.lora_a.val().inner();
            x.clone().cast(a.dtype()).matmul(a)
        })
    }

    /// The output `x·W + s·(x·A)·B`, and `x·A`.
    fn forward(&self, x: &Tensor<2>) -> (Tensor<2>, Option<Tensor<2>>) {
        let y = self.base(x.clone(), self.w.clone());
        let xa = self.adapter_input(x);
        let y = match (&self.proj.lora, &xa) {
            (Some(ad), Some(xa)) => {
                let dtype = y.dtype();
                let delta = xa.clone().matmul(ad.lora_b.val().inner());
                y + delta.mul_scalar(ad.scaling).cast(dtype)
            }
            _ => y,
        };
        (y, xa)
    }

    /// The gradient of the input `x` given the output's `dy`; the adapter's gradients (those of
    /// its matrices that train) go into `grads`.
    fn backward(
        &self,
        x: Tensor<2>,
        xa: Option<Tensor<2>>,
        dy: Tensor<2>,
        grads: &mut GradientsParams,
    ) -> Tensor<2> {
        let dx = self.base(dy.clone(), self.w.clone().transpose());
        let (Some(ad), Some(xa)) = (&self.proj.lora, xa) else {
            return dx;
        };
        let (a, b) = (ad.lora_a.val(), ad.lora_b.val());
        let dy = dy.cast(b.dtype());
        if b.is_require_grad() {
            let db = xa.transpose().matmul(dy.clone()).mul_scalar(ad.scaling);
            grads.register(ad.lora_b.id, db);
        }
        let u = dy.matmul(b.inner().transpose()).mul_scalar(ad.scaling);
        if a.is_require_grad() {
            let x = x.cast(a.dtype());
            grads.register(ad.lora_a.id, x.transpose().matmul(u.clone()));
        }
        let dtype = dx.dtype();
        dx + u.matmul(a.inner().transpose()).cast(dtype)
    }
}

/// The norm's output `w·x·r` and `r` (`[rows, 1]`), `x` in f32.
fn norm_forward(norm: &RmsNorm, x: &Tensor<2>) -> (Tensor<2>, Tensor<2>) {
    let w = in_f32(norm.weight.val().inner()).unsqueeze::<2>();
    let r = (x.clone().square().mean_dim(1) + norm.eps).sqrt().recip();
    ((x.clone() * r.clone()) * w, r)
}

/// The gradient of the norm's input `x` given its output's `dy`:
/// `r·(dy·w − x·r²·mean(dy·w·x))`.
fn norm_backward(norm: &RmsNorm, x: Tensor<2>, r: Tensor<2>, dy: Tensor<2>) -> Tensor<2> {
    let w = in_f32(norm.weight.val().inner()).unsqueeze::<2>();
    let gw = dy * w;
    let m = (gw.clone() * x.clone()).mean_dim(1);
    (gw - x * (r.clone().square() * m)) * r
}

/// The gradients of `layer`'s second half's inputs, the residual `x` (`[b, s, hidden]`) and the
/// attention's `heads` (`[b, heads, s, d]`), given its output's gradient `g`, all off the tape;
/// the adapters' gradients go into `grads`. Returns `(d_heads, d_x)`.
pub(crate) fn finish_backward(
    layer: &DecoderLayer,
    x: Tensor<3>,
    heads: Tensor<4>,
    g: Tensor<3>,
    grads: &mut GradientsParams,
) -> (Tensor<4>, Tensor<3>) {
    let [b, s, hidden] = x.dims();
    let [_, h, _, d] = heads.dims();
    let rows = b * s;
    let (attn, mlp) = (&layer.self_attn, &layer.mlp);
    let norm = &layer.post_attention_layernorm;

    // The forward pass again, keeping what the backward reads.
    let heads = heads.swap_dims(1, 2).reshape([rows, h * d]);
    let o_p = Product::new(&attn.o_proj);
    let (o, o_xa) = o_p.forward(&heads);
    let x2 = x.reshape([rows, hidden]) + o;
    let (n2, r) = norm_forward(norm, &x2);
    let (gate_p, up_p) = (Product::new(&mlp.gate_proj), Product::new(&mlp.up_proj));
    let (gate, gate_xa) = gate_p.forward(&n2);
    let (up, up_xa) = up_p.forward(&n2);
    let act = gate.clone() * sigmoid(gate.clone()) * up.clone();
    let down_p = Product::new(&mlp.down_proj);
    let down_xa = down_p.adapter_input(&act);

    // Backward, from the output down.
    let g = g.reshape([rows, hidden]);
    let d_act = down_p.backward(act, down_xa, g.clone(), grads);
    // SiLU's sigmoid again rather than kept: one intermediate-sized tensor less alive
    let sig = sigmoid(gate.clone());
    let d_up = d_act.clone() * gate.clone() * sig.clone();
    let d_gate = d_act * up * sig.clone() * (gate * sig.neg().add_scalar(1.0)).add_scalar(1.0);
    let d_n2 =
        gate_p.backward(n2.clone(), gate_xa, d_gate, grads) + up_p.backward(n2, up_xa, d_up, grads);
    let g2 = norm_backward(norm, x2, r, d_n2) + g;
    let d_heads = o_p.backward(heads, o_xa, g2.clone(), grads);
    let d_heads = d_heads.reshape([b, s, h, d]).swap_dims(1, 2);
    (d_heads, g2.reshape([b, s, hidden]))
}
