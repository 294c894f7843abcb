//! The CPU's fused kernels: the element-wise work of a layer, forward and backward, shared over
//! rayon's threads (RMSNorm; the query/key heads' RMSNorm and rotation, with the move to
//! head-major order; SiLU(gate)·up), and the products around them (a bf16 weight's product with
//! its conversions on every thread; an adapter's low-rank term added inside its product).
//!
//! Burn's `flex` backend runs each element-wise operation as its own pass over the tensor into a
//! fresh buffer, on one thread: RMSNorm alone is five passes (square, mean, add, sqrt, divide)
//! and a multiply, the rotation six. These kernels read their input once and write their output
//! once. The forward halves run where no tape is kept (`decision score`, evaluation, and the
//! first pass of a recomputed training step); the backward halves serve the layer replay that
//! the trainer writes out by hand for a LoRA run on the CPU. A taped pass keeps Burn's
//! operations, whose backward Burn derives. Each kernel gives the generic path's values (its
//! gradients: Burn's taped ones) to f32 rounding (tests below, at a tiny and at the 0.6B shape).

use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use crate::model::bf16_gemm;
use crate::model::qwen3::in_f32;

/// Rows per rayon task: enough work to amortise scheduling at the hidden sizes of Qwen3.
const ROWS_PER_TASK: usize = 16;

/// Whether `t` is on the plain CPU device (no tape): where these kernels run.
pub(crate) fn on_plain_cpu<const D: usize>(t: &Tensor<D>) -> bool {
    is_plain_cpu(&t.device())
}

/// Whether `device` is the CPU without autodiff (`Device`'s equality ignores autodiff).
pub(crate) fn is_plain_cpu(device: &Device) -> bool {
    *device == Device::flex() && !device.is_autodiff()
}

/// `t`'s values in f32, row-major (no copy when `t` is f32, contiguous and not shared).
fn host<const D: usize>(t: Tensor<D>) -> TensorData {
    in_f32(t).into_data()
}

fn f32s(data: &TensorData) -> &[f32] {
    data.as_slice::<f32>().expect("f32 values")
}

fn tensor<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
    Tensor::<D>::from_data(TensorData::new(v, shape), (&Device::flex(), DType::F32))
}

/// `1 / sqrt(mean(x²) + eps)` of one row, summed in eight lanes (which the compiler vectorises).
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    let sum = lanes.iter().sum::<f32>() + tail;
    1.0 / (sum / x.len() as f32 + eps).sqrt()
}

/// Qwen3's RMSNorm over the last axis, `w · x / sqrt(mean(x²) + eps)`, in f32.
pub(crate) fn rms_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
    let dims = x.dims();
    let n = dims[D - 1];
    let (x, w) = (host(x), host(weight));
    let (xs, w) = (f32s(&x), f32s(&w));
    let mut out = vec![0f32; xs.len()];
    out.par_chunks_mut(n * ROWS_PER_TASK)
        .zip(xs.par_chunks(n * ROWS_PER_TASK))
        .for_each(|(out, xs)| {
            for (o, x) in out.chunks_exact_mut(n).zip(xs.chunks_exact(n)) {
                let r = inv_rms(x, eps as f32);
                for ((o, x), w) in o.iter_mut().zip(x).zip(w) {
                    *o = x * r * w;
                }
            }
        });
    tensor(out, dims)
}

/// Queries or keys from their projection `x` (`[b, s, heads · d]`): each head's RMSNorm
/// (`weight`, `[d]`), then the rotation by `cos` and `sin` (`[b, 1, s, d]`, Qwen's rotate-half
/// convention), written head-major: `[b, heads, s, d]`.
pub(crate) fn norm_rope_heads(
    x: Tensor<3>,
    heads: usize,
    weight: Tensor<1>,
    eps: f64,
    cos: &Tensor<4>,
    sin: &Tensor<4>,
) -> Tensor<4> {
    let [b, s, hd] = x.dims();
    let d = hd / heads;
    let half = d / 2;
    let (x, w) = (host(x), host(weight));
    let (cos, sin) = (host(cos.clone()), host(sin.clone()));
    let (xs, w, cos, sin) = (f32s(&x), f32s(&w), f32s(&cos), f32s(&sin));
    let mut out = vec![0f32; xs.len()];
    out.par_chunks_mut(s * d).enumerate().for_each_init(
        || vec![0f32; d],
        |y, (bh, out)| {
            let (bi, hi) = (bh / heads, bh % heads);
            for (si, o) in out.chunks_exact_mut(d).enumerate() {
                let row = (bi * s + si) * hd + hi * d;
                let x = &xs[row..row + d];
                let r = inv_rms(x, eps as f32);
                for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
                    *y = x * r * w;
                }
                let at = (bi * s + si) * d;
                let (c, sn) = (&cos[at..at + d], &sin[at..at + d]);
                for i in 0..half {
                    o[i] = y[i] * c[i] - y[i + half] * sn[i];
                    o[i + half] = y[i + half] * c[i + half] + y[i] * sn[i + half];
                }
            }
        },
    );
    tensor(out, [b, heads, s, d])
}

