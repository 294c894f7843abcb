//! Attention on the CPU in tiles, flash-style: `softmax(q·kᵀ·scale + bias)·v` and its gradients
//! over tiles of [`TILE`] queries × [`TILE`] keys, with a running maximum and sum per query row
//! (the online softmax), so no `[b, heads, s, s]` score tensor ever exists. Tiles wholly above
//! the diagonal are skipped, since the mask is causal. Work is shared out by head over rayon's
//! threads; each tile's products go to the `gemm` crate (the kernels Burn's `flex` backend uses
//! for its own matmuls) on the calling thread.
//!
//! Used on the CPU backend by every untaped forward pass (`decision score`, evaluation) and by
//! layer recomputation (`crate::recompute`, forward and backward), where Burn's generic
//! operations would make about fifteen single-threaded passes over every score block; other
//! backends keep Burn's attention and recomputation's blocked path built of Burn operations.
//! Both give the same values and gradients to float rounding (tests below, at a tiny and at the
//! 0.6B shape).
//!
//! The backward pass is FlashAttention-2's: the forward keeps each row's log-sum-exp, the
//! backward recomputes each tile's probabilities from it, and with `D = rowsum(dO ⊙ O)`:
//! `dV += Pᵀ·dO`, `dS = P ⊙ (dO·Vᵀ − D)·scale`, `dQ += dS·K`, `dK += dSᵀ·Q`.

use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use crate::model::cpu_ops::{self, exp};

/// Queries and keys per tile: a 64 × 64 score tile and the 64 × 128 rows of q, k, v it reads
/// stay in the core's L2.
const TILE: usize = 64;

/// The additive mask `[b, s, s]`: 0 where a query may attend to a key, −∞ where not. Every row
/// must allow at least one key (a padding query attends to itself) and no key after the query.
pub(crate) struct Mask {
    bias: Vec<f32>,
    b: usize,
    s: usize,
}

impl Mask {
    /// From `b · s · s` flags, row-major (true = masked out): the model's mask `[b, 1, s, s]`,
    /// which [`LayerInputs`](crate::model::qwen3::LayerInputs) builds this from on the CPU.
    pub(crate) fn from_masked(masked: &[bool], b: usize, s: usize) -> Self {
        assert_eq!(masked.len(), b * s * s, "a [b, s, s] mask");
        let bias = masked
            .iter()
            .map(|&m| if m { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        Self { bias, b, s }
    }

    fn row(&self, batch: usize, query: usize) -> &[f32] {
        let at = (batch * self.s + query) * self.s;
        &self.bias[at..at + self.s]
    }
}

/// What the forward pass keeps for the backward: each query row's log-sum-exp, `[b, heads, s]`.
pub(crate) struct Saved {
    lse: Vec<f32>,
}

/// Dimensions of one call: `q` is `[b, h, s, d]`, `k` and `v` `[b, kvh, s, d]`.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    h: usize,
    kvh: usize,
    s: usize,
    d: usize,
}

impl Dims {
    fn of(q: &Tensor<4>, k: &Tensor<4>) -> Self {
        let [b, h, s, d] = q.dims();
        Self {
            b,
            h,
            kvh: k.dims()[1],
            s,
            d,
        }
    }

    fn groups(&self) -> usize {
        self.h / self.kvh
    }

