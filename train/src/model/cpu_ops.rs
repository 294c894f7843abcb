//! The element-wise work of an untaped forward pass on the CPU, fused and shared over rayon's
//! threads: RMSNorm, the query/key heads' RMSNorm and rotation (with the move to head-major
//! order), and SiLU(gate)·up.
//!
//! Burn's `flex` backend runs each element-wise operation as its own pass over the tensor into a
//! fresh buffer, on one thread: RMSNorm alone is five passes (square, mean, add, sqrt, divide)
//! and a multiply, the rotation six. These kernels read their input once and write their output
//! once. They run where no tape is kept (`decision score`, evaluation, and the first pass of a
//! recomputed training step, [`crate::recompute`]); a taped pass keeps Burn's operations, whose
//! backward Burn derives. Each gives the generic path's values to f32 rounding (tests below, at
//! a tiny and at the 0.6B shape).

use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};
use rayon::prelude::*;

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
    let t = if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(FloatDType::F32)
    };
    t.into_data()
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
    let n = (y * LOG2E + ROUND) - ROUND;
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use super::*;
    use crate::model::qwen3::{RmsNorm, rope};

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
            let got = rms_norm(x, norm.weight.val(), norm.eps);
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
                &sin,
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