/// `silu(gate) · up`, `silu(g) = g / (1 + e^−g)`, written over `gate`'s buffer when it is not
/// shared.
pub(crate) fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    let dims = gate.dims();
    let mut g = host(gate);
    let up = host(up);
    let u = f32s(&up);
    let gs = g.as_mut_slice::<f32>().expect("f32 values");
    gs.par_chunks_mut(4096)
        .zip(u.par_chunks(4096))
        .for_each(|(g, u)| {
            for (g, u) in g.iter_mut().zip(u) {
                *g = *g / (1.0 + exp(-*g)) * u;
            }
        });
    Tensor::<D>::from_data(g, (&Device::flex(), DType::F32)).reshape(dims)
}

/// `t`'s values rounded to the nearest bf16 (ties to even) and kept in f32: what a cast to bf16
/// and back gives, in place when `t` is not shared.
pub(crate) fn round_bf16<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let dims = t.dims();
    let mut data = host(t);
    data.as_mut_slice::<f32>()
        .expect("f32 values")
        .par_chunks_mut(4096)
        .for_each(|c| {
            for x in c {
                *x = half::bf16::from_f32(*x).to_f32();
            }
        });
    Tensor::<D>::from_data(data, (&Device::flex(), DType::F32)).reshape(dims)
}

/// A weight's values in f32: a bf16 one converted over rayon's threads (flex converts both
/// operands of every bf16 product on one thread), any other dtype as Burn casts it.
pub(crate) fn widen(w: Tensor<2>) -> Tensor<2> {
    if w.dtype() != DType::BF16 {
        return in_f32(w);
    }
    let dims = w.dims();
    let data = w.into_data();
    let half = data.as_slice::<half::bf16>().expect("bf16 values");
    let mut out = vec![0f32; half.len()];
    out.par_chunks_mut(4096)
        .zip(half.par_chunks(4096))
        .for_each(|(o, h)| {
            for (o, h) in o.iter_mut().zip(h) {
                *o = h.to_f32();
            }
        });
    tensor(out, dims)
}

/// A frozen bf16 weight `W` (`[k, n]`) made ready for products with f32 activations on the CPU:
/// `x·W`, and `dy·Wᵀ` when asked for. Either way `x` is rounded to bf16, the products summed in
/// f32 and the output rounded to bf16, as a product in bf16 gives.
pub(crate) enum Bf16Weight {
    /// Packed for AVX512_BF16's dot products (`bf16_gemm`), where the CPU has them: `W`, and
    /// `Wᵀ` when asked for. The sums' order is not flex's, so the values differ from its by f32
    /// roundings (tests below).
    #[cfg(target_arch = "x86_64")]
    Packed {
        w: bf16_gemm::Packed,
        wt: Option<bf16_gemm::Packed>,
    },
    /// Widened to f32 ([`widen`]) for an f32 product: the values flex's bf16 product gives (its
    /// gemm is the same f32 one), with the conversions on every thread instead of one.
    Widened(Tensor<2>),
}

impl Bf16Weight {
    /// `w` (bf16) ready for `x·W`, and for `dy·Wᵀ` too with `transposed`.
    pub(crate) fn new(w: Tensor<2>, transposed: bool) -> Self {
        assert_eq!(w.dtype(), DType::BF16, "a bf16 weight");
        #[cfg(target_arch = "x86_64")]
        if native_bf16() {
            let [k, n] = w.dims();
            let data = w.into_data();
            let v = data.as_slice::<half::bf16>().expect("bf16 values");
            return Self::Packed {
                w: bf16_gemm::Packed::new(v, (k, n), false),
                wt: transposed.then(|| bf16_gemm::Packed::new(v, (n, k), true)),
            };
        }
        let _ = transposed;
        Self::Widened(widen(w))
    }