    /// The queries' (and the output's) shape `[b, h, s, d]`.
    fn shape(&self) -> [usize; 4] {
        [self.b, self.h, self.s, self.d]
    }
}

fn values(t: &Tensor<4>) -> Vec<f32> {
    t.clone()
        .cast(burn::tensor::FloatDType::F32)
        .into_data()
        .try_into_vec::<f32>()
        .expect("f32 values")
}

/// Head `i` of `t`, whose heads are `len` values each.
fn head(t: &[f32], i: usize, len: usize) -> &[f32] {
    &t[i * len..(i + 1) * len]
}

fn tensor(v: Vec<f32>, shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::<4>::from_data(TensorData::new(v, shape), (device, DType::F32))
}

/// The attention output `[b, h, s, d]` and what the backward pass needs.
pub(crate) fn forward(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask: &Mask,
    scale: f32,
) -> (Tensor<4>, Saved) {
    let dims = Dims::of(q, k);
    let (qv, kv, vv) = (values(q), values(k), values(v));
    let d = dims.d;
    let (out, lse) = forward_heads(dims, mask, scale, |bh, kvi| F32Products {
        q: head(&qv, bh, dims.s * d),
        k: head(&kv, kvi, dims.s * d),
        v: head(&vv, kvi, dims.s * d),
        d,
    });
    (tensor(out, dims.shape(), &q.device()), Saved { lse })
}

/// [`forward`]'s output with the tiles' two products in bf16, by AVX512_BF16: `q`, `k`, `v` and
/// each tile's probabilities rounded to bf16, each product summed in f32, as a bf16 model's
/// attention computes them (PyTorch's CPU kernel rounds the probabilities for `P·v` too). For
/// the untaped forward of a bf16 model, where [`bf16_gemm::available`]; training keeps
/// [`forward`], whose output its backward pass is the gradient of.
#[cfg(target_arch = "x86_64")]
pub(crate) fn forward_in_bf16(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask: &Mask,
    scale: f32,
) -> Tensor<4> {
    use crate::model::bf16_gemm::Packed;
    use half::bf16;
    let dims = Dims::of(q, k);
    let (s, d) = (dims.s, dims.d);
    let (qv, kv, vv) = (values(q), values(k), values(v));
    let rounded = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    // Each key/value head packed once for the query heads that share it: kᵀ `[d, s]` (the
    // head's rows `[s, d]` are its transpose) and v `[s, d]`.
    let packed: Vec<(Packed, Packed)> = (0..dims.b * dims.kvh)
        .into_par_iter()
        .map(|i| {
            (
                Packed::new(&rounded(head(&kv, i, s * d)), (d, s), true),
                Packed::new(&rounded(head(&vv, i, s * d)), (s, d), false),
            )
        })
        .collect();
    let (out, _) = forward_heads(dims, mask, scale, |bh, kvi| Bf16Products {
        q: head(&qv, bh, s * d),
        kt: &packed[kvi].0,
        v: &packed[kvi].1,
        d,
        rows: None,
    });
    tensor(out, dims.shape(), &q.device())
}

/// Every head's output `[b, h, s, d]` and log-sum-exps `[b, h, s]`, shared out by head over
/// rayon's threads; `products(bh, kvi)` gives head `bh`'s products, whose key/value head is
/// `kvi` (both counted over the batch).
fn forward_heads<P: TileProducts>(
    dims: Dims,
    mask: &Mask,
    scale: f32,
    products: impl Fn(usize, usize) -> P + Sync,
) -> (Vec<f32>, Vec<f32>) {
    let Dims { b, h, s, d, .. } = dims;
    assert_eq!((mask.b, mask.s), (b, s), "mask and queries disagree");
    let mut out = vec![0f32; b * h * s * d];
    let mut lse = vec![0f32; b * h * s];
    out.par_chunks_mut(s * d)
        .zip(lse.par_chunks_mut(s))
        .enumerate()
        .for_each(|(bh, (out, lse))| {
            let (bi, hi) = (bh / h, bh % h);
            let kvi = bi * dims.kvh + hi / dims.groups();
            forward_head(
                products(bh, kvi),
                |row| mask.row(bi, row),
                dims,
                scale,
                out,
                lse,
            );
        });
    (out, lse)
}

/// The two products of a forward tile, over one head's `q`, `k`, `v` (`[s, d]` each).
trait TileProducts {
    /// `st` `[rows, cols]` = queries `i0 .. i0 + rows` · keys `j0 .. j0 + cols`ᵀ.
    fn scores(&mut self, queries: (usize, usize), keys: (usize, usize), st: &mut [f32]);
    /// `acc` `[rows, d]` += `p` `[rows, cols]` · values `j0 .. j0 + cols`.
    fn add_values(&mut self, p: &[f32], rows: usize, keys: (usize, usize), acc: &mut [f32]);
}

/// Products in f32 by the `gemm` crate.
struct F32Products<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    d: usize,
}

