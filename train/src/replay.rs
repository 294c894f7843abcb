//! Recompute's layer replay written out by hand: a LoRA run on the CPU, its base frozen.
//!
//! [`crate::recompute`] re-runs each layer on its stored input and back-propagates the output's
//! gradient into it. Through Burn's tape that replay runs at about half the untaped forward's
//! rate: every element-wise step is a single-threaded Burn operation with a derived backward,
//! every bf16 product converts both operands on one thread (and its backward copies `Wᵀ`), and
//! the tape keeps the whole graph. Where nothing but the adapters (and token rows, outside the
//! layers) trains, a layer's backward is short enough to write down:
//!
//! - the frozen products `x·W`: `dx = dy·Wᵀ`, read through a transposed view, no copy; with a bf16
//!   base rounded where Burn's cast-matmul-cast rounds (`dx = r(r(dy)·Wᵀ)`), by AVX512_BF16's
//!   dot products on a CPU that has them ([`cpu_ops::Bf16Weight`]);
//! - each adapter `s·(x·A)·B`: `dB = s·(x·A)ᵀ·dy`, `u = s·dy·Bᵀ`, `dA = xᵀ·u`, `dx += u·Aᵀ`;
//! - RMSNorm, the heads' RMSNorm and rotation, SiLU·up: fused kernels in [`cpu_ops`];
//! - the attention core: [`flash`]'s tiles, as on the taped path.
//!
//! The replay's forward skips `down_proj`'s frozen product, since nothing reads the layer's
//! output, and the attention core where the step's first pass kept its output and row sums (as
//! it does unless the memory plan finds no room for them).
//! Gradients equal the taped replay's up to float rounding (tests in `recompute.rs`, in f32 and
//! on a bf16 base). Anything else (full fine-tuning, trained norms, biases, an f16 base, another
//! backend) keeps the taped replay.

use burn::module::Param;
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor};

use crate::model::cpu_ops;
use crate::model::flash;
use crate::model::qwen3::{DecoderLayer, LayerInputs, Proj, Qwen3};

/// Whether every layer of `model` can replay by hand: on the CPU, with the base's weights and
/// norms frozen, no biases, and an f32 or bf16 base.
pub(crate) fn applies(model: &Qwen3) -> bool {
    let frozen = |p: &Param<Tensor<1>>| !p.val().is_require_grad();
    cpu_ops::is_plain_cpu(&model.device().inner())
        && model.model.layers.iter().all(|layer| {
            frozen(&layer.input_layernorm.weight)
                && frozen(&layer.post_attention_layernorm.weight)
                && frozen(&layer.self_attn.q_norm.weight)
                && frozen(&layer.self_attn.k_norm.weight)
                && layer.projections().iter().all(|(_, p)| {
                    let w = p.weight.val();
                    p.bias.is_none()
                        && !w.is_require_grad()
                        && matches!(w.dtype(), DType::F32 | DType::BF16)
                })
        })
}

/// One frozen projection with its adapter, its weight made ready for this layer's replay.
struct Product<'a> {
    proj: &'a Proj,
    w: Frozen,
}

/// A frozen weight as the replay's products read it.
enum Frozen {
    F32(Tensor<2>),
    /// Ready for `x·W` and `dy·Wᵀ`.
    Bf16(cpu_ops::Bf16Weight),
}

impl<'a> Product<'a> {
    fn new(proj: &'a Proj) -> Self {
        let w = proj.weight.val().inner();
        let w = if w.dtype() == DType::BF16 {
            Frozen::Bf16(cpu_ops::Bf16Weight::new(w, true))
        } else {
            Frozen::F32(cpu_ops::widen(w))
        };
        Self { proj, w }
    }

    /// `x·A` when an adapter is attached: what its backward needs of the forward.
    fn adapter_input(&self, x: &Tensor<2>) -> Option<Tensor<2>> {
        self.proj
            .lora
            .as_ref()
            .map(|ad| x.clone().matmul(ad.lora_a.val().inner()))
    }

    /// The output `x·W + s·(x·A)·B`, and `x·A`.
    fn forward(&self, x: &Tensor<2>) -> (Tensor<2>, Option<Tensor<2>>) {
        let base = match &self.w {
            Frozen::Bf16(w) => w.product(x.clone()),
            Frozen::F32(w) => x.clone().matmul(w.clone()),
        };
        let xa = self.adapter_input(x);
        let y = match (&self.proj.lora, &xa) {
            (Some(ad), Some(xa)) => {
                cpu_ops::add_product(base, xa.clone(), ad.lora_b.val().inner(), ad.scaling)
            }
            _ => base,
        };
        (y, xa)
    }

    /// The gradient of the input `x` given the output's `dy`; the adapter's gradients (those of
    /// its matrices that train) go into `grads`.
    fn backward(
        &self,
        x: &Tensor<2>,
        xa: Option<Tensor<2>>,
        dy: Tensor<2>,
        grads: &mut GradientsParams,
    ) -> Tensor<2> {
        let dx = match &self.w {
            Frozen::Bf16(w) => w.product_transposed(dy.clone()),
            Frozen::F32(w) => dy.clone().matmul(w.clone().transpose()),
        };
        let (Some(ad), Some(xa)) = (&self.proj.lora, xa) else {
            return dx;
        };
        let (a, b) = (ad.lora_a.val(), ad.lora_b.val());
        if b.is_require_grad() {
            let db = xa.transpose().matmul(dy.clone()).mul_scalar(ad.scaling);
            grads.register(ad.lora_b.id, db);
        }
        let u = dy.matmul(b.inner().transpose()).mul_scalar(ad.scaling);
        if a.is_require_grad() {
            grads.register(ad.lora_a.id, x.clone().transpose().matmul(u.clone()));
        }
        cpu_ops::add_product(dx, u, a.inner().transpose(), 1.0)
    }
}