    /// `x·W`.
    pub(crate) fn product(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Packed { w, .. } => packed_product(x, w),
            Self::Widened(w) => round_bf16(round_bf16(x).matmul(w.clone())),
        }
    }

    /// `dy·Wᵀ`; `self` made with `transposed`.
    pub(crate) fn product_transposed(&self, dy: Tensor<2>) -> Tensor<2> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Packed { wt, .. } => packed_product(
                dy,
                wt.as_ref().expect("a bf16 weight packed for its transpose"),
            ),
            Self::Widened(w) => round_bf16(round_bf16(dy).matmul(w.clone().transpose())),
        }
    }
}

/// Whether bf16 products run on AVX512_BF16: where the CPU has it, unless
/// `DECISION_BF16_PRODUCT=widened` asks for the f32 product (for comparisons).
#[cfg(target_arch = "x86_64")]
pub(crate) fn native_bf16() -> bool {
    static NATIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NATIVE.get_or_init(|| {
        bf16_gemm::available()
            && std::env::var("DECISION_BF16_PRODUCT").map_or(true, |v| v != "widened")
    })
}

#[cfg(target_arch = "x86_64")]
fn packed_product(x: Tensor<2>, w: &bf16_gemm::Packed) -> Tensor<2> {
    let [m, _] = x.dims();
    let n = w.columns();
    let x = host(x);
    let mut out = vec![0f32; m * n];
    bf16_gemm::product(f32s(&x), m, w, &mut out, true);
    tensor(out, [m, n])
}

/// `y + scale·a·b` for `a` `[m, k]` and `b` `[k, n]`, written over `y`'s buffer when it is not
/// shared: an adapter's low-rank term added by the product that computes it, instead of Burn's
/// scale and add, two more passes over `y` on one thread. `a` and `b` are the small factors.
pub(crate) fn add_product(y: Tensor<2>, a: Tensor<2>, b: Tensor<2>, scale: f64) -> Tensor<2> {
    let [m, n] = y.dims();
    let k = a.dims()[1];
    assert_eq!((a.dims()[0], b.dims()), (m, [k, n]), "add_product: shapes");
    let mut out = host(y);
    let (a, b) = (host(a), host(b));
    let c = out.as_mut_slice::<f32>().expect("f32 values");
    gemm(
        (m, n, k),
        (f32s(&a), (k, 1)),
        (f32s(&b), (n, 1)),
        c,
        true,
        scale as f32,
        true,
    );
    Tensor::<2>::from_data(out, (&Device::flex(), DType::F32))
}

/// `c = scale·a·b`, or `c += scale·a·b` with `accumulate`, for an `m × k` `a` and a `k × n` `b`,
/// each addressed by `(row stride, column stride)` from the start of its slice, `c` row-major
/// `m × n`; over rayon's threads with `parallel`, else on this one.
pub(crate) fn gemm(
    (m, n, k): (usize, usize, usize),
    (a, (a_rs, a_cs)): (&[f32], (usize, usize)),
    (b, (b_rs, b_cs)): (&[f32], (usize, usize)),
    c: &mut [f32],
    accumulate: bool,
    scale: f32,
    parallel: bool,
) {
    let last = |rs: usize, cs: usize, rows: usize, cols: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(m > 0 && n > 0 && k > 0);
    assert!(last(a_rs, a_cs, m, k) < a.len(), "lhs out of bounds");
    assert!(last(b_rs, b_cs, k, n) < b.len(), "rhs out of bounds");
    assert!(m * n <= c.len(), "output out of bounds");
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: every element addressed is in bounds (asserted above), and `c` does not alias
    // `a` or `b` (a `&mut` next to two `&`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The gradient of [`rms_norm`]'s input `x` given its output's gradient `dy` (the weight frozen):
/// with `r = 1/sqrt(mean(x²) + eps)`, `dx = r·(w⊙dy − x·r²·mean(x⊙w⊙dy))`; `plus` added to it.
pub(crate) fn rms_norm_backward<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<1>,
    eps: f64,
    dy: Tensor<D>,
    plus: Tensor<D>,
) -> Tensor<D> {
    let dims = x.dims();
    let n = dims[D - 1];
    let (x, w, dy) = (host(x), host(weight), host(dy));
    let (xs, w, dys) = (f32s(&x), f32s(&w), f32s(&dy));
    let mut out = host(plus);
    out.as_mut_slice::<f32>()
        .expect("f32 values")
        .par_chunks_mut(n * ROWS_PER_TASK)
        .zip(xs.par_chunks(n * ROWS_PER_TASK))
        .zip(dys.par_chunks(n * ROWS_PER_TASK))
        .for_each(|((out, xs), dys)| {
            for ((o, x), dy) in out
                .chunks_exact_mut(n)
                .zip(xs.chunks_exact(n))
                .zip(dys.chunks_exact(n))
            {
                rms_row_backward(x, w, dy, eps as f32, o);
            }
        });
    Tensor::<D>::from_data(out, (&Device::flex(), DType::F32)).reshape(dims)
}