impl TileProducts for F32Products<'_> {
    #[inline(always)]
    fn scores(&mut self, (i0, rows): (usize, usize), (j0, cols): (usize, usize), st: &mut [f32]) {
        let d = self.d;
        // k's rows j0.. read as the columns of kᵀ.
        let qt = &self.q[i0 * d..(i0 + rows) * d];
        mm(
            rows,
            cols,
            d,
            qt,
            (d, 1),
            &self.k[j0 * d..],
            (1, d),
            st,
            false,
        );
    }

    #[inline(always)]
    fn add_values(&mut self, p: &[f32], rows: usize, (j0, cols): (usize, usize), acc: &mut [f32]) {
        let d = self.d;
        mm(
            rows,
            d,
            cols,
            p,
            (cols, 1),
            &self.v[j0 * d..],
            (d, 1),
            acc,
            true,
        );
    }
}

/// Products in bf16 by AVX512_BF16 ([`forward_in_bf16`]); the tile of queries is packed once
/// for all its key tiles.
#[cfg(target_arch = "x86_64")]
struct Bf16Products<'a> {
    q: &'a [f32],
    kt: &'a crate::model::bf16_gemm::Packed,
    v: &'a crate::model::bf16_gemm::Packed,
    d: usize,
    /// The packed queries and the first of them.
    rows: Option<(usize, crate::model::bf16_gemm::Rows)>,
}

#[cfg(target_arch = "x86_64")]
impl TileProducts for Bf16Products<'_> {
    #[inline(always)]
    fn scores(&mut self, (i0, rows): (usize, usize), (j0, cols): (usize, usize), st: &mut [f32]) {
        use crate::model::bf16_gemm::{Rows, product_on_thread};
        let d = self.d;
        if self.rows.as_ref().is_none_or(|(at, _)| *at != i0) {
            self.rows = Some((i0, Rows::new(&self.q[i0 * d..(i0 + rows) * d], rows, d)));
        }
        let (_, qt) = self.rows.as_ref().expect("packed above");
        product_on_thread(qt, self.kt, 0..d, j0..j0 + cols, st, cols, false);
    }

    #[inline(always)]
    fn add_values(&mut self, p: &[f32], rows: usize, (j0, cols): (usize, usize), acc: &mut [f32]) {
        use crate::model::bf16_gemm::{Rows, product_on_thread};
        let d = self.d;
        let p = Rows::new(p, rows, cols);
        product_on_thread(&p, self.v, j0..j0 + cols, 0..d, acc, d, true);
    }
}

/// One head: `out` `[s, d]`, `lse` `[s]`.
fn forward_head<'m, P: TileProducts>(
    products: P,
    mask: impl Fn(usize) -> &'m [f32],
    dims: Dims,
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if wide::available() {
        // SAFETY: the CPU has the features `wide::forward_head` is compiled for.
        return unsafe { wide::forward_head(products, mask, dims, scale, out, lse) };
    }
    forward_head_any(products, mask, dims, scale, out, lse)
}

/// [`forward_head`]'s body, compiled for any x86-64 and again in [`wide`].
#[inline(always)]
fn forward_head_any<'m, P: TileProducts>(
    mut products: P,
    mask: impl Fn(usize) -> &'m [f32],
    dims: Dims,
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let (s, d) = (dims.s, dims.d);
    let mut scores = vec![0f32; TILE * TILE];
    let mut max = [0f32; TILE];
    let mut sum = [0f32; TILE];
    for i0 in (0..s).step_by(TILE) {
        let rows = TILE.min(s - i0);
        let acc = &mut out[i0 * d..(i0 + rows) * d];
        max[..rows].fill(f32::NEG_INFINITY);
        sum[..rows].fill(0.0);
        // Causal: keys after the tile's last query are masked for every row of it.
        for j0 in (0..i0 + rows).step_by(TILE) {
            let cols = TILE.min(i0 + rows - j0);
            let st = &mut scores[..rows * cols];
            products.scores((i0, rows), (j0, cols), st);
            for r in 0..rows {
                let row = &mut st[r * cols..(r + 1) * cols];
                let bias = &mask(i0 + r)[j0..j0 + cols];
                let m = scale_bias_max(row, bias, scale).max(max[r]);
                if m == f32::NEG_INFINITY {
                    // Nothing visible to this row yet: its tile contributes nothing.
                    row.fill(0.0);
                    continue;
                }
                let keep = if max[r] == f32::NEG_INFINITY {
                    0.0
                } else {
                    (max[r] - m).exp()
                };
                sum[r] = sum[r] * keep + exp_shifted(row, m);
                max[r] = m;
                if keep != 1.0 {
                    acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= keep);
                }
            }
            products.add_values(st, rows, (j0, cols), acc);
        }
        for r in 0..rows {
            let inv = 1.0 / sum[r];
            acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= inv);
            lse[i0 + r] = max[r] + sum[r].ln();
        }
    }
}