/// The gradient of `layer`'s input `x` (`[b, s, hidden]`, plain CPU) given its output's gradient
/// `g`; the adapters' gradients go into `grads`. `attention`, where the step's first pass kept
/// it, is what [`flash::forward`] gave for this layer there (the same `q`, `k`, `v`: the same
/// kernels on the same input, so the same bits as computing it here); `mask` is the step's
/// tiles' mask.
pub(crate) fn layer_backward(
    layer: &DecoderLayer,
    x: Tensor<3>,
    attention: Option<(Tensor<4>, flash::Saved)>,
    inputs: &LayerInputs,
    mask: &flash::Mask,
    g: Tensor<3>,
    grads: &mut GradientsParams,
) -> Tensor<3> {
    let [b, s, hidden] = x.dims();
    let rows = b * s;
    let attn = &layer.self_attn;
    let (h, kvh, d) = (attn.num_heads, attn.num_kv_heads, attn.head_dim);
    let scale = attn.scale() as f32;
    let norm = |n: &crate::model::qwen3::RmsNorm| (n.weight.val().inner(), n.eps);
    let rope = (&inputs.cos, &inputs.sin);
    let [q_p, k_p, v_p, o_p, gate_p, up_p, down_p] = layer.projections().map(|(_, p)| p);

    // The forward pass again, keeping what the backward reads.
    let x = x.reshape([rows, hidden]);
    let (w_in, eps_in) = norm(&layer.input_layernorm);
    let n1 = cpu_ops::rms_norm(x.clone(), w_in.clone(), eps_in);
    let (q_p, k_p, v_p) = (Product::new(q_p), Product::new(k_p), Product::new(v_p));
    let (q_raw, q_xa) = q_p.forward(&n1);
    let (k_raw, k_xa) = k_p.forward(&n1);
    let (v, v_xa) = v_p.forward(&n1);
    let (qn, qn_eps) = norm(&attn.q_norm);
    let (kn, kn_eps) = norm(&attn.k_norm);
    let q_raw = q_raw.reshape([b, s, h * d]);
    let k_raw = k_raw.reshape([b, s, kvh * d]);
    let q = cpu_ops::norm_rope_heads(q_raw.clone(), h, qn.clone(), qn_eps, rope.0, rope.1);
    let k = cpu_ops::norm_rope_heads(k_raw.clone(), kvh, kn.clone(), kn_eps, rope.0, rope.1);
    let v = v.reshape([b, s, kvh, d]).swap_dims(1, 2);
    let (out, saved) = attention.unwrap_or_else(|| flash::forward(&q, &k, &v, mask, scale));
    let heads = out.clone().swap_dims(1, 2).reshape([rows, h * d]);
    let o_p = Product::new(o_p);
    let (o, o_xa) = o_p.forward(&heads);
    let x2 = x.clone() + o;
    let (w_post, eps_post) = norm(&layer.post_attention_layernorm);
    let n2 = cpu_ops::rms_norm(x2.clone(), w_post.clone(), eps_post);
    let (gate_p, up_p) = (Product::new(gate_p), Product::new(up_p));
    let (gate, gate_xa) = gate_p.forward(&n2);
    let (up, up_xa) = up_p.forward(&n2);
    let act = cpu_ops::silu_mul(gate.clone(), up.clone());
    let down_p = Product::new(down_p);
    let down_xa = down_p.adapter_input(&act);

    // Backward, from the output down.
    let g = g.reshape([rows, hidden]);
    let d_act = down_p.backward(&act, down_xa, g.clone(), grads);
    drop(act);
    let (d_gate, d_up) = cpu_ops::silu_mul_backward(gate, up, d_act);
    let d_n2 =
        gate_p.backward(&n2, gate_xa, d_gate, grads) + up_p.backward(&n2, up_xa, d_up, grads);
    drop(n2);
    let g2 = cpu_ops::rms_norm_backward(x2, w_post, eps_post, d_n2, g);
    let d_heads = o_p.backward(&heads, o_xa, g2.clone(), grads);
    drop(heads);
    let d_out = d_heads.reshape([b, s, h, d]).swap_dims(1, 2);
    let (dq, dk, dv) = flash::backward(&q, &k, &v, &out, &saved, &d_out, mask, scale);
    drop((q, k, v, out, saved, d_out));
    let dq = cpu_ops::norm_rope_heads_backward(q_raw, h, qn, qn_eps, rope, dq);
    let dk = cpu_ops::norm_rope_heads_backward(k_raw, kvh, kn, kn_eps, rope, dk);
    let dv = dv.swap_dims(1, 2).reshape([rows, kvh * d]);
    let d_n1 = q_p.backward(&n1, q_xa, dq.reshape([rows, h * d]), grads)
        + k_p.backward(&n1, k_xa, dk.reshape([rows, kvh * d]), grads)
        + v_p.backward(&n1, v_xa, dv, grads);
    cpu_ops::rms_norm_backward(x, w_in, eps_in, d_n1, g2).reshape([b, s, hidden])
}