/// One row of RMSNorm's backward, `dx` added into `out`.
#[inline]
fn rms_row_backward(x: &[f32], w: &[f32], dy: &[f32], eps: f32, out: &mut [f32]) {
    let r = inv_rms(x, eps);
    let mut lanes = [0f32; 8];
    let mut tail = 0f32;
    let (xc, wc, dc) = (x.chunks_exact(8), w.chunks_exact(8), dy.chunks_exact(8));
    for ((x, w), dy) in xc
        .remainder()
        .iter()
        .zip(wc.remainder())
        .zip(dc.remainder())
    {
        tail += x * w * dy;
    }
    for ((x, w), dy) in xc.zip(wc).zip(dc) {
        for (((l, x), w), dy) in lanes.iter_mut().zip(x).zip(w).zip(dy) {
            *l += x * w * dy;
        }
    }
    let dot = lanes.iter().sum::<f32>() + tail;
    let c = r * r * dot / x.len() as f32;
    for (((o, x), w), dy) in out.iter_mut().zip(x).zip(w).zip(dy) {
        *o += r * (w * dy - x * c);
    }
}

/// The gradient of [`norm_rope_heads`]' input `x` (`[b, s, heads · d]`) given its output's
/// gradient `dy` (`[b, heads, s, d]`): the rotation undone (its transpose is the rotation by the
/// opposite angle), then each head's RMSNorm backward (the weight frozen).
pub(crate) fn norm_rope_heads_backward(
    x: Tensor<3>,
    heads: usize,
    weight: Tensor<1>,
    eps: f64,
    (cos, sin): (&Tensor<4>, &Tensor<4>),
    dy: Tensor<4>,
) -> Tensor<3> {
    let [b, s, hd] = x.dims();
    let d = hd / heads;
    let half = d / 2;
    let (x, w, dy) = (host(x), host(weight), host(dy));
    let (cos, sin) = (host(cos.clone()), host(sin.clone()));
    let (xs, w, dys, cos, sin) = (f32s(&x), f32s(&w), f32s(&dy), f32s(&cos), f32s(&sin));
    let mut out = vec![0f32; xs.len()];
    // One task per token: it owns that token's row of every head.
    out.par_chunks_mut(hd).enumerate().for_each_init(
        || vec![0f32; d],
        |dn, (row, out)| {
            let (bi, si) = (row / s, row % s);
            let at = row * d;
            let (c, sn) = (&cos[at..at + d], &sin[at..at + d]);
            for hi in 0..heads {
                let g = &dys[((bi * heads + hi) * s + si) * d..][..d];
                for i in 0..half {
                    dn[i] = g[i] * c[i] + g[i + half] * sn[i + half];
                    dn[i + half] = g[i + half] * c[i + half] - g[i] * sn[i];
                }
                let x = &xs[row * hd + hi * d..][..d];
                rms_row_backward(x, w, dn, eps as f32, &mut out[hi * d..(hi + 1) * d]);
            }
        },
    );
    tensor(out, [b, s, hd])
}