/// `(dq, dk, dv)` of [`forward`] given its output `out`, what it saved, and the output's
/// gradient `d_out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    out: &Tensor<4>,
    saved: &Saved,
    d_out: &Tensor<4>,
    mask: &Mask,
    scale: f32,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let dims = Dims::of(q, k);
    let Dims { b, h, kvh, s, d } = dims;
    let g = dims.groups();
    let (qv, kv, vv) = (values(q), values(k), values(v));
    let (ov, dov) = (values(out), values(d_out));
    let mut dq = vec![0f32; b * h * s * d];
    let mut dk = vec![0f32; b * kvh * s * d];
    let mut dv = vec![0f32; b * kvh * s * d];
    // One task per key/value head: it owns that head's dk, dv and its query heads' dq.
    dq.par_chunks_mut(g * s * d)
        .zip(dk.par_chunks_mut(s * d))
        .zip(dv.par_chunks_mut(s * d))
        .enumerate()
        .for_each(|(bk, ((dq, dk), dv))| {
            let bi = bk / kvh;
            for j in 0..g {
                let qh = bk * g + j;
                backward_head(
                    Head {
                        q: head(&qv, qh, s * d),
                        k: head(&kv, bk, s * d),
                        v: head(&vv, bk, s * d),
                        out: head(&ov, qh, s * d),
                        d_out: head(&dov, qh, s * d),
                        lse: &saved.lse[qh * s..(qh + 1) * s],
                    },
                    |row| mask.row(bi, row),
                    dims,
                    scale,
                    &mut dq[j * s * d..(j + 1) * s * d],
                    dk,
                    dv,
                );
            }
        });
    let device = q.device();
    (
        tensor(dq, [b, h, s, d], &device),
        tensor(dk, [b, kvh, s, d], &device),
        tensor(dv, [b, kvh, s, d], &device),
    )
}

/// One query head's inputs, each `[s, d]` (`lse` `[s]`).
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    out: &'a [f32],
    d_out: &'a [f32],
    lse: &'a [f32],
}

/// Adds one query head's contribution to `dk`, `dv` (its key/value head's) and writes its `dq`.
fn backward_head<'m>(
    x: Head<'_>,
    mask: impl Fn(usize) -> &'m [f32],
    dims: Dims,
    scale: f32,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if wide::available() {
        // SAFETY: the CPU has the features `wide::backward_head` is compiled for.
        return unsafe { wide::backward_head(x, mask, dims, scale, dq, dk, dv) };
    }
    backward_head_any(x, mask, dims, scale, dq, dk, dv)
}

/// [`backward_head`]'s body, compiled for any x86-64 and again in [`wide`].
#[inline(always)]
fn backward_head_any<'m>(
    x: Head<'_>,
    mask: impl Fn(usize) -> &'m [f32],
    dims: Dims,
    scale: f32,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (s, d) = (dims.s, dims.d);
    let mut p = vec![0f32; TILE * TILE];
    let mut dp = vec![0f32; TILE * TILE];
    let mut delta = [0f32; TILE];
    for i0 in (0..s).step_by(TILE) {
        let rows = TILE.min(s - i0);
        let span = i0 * d..(i0 + rows) * d;
        let (qt, dot) = (&x.q[span.clone()], &x.d_out[span.clone()]);
        for (r, dl) in delta[..rows].iter_mut().enumerate() {
            let at = (i0 + r) * d..(i0 + r + 1) * d;
            *dl = x.d_out[at.clone()]
                .iter()
                .zip(&x.out[at])
                .map(|(a, b)| a * b)
                .sum();
        }
        let dqt = &mut dq[span];
        for j0 in (0..i0 + rows).step_by(TILE) {
            let cols = TILE.min(i0 + rows - j0);
            let pt = &mut p[..rows * cols];
            let dpt = &mut dp[..rows * cols];
            mm(rows, cols, d, qt, (d, 1), &x.k[j0 * d..], (1, d), pt, false);
            for r in 0..rows {
                let row = &mut pt[r * cols..(r + 1) * cols];
                let bias = &mask(i0 + r)[j0..j0 + cols];
                scale_bias_max(row, bias, scale);
                exp_shifted(row, x.lse[i0 + r]);
            }
            let kt = j0 * d..(j0 + cols) * d;
            // dv += Pᵀ·dO
            mm(
                cols,
                d,
                rows,
                pt,
                (1, cols),
                dot,
                (d, 1),
                &mut dv[kt.clone()],
                true,
            );
            // dP = dO·vᵀ
            mm(
                rows,
                cols,
                d,
                dot,
                (d, 1),
                &x.v[j0 * d..],
                (1, d),
                dpt,
                false,
            );
            // dS = P ⊙ (dP − D)·scale, into dpt
            for (r, dl) in delta[..rows].iter().enumerate() {
                let at = r * cols..(r + 1) * cols;
                for (g, pr) in dpt[at.clone()].iter_mut().zip(&pt[at]) {
                    *g = pr * (*g - dl) * scale;
                }
            }
            // dq += dS·k, dk += dSᵀ·q
            mm(
                rows,
                d,
                cols,
                dpt,
                (cols, 1),
                &x.k[j0 * d..],
                (d, 1),
                dqt,
                true,
            );
            mm(cols, d, rows, dpt, (1, cols), qt, (d, 1), &mut dk[kt], true);
        }
    }
}