/// The gradients `(d gate, d up)` of [`silu_mul`] given its output's gradient `da`: with
/// `σ = 1/(1 + e^−g)`, `d up = da·g·σ` and `d gate = da·up·σ·(1 + g·(1 − σ))`.
pub(crate) fn silu_mul_backward<const D: usize>(
    gate: Tensor<D>,
    up: Tensor<D>,
    da: Tensor<D>,
) -> (Tensor<D>, Tensor<D>) {
    let dims = gate.dims();
    let (gate, up) = (host(gate), host(up));
    let (g, u) = (f32s(&gate), f32s(&up));
    // d gate over da's buffer, d up in a new one.
    let mut dg = host(da);
    let mut du = vec![0f32; g.len()];
    dg.as_mut_slice::<f32>()
        .expect("f32 values")
        .par_chunks_mut(4096)
        .zip(du.par_chunks_mut(4096))
        .zip(g.par_chunks(4096).zip(u.par_chunks(4096)))
        .for_each(|((dg, du), (g, u))| {
            for (((dg, du), g), u) in dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u) {
                let sig = 1.0 / (1.0 + exp(-*g));
                let da = *dg;
                *du = da * g * sig;
                *dg = da * u * sig * (1.0 + g * (1.0 - sig));
            }
        });
    (
        Tensor::<D>::from_data(dg, (&Device::flex(), DType::F32)).reshape(dims),
        tensor(du, dims),
    )
}