/// The tiles' element-wise work (scaling, masking, the exponentials, the running sums and the
/// gradient's `P ⊙ (dP − D)`) compiled again for AVX2 and FMA, chosen at run time: a build for
/// any x86-64 vectorises those loops to SSE2's four lanes without fused multiply-adds, which
/// left the exponentials at a quarter of a tile's time (`perf`, docs/results.md).
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::*;

    /// Whether this CPU runs what this module is compiled for (detected once, then cached).
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward_head<'m, P: TileProducts>(
        products: P,
        mask: impl Fn(usize) -> &'m [f32],
        dims: Dims,
        scale: f32,
        out: &mut [f32],
        lse: &mut [f32],
    ) {
        forward_head_any(products, mask, dims, scale, out, lse)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn backward_head<'m>(
        x: Head<'_>,
        mask: impl Fn(usize) -> &'m [f32],
        dims: Dims,
        scale: f32,
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        backward_head_any(x, mask, dims, scale, dq, dk, dv)
    }
}

/// Lanes for the per-row reductions: eight independent maxima or sums, which the compiler keeps
/// in one vector register, where a single running value would wait on each add in turn.
const LANES: usize = 8;

/// `row ← row · scale + bias`, returning the row's largest value (−∞ when all of it is masked).
#[inline(always)]
fn scale_bias_max(row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut rows = row.chunks_exact_mut(LANES);
    let mut biases = bias.chunks_exact(LANES);
    for (x, b) in (&mut rows).zip(&mut biases) {
        for l in 0..LANES {
            x[l] = x[l] * scale + b[l];
            max[l] = if x[l] > max[l] { x[l] } else { max[l] };
        }
    }
    let mut m = max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    for (x, b) in rows.into_remainder().iter_mut().zip(biases.remainder()) {
        *x = *x * scale + b;
        m = m.max(*x);
    }
    m
}

/// `row ← exp(row − shift)`, exactly 0 where `row` is −∞, by [`exp`], which the compiler
/// vectorises (libm's `exp` would cost as much as the tile's products); returns the row's sum.
#[inline(always)]
fn exp_shifted(row: &mut [f32], shift: f32) -> f32 {
    // Branch-free, so the lanes vectorise: a masked entry's clamped exponential times 0.
    let e = |x: f32| exp(x - shift) * f32::from(u8::from(x != f32::NEG_INFINITY));
    let mut sum = [0f32; LANES];
    let mut rows = row.chunks_exact_mut(LANES);
    for x in &mut rows {
        for l in 0..LANES {
            x[l] = e(x[l]);
            sum[l] += x[l];
        }
    }
    let mut total: f32 = sum.iter().sum();
    for x in rows.into_remainder() {
        *x = e(*x);
        total += *x;
    }
    total
}