/// `eʸ` in f32 for `y` clamped to `[−87, 88]` (an f32's normal range), without a libm call, so
/// loops over it vectorise: `y = n·ln 2 + r` with `n` the nearest integer to `y / ln 2` and
/// `ln 2` in two parts (Cody and Waite), so `r` on `[−½ ln 2, ½ ln 2]` is exact to f32, then `eʳ`
/// by its Taylor series to degree 7 (truncation under 6e-9) times `2ⁿ` built in the exponent
/// bits. Relative error within a few f32 roundings.
#[inline(always)]
pub(crate) fn exp(y: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let y = y.clamp(-87.0, 88.0);
    let t = y * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // `n` is also `t`'s low mantissa bits: integer arithmetic on them, where `n as i32` would
    // be a saturating conversion that keeps the loop scalar; `n + 127` is within [1, 254].
    let biased = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, FloatDType, Tensor};

    use super::*;
    use crate::model::qwen3::{RmsNorm, rope, signed_sin};

    fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<D> {
        burn::tensor::Device::flex().seed(seed);
        Tensor::<D>::random(shape, Distribution::Normal(0.0, 1.5), &Device::flex())
    }

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_into_vec::<f32>().unwrap()
    }

    /// Every element within `tol` of the generic path's, relative to the tensor's largest.
    fn assert_close<const D: usize>(what: &str, got: Tensor<D>, want: Tensor<D>, tol: f32) {
        assert_eq!(got.dims(), want.dims(), "{what}: shape");
        let (got, want) = (values(got), values(want));
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "{what}: a zero tensor proves nothing");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale,
                "{what}: element {i}: {g} against {w} (scale {scale})"
            );
        }
    }

    /// Tiny and 0.6B shapes: `(b, s, hidden, heads, head_dim, intermediate)`.
    const SHAPES: [(usize, usize, usize, usize, usize, usize); 2] =
        [(2, 7, 16, 4, 8, 24), (2, 1030, 1024, 16, 128, 3072)];

    #[test]
    fn rms_norm_matches_the_generic_path() {
        for (i, &(b, s, hidden, ..)) in SHAPES.iter().enumerate() {
            let x = random([b, s, hidden], 1 + i as u64);
            let norm = RmsNorm::new(random([hidden], 11 + i as u64), 1e-6);
            let want = norm.forward_generic(x.clone());
            // on a tape the generic path multiplies in another order (`RmsNorm::forward_generic`)
            let ad = Device::flex().autodiff();
            let tracked = Tensor::<3>::from_data(x.to_data(), &ad).require_grad();
            let taped = RmsNorm::new(Tensor::from_data(norm.weight.val().to_data(), &ad), 1e-6)
                .forward_generic(tracked);
            let taped = Tensor::<3>::from_data(taped.into_data(), &Device::flex());
            let got = rms_norm(x, norm.weight.val(), norm.eps);
            assert_close("rms_norm (taped order)", got.clone(), taped, 1e-6);
            assert_close("rms_norm", got, want, 1e-6);
        }
    }

    #[test]
    fn norm_rope_heads_matches_the_generic_path() {
        for (i, &(b, s, _, heads, d, _)) in SHAPES.iter().enumerate() {
            let x = random([b, s, heads * d], 21 + i as u64);
            let norm = RmsNorm::new(random([d], 31 + i as u64), 1e-6);
            let angles = random([b, 1, s, d], 41 + i as u64).mul_scalar(3.0);
            let (cos, sin) = (angles.clone().cos(), angles.sin());
            let want = rope(
                norm.forward_generic(x.clone().reshape([b, s, heads, d]))
                    .swap_dims(1, 2),
                &cos,
                &signed_sin(&sin),
            );
            let got = norm_rope_heads(x, heads, norm.weight.val(), norm.eps, &cos, &sin);
            assert_close("norm_rope_heads", got, want, 1e-6);
        }
    }

    #[test]
    fn silu_mul_matches_the_generic_path() {
        for (i, &(b, s, _, _, _, inter)) in SHAPES.iter().enumerate() {
            // Wide enough to reach both of exp's clamps.
            let gate = random([b, s, inter], 51 + i as u64).mul_scalar(40.0);
            let up = random([b, s, inter], 61 + i as u64);
            let want = burn::tensor::activation::silu(gate.clone()) * up.clone();
            // A shared gate is left as it was.
            let kept = values(gate.clone());
            let got = silu_mul(gate.clone(), up);
            assert_eq!(values(gate), kept, "the shared input is not written");
            assert_close("silu_mul", got, want, 1e-6);
        }
    }

    /// `x`'s gradient through `f` (Burn's operations, taped) for the output gradient `dy`.
    fn taped_grad<const D: usize, const E: usize>(
        x: Tensor<D>,
        dy: Tensor<E>,
        f: impl FnOnce(Tensor<D>) -> Tensor<E>,
    ) -> Tensor<D> {
        let ad = Device::flex().autodiff();
        let x = Tensor::<D>::from_data(x.into_data(), &ad).require_grad();
        let y = f(x.clone());
        let dy = Tensor::<E>::from_data(dy.into_data(), &ad);
        let grads = (y * dy).sum().backward();
        x.grad(&grads).expect("x feeds the output")
    }

    #[test]
    fn rms_norm_backward_matches_the_taped_gradient() {
        for (i, &(b, s, hidden, ..)) in SHAPES.iter().enumerate() {
            let x = random([b, s, hidden], 71 + i as u64);
            let dy = random([b, s, hidden], 72 + i as u64);
            let plus = random([b, s, hidden], 73 + i as u64);
            let norm = RmsNorm::new(random([hidden], 74 + i as u64), 1e-6);
            let w = norm.weight.val();
            let want = taped_grad(x.clone(), dy.clone(), |x| {
                RmsNorm::new(Tensor::from_data(w.to_data(), &x.device()), 1e-6).forward_generic(x)
            }) + plus.clone();
            let got = rms_norm_backward(x, w, norm.eps, dy, plus);
            assert_close("rms_norm_backward", got, want, 1e-5);
        }
    }

    #[test]
    fn norm_rope_heads_backward_matches_the_taped_gradient() {
        for (i, &(b, s, _, heads, d, _)) in SHAPES.iter().enumerate() {
            let x = random([b, s, heads * d], 81 + i as u64);
            let dy = random([b, heads, s, d], 82 + i as u64);
            let w = random([d], 83 + i as u64);
            let angles = random([b, 1, s, d], 84 + i as u64).mul_scalar(3.0);
            let (cos, sin) = (angles.clone().cos(), angles.sin());
            let want = taped_grad(x.clone(), dy.clone(), |x| {
                let ad = x.device();
                let norm = RmsNorm::new(Tensor::from_data(w.to_data(), &ad), 1e-6);
                let (c, sn) = (
                    Tensor::from_data(cos.to_data(), &ad),
                    Tensor::from_data(sin.to_data(), &ad),
                );
                rope(
                    norm.forward_generic(x.reshape([b, s, heads, d]))
                        .swap_dims(1, 2),
                    &c,
                    &signed_sin(&sn),
                )
            });
            let got = norm_rope_heads_backward(x, heads, w, 1e-6, (&cos, &sin), dy);
            assert_close("norm_rope_heads_backward", got, want, 1e-5);
        }
    }

    #[test]
    fn silu_mul_backward_matches_the_taped_gradients() {
        for (i, &(b, s, _, _, _, inter)) in SHAPES.iter().enumerate() {
            let gate = random([b, s, inter], 91 + i as u64).mul_scalar(8.0);
            let up = random([b, s, inter], 92 + i as u64);
            let da = random([b, s, inter], 93 + i as u64);
            let up_ad = Tensor::<3>::from_data(up.to_data(), &Device::flex().autodiff());
            let want_gate = taped_grad(gate.clone(), da.clone(), |g| {
                burn::tensor::activation::silu(g) * up_ad
            });
            let gate_ad = Tensor::<3>::from_data(gate.to_data(), &Device::flex().autodiff());
            let want_up = taped_grad(up.clone(), da.clone(), |u| {
                burn::tensor::activation::silu(gate_ad) * u
            });
            let (d_gate, d_up) = silu_mul_backward(gate, up, da);
            assert_close("silu_mul_backward: gate", d_gate, want_gate, 1e-5);
            assert_close("silu_mul_backward: up", d_up, want_up, 1e-5);
        }
    }

    /// The bf16 product over all threads gives exactly flex's values for a bf16 cast, product and
    /// cast back, forward and (through a transposed view) backward.
    #[test]
    fn bf16_product_is_flexs() {
        for (i, &(b, s, hidden, _, _, inter)) in SHAPES.iter().enumerate() {
            let x = random([b * s, hidden], 101 + i as u64);
            let w = random([hidden, inter], 102 + i as u64).cast(FloatDType::BF16);
            let dy = random([b * s, inter], 103 + i as u64);
            let bf = |t: Tensor<2>| t.cast(FloatDType::BF16);
            let want = bf(x.clone()).matmul(w.clone()).cast(FloatDType::F32);
            let want_t = bf(dy.clone())
                .matmul(w.clone().transpose())
                .cast(FloatDType::F32);
            let widened = Bf16Weight::Widened(widen(w.clone()));
            assert_eq!(
                values(widened.product(x.clone())),
                values(want.clone()),
                "forward"
            );
            let got = widened.product_transposed(dy.clone());
            assert_eq!(values(got), values(want_t.clone()), "backward");
            // AVX512_BF16's products: the same to f32 rounding, then one bf16 rounding of the
            // output either side of a tie (2⁻⁸ of the largest value, with room).
            #[cfg(target_arch = "x86_64")]
            if bf16_gemm::available() {
                let packed = Bf16Weight::new(w.clone(), true);
                assert!(matches!(packed, Bf16Weight::Packed { .. }));
                assert_close("packed forward", packed.product(x.clone()), want, 8e-3);
                let got = packed.product_transposed(dy.clone());
                assert_close("packed backward", got, want_t, 8e-3);
            }
        }
    }

    /// An adapter's term added inside its product: `y + s·(x·A)·B` as Burn's product, scale and
    /// add give it, with `A` read through a transposed view (as the backward's `u·Aᵀ` is).
    #[test]
    fn add_product_matches_burns_scale_and_add() {
        for (i, &(b, s, hidden, _, _, inter)) in SHAPES.iter().enumerate() {
            let rank = [2, 16][i];
            let y = random([b * s, inter], 111 + i as u64);
            let xa = random([b * s, rank], 112 + i as u64);
            let lora_b = random([rank, inter], 113 + i as u64);
            let want = y.clone() + xa.clone().matmul(lora_b.clone()).mul_scalar(2.0);
            let got = add_product(y.clone(), xa, lora_b, 2.0);
            assert_close("add_product", got, want, 1e-6);
            let u = random([b * s, rank], 114 + i as u64);
            let a = random([hidden, rank], 115 + i as u64);
            let dx = random([b * s, hidden], 116 + i as u64);
            let want = dx.clone() + u.clone().matmul(a.clone().transpose());
            let got = add_product(dx, u, a.transpose(), 1.0);
            assert_close("add_product, transposed", got, want, 1e-6);
        }
    }

    #[test]
    fn exp_is_exact_enough() {
        for i in 0..=35_000 {
            let y = -87.0 + i as f32 * 0.005;
            let want = (y as f64).exp();
            let got = exp(y) as f64;
            assert!(
                (got - want).abs() <= 4e-7 * want,
                "exp({y}): {got} against {want}"
            );
        }
        assert!(
            exp(-1e4) > 0.0 && exp(1e4).is_finite(),
            "clamped at both ends"
        );
    }
}