/// `c (+)= a·b` for an `m × k` `a` and a `k × n` `b`, each addressed by `(row stride, column
/// stride)` from the start of its slice, `c` row-major `m × n`; on this thread.
#[allow(clippy::too_many_arguments)]
fn mm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    c: &mut [f32],
    accumulate: bool,
) {
    cpu_ops::gemm(
        (m, n, k),
        (a, a_strides),
        (b, b_strides),
        c,
        accumulate,
        1.0,
        false,
    );
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use super::*;
    use crate::model::blocked_attention::{BlockedCore, Products};
    use crate::model::qwen3::{Batch, LayerInputs};

    /// `a` against `b`: relative L2 difference, and the largest element difference against `b`'s
    /// largest magnitude.
    fn differences(a: &Tensor<4>, b: &Tensor<4>) -> (f64, f64) {
        let (a, b) = (values(a), values(b));
        let norm =
            |v: &mut dyn Iterator<Item = f32>| v.map(|x| (x as f64).powi(2)).sum::<f64>().sqrt();
        let rel = norm(&mut a.iter().zip(&b).map(|(x, y)| x - y)) / norm(&mut b.iter().copied());
        let top = b.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs())) as f64;
        (rel, diff / top)
    }

    /// The tiles against the blocked path of Burn operations, values and the three gradients,
    /// at `[b, h, kvh, d]` with rows of `lens` real tokens, left-padded to the longest.
    fn check(h: usize, kvh: usize, d: usize, lens: &[usize], tol: f64) {
        let device = Device::flex();
        let s = *lens.iter().max().unwrap();
        let rows: Vec<Vec<u32>> = lens.iter().map(|&n| (1..=n as u32).collect()).collect();
        let rows: Vec<&[u32]> = rows.iter().map(|r| r.as_slice()).collect();
        let batch = Batch::left_padded(&rows, 0);
        let inputs = LayerInputs::new(&batch, d, 10000.0, &device);
        let b = lens.len();
        let normal =
            |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        // Scores of a few units, as trained models give: some rows sharply peaked.
        let q = normal([b, h, s, d]).mul_scalar(2.0);
        let (k, v) = (normal([b, kvh, s, d]), normal([b, kvh, s, d]));
        let d_out = normal([b, h, s, d]);
        let scale = 1.0 / (d as f64).sqrt();
        let blocked = BlockedCore::new(&inputs.mask, 37, Products::F32);
        let (want, stats) = blocked.forward_saving((&q, &k, &v), scale, None);
        let want_grads = blocked.backward(&want, &stats, &d_out);

        let mask = inputs.tiles.as_ref().expect("the CPU's tiles mask");
        let (got, saved) = forward(&q, &k, &v, mask, scale as f32);
        let got_grads = backward(&q, &k, &v, &got, &saved, &d_out, mask, scale as f32);
        let pairs = [
            ("out", &got, &want),
            ("dq", &got_grads.0, &want_grads.0),
            ("dk", &got_grads.1, &want_grads.1),
            ("dv", &got_grads.2, &want_grads.2),
        ];
        for (name, got, want) in pairs {
            let (rel, worst) = differences(got, want);
            assert!(
                rel <= tol && worst <= 10.0 * tol,
                "{name} at h {h}, s {s}, d {d}: relative L2 {rel:e}, worst element {worst:e} of the largest"
            );
        }

        // The bf16 products, against the blocked path on q, k, v rounded to bf16 as they round
        // them: what remains is each tile's probabilities rounded to bf16 for `P·v`, at most
        // 2⁻⁹ of each, so an output moves by at most 2⁻⁹ · Σ p·|v| ≤ 2⁻⁹ · max |v| (and the
        // sums' f32 roundings, `tol` of it).
        #[cfg(target_arch = "x86_64")]
        if crate::model::bf16_gemm::available() {
            let round = |t: &Tensor<4>| {
                let v = values(t)
                    .into_iter()
                    .map(|x| half::bf16::from_f32(x).to_f32());
                tensor(v.collect(), t.dims(), &device)
            };
            let (q, k, v) = (round(&q), round(&k), round(&v));
            let want = values(&blocked.forward((&q, &k, &v), scale).0);
            let got = values(&forward_in_bf16(&q, &k, &v, mask, scale as f32));
            let top = values(&v).iter().fold(0f32, |m, x| m.max(x.abs()));
            let bound = (2f32.powi(-9) + tol as f32) * top;
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs());
            let worst = worst.fold(0f32, f32::max);
            assert!(
                worst <= bound,
                "bf16 out at h {h}, s {s}, d {d}: {worst:e} against a bound of {bound:e}"
            );
            // Not the f32 tiles' values: the probabilities were rounded.
            assert_ne!(got, values(&forward(&q, &k, &v, mask, scale as f32).0));
        } else {
            eprintln!("bf16 tiles not checked: this CPU lacks AVX512_BF16, which they run on");
        }
    }

    #[test]
    fn tiles_match_the_blocked_path() {
        // One tile, then several with a partial last one; a row padded by more than a tile
        // (rows whose first key tiles are wholly masked); a head per key/value head and four.
        check(2, 1, 8, &[7, 3], 1e-5);
        check(4, 2, 16, &[150, 97], 1e-5);
        check(4, 1, 8, &[200, 10, 129], 1e-5);
    }

    #[test]
    fn tiles_match_the_blocked_path_at_the_0_6b_shape() {
        // Qwen3-0.6B's attention: 16 query heads on 8 key/value heads of 128, two rows of about
        // a thousand tokens.
        check(16, 8, 128, &[1030, 901], 1e-5);
    }

    /// The AVX2 build of a head's forward and backward against the build for any x86-64, on one
    /// head with rows that see nothing in their first tiles: the same operations in the same
    /// order, so the same bits.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_build_gives_the_same_bits() {
        assert!(
            wide::available(),
            "this CPU lacks AVX2 or FMA, so the AVX2 build cannot be compared here"
        );
        let (s, d) = (150, 16);
        let dims = Dims {
            b: 1,
            h: 1,
            kvh: 1,
            s,
            d,
        };
        // Causal, and the first 70 keys hidden from every row but the first 70 (which see only
        // themselves), as left padding does.
        let masked: Vec<bool> = (0..s * s)
            .map(|i| {
                let (q, k) = (i / s, i % s);
                k > q || (q >= 70 && k < 70) || (q < 70 && k != q)
            })
            .collect();
        let mask = Mask::from_masked(&masked, 1, s);
        let normal = |n: usize| {
            values(&Tensor::<4>::random(
                [1, 1, n, d],
                Distribution::Normal(0.0, 2.0),
                &Device::flex(),
            ))
        };
        let (q, k, v, d_out) = (normal(s), normal(s), normal(s), normal(s));
        let scale = 0.25;
        let forward = |wide: bool| {
            let (mut out, mut lse) = (vec![0f32; s * d], vec![0f32; s]);
            let rows = |r| mask.row(0, r);
            let products = F32Products {
                q: &q,
                k: &k,
                v: &v,
                d,
            };
            if wide {
                unsafe { wide::forward_head(products, rows, dims, scale, &mut out, &mut lse) };
            } else {
                forward_head_any(products, rows, dims, scale, &mut out, &mut lse);
            }
            (out, lse)
        };
        let backward = |wide: bool, out: &[f32], lse: &[f32]| {
            let mut grads = [vec![0f32; s * d], vec![0f32; s * d], vec![0f32; s * d]];
            let [dq, dk, dv] = &mut grads;
            let x = Head {
                q: &q,
                k: &k,
                v: &v,
                out,
                d_out: &d_out,
                lse,
            };
            let rows = |r| mask.row(0, r);
            if wide {
                unsafe { wide::backward_head(x, rows, dims, scale, dq, dk, dv) };
            } else {
                backward_head_any(x, rows, dims, scale, dq, dk, dv);
            }
            grads
        };
        let (out, lse) = forward(false);
        assert!(out.iter().all(|x| x.is_finite()) && out.iter().any(|x| *x != 0.0));
        assert_eq!((out.clone(), lse.clone()), forward(true), "forward");
        assert_eq!(
            backward(false, &out, &lse),
            backward(true, &out, &lse),
            "backward"
        );
    }

    #[test]
    fn exp_is_exact_enough() {
        let xs: Vec<f32> = (0..20001).map(|i| -80.0 + i as f32 * 0.004).collect();
        let mut got = xs.clone();
        exp_shifted(&mut got, 0.5);
        for (x, y) in xs.iter().zip(&got) {
            let want = ((*x - 0.5) as f64).exp();
            assert!(
                ((*y as f64) - want).abs() <= 4e-7 * want,
                "exp({x} - 0.5): {y} against {want}"
            );
        }
        let mut masked = [f32::NEG_INFINITY, 0.0];
        exp_shifted(&mut masked, 0.0);
        assert_eq!(masked, [0.0, 1.0]);
    }
}
