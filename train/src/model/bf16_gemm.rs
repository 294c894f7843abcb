//! Products with a frozen bf16 weight on CPUs with AVX512_BF16, by its dot-product instruction
//! (`vdpbf16ps`): `c = bf16(a)·b` with `a` f32 activations rounded to bf16 and `b` the weight as
//! stored, each pair of bf16 products summed into f32. On such a CPU this runs at about twice the
//! rate of the f32 product the weight would otherwise be widened for (docs/results.md), and reads
//! half the bytes.
//!
//! The weight is packed once ([`Packed`]): panels of [`NR`] columns, each a run of `k / 2` pairs
//! of rows, so one vector load gives sixteen columns' next two rows. The activations are
//! rounded to bf16 per product ([`Rows`], 32 values to an instruction), which as `u32`s is
//! already a row of pairs; a micro-tile broadcasts each row's next pair in turn. Work is shared
//! over rayon's threads by blocks of rows and columns; the pairs run in blocks of [`KC`] so a
//! panel's block stays in L1 and the rows' block in L2.
//!
//! [`product_on_thread`] is the same product on the calling thread over a block of a packed
//! matrix: attention's tiles in bf16 (`flash`).
//!
//! The values differ from widening both operands to f32 and using an f32 product only in the
//! order of the f32 sums (each product of two bf16 values is exact in f32) and in that
//! `vdpbf16ps` treats subnormal inputs and results as zero (tests below).

use std::arch::x86_64::*;

use half::bf16;
use rayon::prelude::*;

/// Rows of a micro-tile: `MR × 2` accumulators, two weight vectors and a broadcast fit the 32
/// vector registers.
const MR: usize = 12;
/// Columns of a panel: two vectors of sixteen f32.
const NR: usize = 32;
/// Pairs of rows per block: a panel's block is `KC · NR · 4` bytes = 16 KiB.
const KC: usize = 128;
/// Micro-tiles of rows per task.
const TILES_PER_TASK: usize = 8;
/// Panels per task.
const PANELS_PER_TASK: usize = 4;

/// Whether this CPU has what [`product`] runs on (detected once, then cached).
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// A `k × n` bf16 matrix packed for [`product`].
pub(crate) struct Packed {
    k: usize,
    n: usize,
    /// `[panel][k / 2 rounded up][NR]`: each `u32` the pair of rows `2q` (low half) and `2q + 1`
    /// of one column, zero past `k` and past `n`.
    pairs: Vec<u32>,
}

impl Packed {
    /// The `[k, n]` matrix `b` (row-major), or with `transposed` the transpose of `b` `[n, k]`
    /// (row-major): a weight `W` for `x·W`, or for `dy·Wᵀ`.
    pub(crate) fn new(b: &[bf16], (k, n): (usize, usize), transposed: bool) -> Self {
        assert!(k > 0 && n > 0);
        assert_eq!(b.len(), k * n, "the packed matrix's length");
        let kp = k.div_ceil(2);
        let bits = |x: &bf16| u32::from(x.to_bits());
        let mut pairs = vec![0u32; n.div_ceil(NR) * kp * NR];
        pairs
            .par_chunks_mut(kp * NR)
            .enumerate()
            .for_each(|(p, panel)| {
                let cols = p * NR..(p * NR + NR).min(n);
                if transposed {
                    // Column `j` is `b`'s row `j`: its pairs are adjacent.
                    for (c, j) in cols.enumerate() {
                        let row = &b[j * k..(j + 1) * k];
                        for (q, pair) in row.chunks(2).enumerate() {
                            let hi = pair.get(1).map_or(0, bits);
                            panel[q * NR + c] = bits(&pair[0]) | hi << 16;
                        }
                    }
                } else {
                    for (q, out) in panel.chunks_exact_mut(NR).enumerate() {
                        let lo = &b[2 * q * n..][cols.clone()];
                        if 2 * q + 1 < k {
                            let hi = &b[(2 * q + 1) * n..][cols.clone()];
                            for ((o, l), h) in out.iter_mut().zip(lo).zip(hi) {
                                *o = bits(l) | bits(h) << 16;
                            }
                        } else {
                            for (o, l) in out.iter_mut().zip(lo) {
                                *o = bits(l);
                            }
                        }
                    }
                }
            });
        Self { k, n, pairs }
    }

    /// `n`: the product's output columns.
    pub(crate) fn columns(&self) -> usize {
        self.n
    }
}

/// `m` rows of `k` values rounded to bf16, each row as `k / 2` (rounded up) pairs: the left
/// operand of a product. A row's pair `q` is its values `2q` (low half) and `2q + 1`, so a row
/// of pairs is the row in bf16, read as `u32`s; zero past `k`, and zero rows pad `m` to a whole
/// micro-tile of [`MR`] rows, which a micro-tile reads in full.
pub(crate) struct Rows {
    m: usize,
    k: usize,
    pairs: Vec<u32>,
}

impl Rows {
    /// `a` `[m, k]` row-major, on the calling thread (for products too small to share out:
    /// attention's tiles).
    pub(crate) fn new(a: &[f32], m: usize, k: usize) -> Self {
        let mut rows = Self::zeroed(a, m, k);
        fill(a, k, &mut rows.pairs);
        rows
    }

    /// [`Self::new`] over rayon's threads, a micro-tile's rows to a task.
    fn shared(a: &[f32], m: usize, k: usize) -> Self {
        let mut rows = Self::zeroed(a, m, k);
        if k > 0 {
            rows.pairs
                .par_chunks_mut(MR * k.div_ceil(2))
                .zip(a.par_chunks(MR * k))
                .for_each(|(out, a)| fill(a, k, out));
        }
        rows
    }

    /// Zero pairs for `a`'s `m` rows of `k`, padded to whole micro-tiles.
    fn zeroed(a: &[f32], m: usize, k: usize) -> Self {
        assert_eq!(a.len(), m * k, "the rows' length");
        let pairs = vec![0u32; m.div_ceil(MR) * MR * k.div_ceil(2)];
        Self { m, k, pairs }
    }

    /// The pairs from row `r`'s pair `q` on, for a micro-tile (rows `r .. r + MR`).
    fn at(&self, r: usize, q: usize) -> &[u32] {
        &self.pairs[r * self.k.div_ceil(2) + q..]
    }
}

/// `a`'s rows of `k` into `out`, `k / 2` (rounded up) pairs a row.
fn fill(a: &[f32], k: usize, out: &mut [u32]) {
    if k == 0 {
        return;
    }
    for (row, out) in a.chunks_exact(k).zip(out.chunks_exact_mut(k.div_ceil(2))) {
        to_pairs(row, out);
    }
}

/// `x` rounded to bf16 (ties to even), as pairs into `out` (`x.len() / 2` rounded up).
fn to_pairs(x: &[f32], out: &mut [u32]) {
    assert!(available(), "the bf16 product needs AVX512_BF16");
    // SAFETY: the CPU has the features (asserted above).
    unsafe { to_pairs_avx512(x, out) }
}

/// [`to_pairs`], 32 values to an instruction; the rest one by one (`vcvtne2ps2bf16` flushes
/// subnormals to zero, as the products' `vdpbf16ps` treats them anyway).
#[target_feature(enable = "avx512f,avx512bf16")]
fn to_pairs_avx512(x: &[f32], out: &mut [u32]) {
    assert_eq!(out.len(), x.len().div_ceil(2));
    let whole = x.len() / 32;
    for c in 0..whole {
        // SAFETY: 32 values from `32c` lie in `x`, 16 pairs from `16c` in `out`.
        unsafe {
            let lo = _mm512_loadu_ps(x.as_ptr().add(32 * c));
            let hi = _mm512_loadu_ps(x.as_ptr().add(32 * c + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(out.as_mut_ptr().add(16 * c).cast(), v);
        }
    }
    let bits = |x: f32| u32::from(bf16::from_f32(x).to_bits());
    for (o, pair) in out[16 * whole..].iter_mut().zip(x[32 * whole..].chunks(2)) {
        *o = bits(pair[0]) | pair.get(1).map_or(0, |&x| bits(x)) << 16;
    }
}

/// `c (+)= bf16(a)·b[ks, cols]` on the calling thread, unrounded: `a` `[m, ks.len()]`, `b`'s
/// rows `ks` (starting at an even row) and columns `cols` (starting at a panel, a multiple of
/// [`NR`]), `c` row-major with `ldc` values a row, its first `cols.len()` columns written.
/// Only where [`available`]. When `ks` is odd in length, `b`'s next row (if any) meets `a`'s
/// zero padding, so it must be finite.
pub(crate) fn product_on_thread(
    a: &Rows,
    b: &Packed,
    ks: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(available(), "the bf16 product needs AVX512_BF16");
    assert!(
        ks.start.is_multiple_of(2) && ks.end <= b.k && a.k == ks.len(),
        "the rows of b"
    );
    assert!(
        cols.start.is_multiple_of(NR) && cols.end <= b.n,
        "the columns of b"
    );
    let m = a.m;
    if m == 0 || cols.is_empty() {
        return;
    }
    assert!(
        cols.len() <= ldc && c.len() >= (m - 1) * ldc + cols.len(),
        "the output"
    );
    let (kp, kpb) = (a.k.div_ceil(2), b.k.div_ceil(2));
    for (i, p) in (cols.start / NR..cols.end.div_ceil(NR)).enumerate() {
        let width = NR.min(cols.end - p * NR);
        for q0 in (0..kp).step_by(KC) {
            let pairs = KC.min(kp - q0);
            let panel = &b.pairs[(p * kpb + ks.start / 2 + q0) * NR..];
            for t in 0..m.div_ceil(MR) {
                // SAFETY: the CPU has the features (asserted above); the tile reads `pairs`
                // pairs of `MR` rows within `a` (padded to whole tiles) and of `NR` columns
                // within the panel (b's pairs `ks.start / 2 + q0 ..` stay within its `kpb`), and
                // writes rows `MR.min(m − t·MR)` × `width` columns from `t·MR·ldc + i·NR`,
                // inside `c` (asserted above).
                unsafe {
                    micro_tile(
                        a.at(t * MR, q0).as_ptr(),
                        kp,
                        panel.as_ptr(),
                        pairs,
                        c.as_mut_ptr().add(t * MR * ldc + i * NR),
                        ldc,
                        MR.min(m - t * MR),
                        width,
                        accumulate || q0 > 0,
                        false,
                    );
                }
            }
        }
    }
}

/// `c = bf16(a)·b`, its values rounded to bf16 when `round` (as a product in bf16 would give),
/// for `a` row-major `[m, k]` and `c` row-major `[m, n]`. Only where [`available`].
pub(crate) fn product(a: &[f32], m: usize, b: &Packed, c: &mut [f32], round: bool) {
    let (k, n) = (b.k, b.n);
    assert!(available(), "the bf16 product needs AVX512_BF16");
    assert_eq!(a.len(), m * k, "the rows' length");
    assert_eq!(c.len(), m * n, "the output's length");
    if m == 0 {
        return;
    }
    let kp = k.div_ceil(2);
    let rows = Rows::shared(a, m, k);
    let row_tasks = m.div_ceil(MR).div_ceil(TILES_PER_TASK);
    let col_tasks = n.div_ceil(NR).div_ceil(PANELS_PER_TASK);
    let out = SharedOut(c.as_mut_ptr());
    (0..row_tasks * col_tasks).into_par_iter().for_each(|task| {
        let (rt, ct) = (task / col_tasks, task % col_tasks);
        let tiles = rt * TILES_PER_TASK..((rt + 1) * TILES_PER_TASK).min(m.div_ceil(MR));
        let panels = ct * PANELS_PER_TASK..((ct + 1) * PANELS_PER_TASK).min(n.div_ceil(NR));
        for q0 in (0..kp).step_by(KC) {
            let pairs = KC.min(kp - q0);
            for p in panels.clone() {
                let panel = &b.pairs[(p * kp + q0) * NR..];
                let cols = NR.min(n - p * NR);
                for t in tiles.clone() {
                    let tile = rows.at(t * MR, q0);
                    let at = t * MR * n + p * NR;
                    let last = q0 + pairs == kp;
                    // SAFETY: the CPU has the features (asserted above); the tile reads `pairs`
                    // pairs of `MR` and of `NR` values within `rows` and the panel, and writes
                    // `MR.min(m − t·MR)` rows of `cols` values from `at` in `c`, a block no other
                    // task writes (tasks own disjoint tiles × panels).
                    unsafe {
                        micro_tile(
                            tile.as_ptr(),
                            kp,
                            panel.as_ptr(),
                            pairs,
                            out.at(at),
                            n,
                            MR.min(m - t * MR),
                            cols,
                            q0 > 0,
                            round && last,
                        );
                    }
                }
            }
        }
    });
}

/// `c`'s address, shared by tasks that write disjoint blocks of it.
struct SharedOut(*mut f32);
unsafe impl Sync for SharedOut {}
unsafe impl Send for SharedOut {}

impl SharedOut {
    /// The address `i` values on.
    ///
    /// # Safety
    /// Within the output.
    unsafe fn at(&self, i: usize) -> *mut f32 {
        unsafe { self.0.add(i) }
    }
}

/// `c (+)= a·b` for one [`MR`] × [`NR`] tile over `pairs` pairs of rows: `a` `MR` rows of pairs
/// `lda` apart, `b` `[pairs][NR]`, `c` row-major with `ldc`, of which `rows` rows and `cols` columns are
/// written, rounded to bf16 when `round`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn micro_tile(
    a: *const u32,
    lda: usize,
    b: *const u32,
    pairs: usize,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
    round: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for q in 0..pairs {
        // SAFETY (for the loads): within the blocks the caller names.
        let (b0, b1) = unsafe {
            (
                bh(_mm512_loadu_si512(b.add(q * NR).cast())),
                bh(_mm512_loadu_si512(b.add(q * NR + 16).cast())),
            )
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = bh(_mm512_set1_epi32(unsafe { *a.add(r * lda + q) } as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], x, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], x, b1);
        }
    }
    let lanes = |from: usize| -> __mmask16 {
        let n = cols.saturating_sub(from).min(16);
        ((1u32 << n) - 1) as __mmask16
    };
    let masks = [lanes(0), lanes(16)];
    for (r, acc) in acc.iter().enumerate().take(rows) {
        for (h, &mask) in masks.iter().enumerate() {
            if mask == 0 {
                continue;
            }
            // SAFETY: row `r` < `rows`, lanes within `cols`: inside the caller's block.
            unsafe {
                let at = c.add(r * ldc + 16 * h);
                let mut v = acc[h];
                if accumulate {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, at));
                }
                if round {
                    v = round_to_bf16(v);
                }
                _mm512_mask_storeu_ps(at, mask, v);
            }
        }
    }
}

/// The vector's values rounded to the nearest bf16, ties to even, kept in f32 (NaNs stay NaN):
/// what `half`'s conversion and back gives.
#[target_feature(enable = "avx512f")]
fn round_to_bf16(v: __m512) -> __m512 {
    let bits = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    let rounded = _mm512_and_si512(rounded, _mm512_set1_epi32(0xffff_0000_u32 as i32));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    // A NaN keeps its upper half, made quiet.
    let quiet = _mm512_or_si512(
        _mm512_and_si512(bits, _mm512_set1_epi32(0xffff_0000_u32 as i32)),
        _mm512_set1_epi32(0x0040_0000),
    );
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, rounded, quiet))
}

#[inline(always)]
fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reproducible spread of values, a few orders of magnitude wide, some negative.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * 4.0 * if state & 0x300 == 0 { 30.0 } else { 1.0 }
            })
            .collect()
    }

    fn round(x: f32) -> f32 {
        bf16::from_f32(x).to_f32()
    }

    /// Against sums in f64 of the rounded operands' products, with an f32 product's error bound
    /// (`k` roundings of the running sum's magnitude), at shapes with a ragged last tile, panel,
    /// block and pair, for a row-major `b` and a transposed one.
    #[test]
    fn matches_f64_sums_of_the_rounded_products() {
        if !available() {
            // Nor does anything run it on this CPU: products widen to f32 (`cpu_ops`' tests).
            eprintln!("skipped: this CPU lacks AVX512_BF16, which the product runs on");
            return;
        }
        for (m, k, n) in [(1, 1, 1), (13, 7, 33), (37, 301, 70), (100, 257, 129)] {
            let a = values(m * k, 1);
            let b: Vec<bf16> = values(k * n, 2).into_iter().map(bf16::from_f32).collect();
            for transposed in [false, true] {
                // The same logical `[k, n]` matrix either way.
                let data = if transposed {
                    let mut t = vec![bf16::ZERO; k * n];
                    for i in 0..k {
                        for j in 0..n {
                            t[j * k + i] = b[i * n + j];
                        }
                    }
                    t
                } else {
                    b.clone()
                };
                let packed = Packed::new(&data, (k, n), transposed);
                let mut c = vec![f32::NAN; m * n];
                product(&a, m, &packed, &mut c, false);
                let mut rounded = vec![0f32; m * n];
                product(&a, m, &packed, &mut rounded, true);
                for i in 0..m {
                    for j in 0..n {
                        let terms =
                            (0..k).map(|l| round(a[i * k + l]) as f64 * b[l * n + j].to_f64());
                        let want: f64 = terms.clone().sum();
                        let size: f64 = terms.map(f64::abs).sum();
                        let got = c[i * n + j] as f64;
                        let bound = (k as f64 + 1.0) * f32::EPSILON as f64 * size;
                        assert!(
                            (got - want).abs() <= bound,
                            "[{m}, {k}, {n}] transposed {transposed} at ({i}, {j}): {got} against {want}"
                        );
                        assert_eq!(
                            rounded[i * n + j],
                            round(c[i * n + j]),
                            "rounded at ({i}, {j})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rounding_is_halfs() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX512_BF16, which the rounding runs on");
            return;
        }
        let xs = [
            1.0f32,
            1.0 + f32::EPSILON,
            f32::from_bits(0x3f80_8000), // a tie, to even (down)
            f32::from_bits(0x3f81_8000), // a tie, to even (up)
            -3.3e-3,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            0.0,
            -0.0,
            6.1e4,
            -7.7e-21,
            123.456,
            -9.99e30,
            0.1,
        ];
        let mut got = [0f32; 16];
        unsafe {
            _mm512_storeu_ps(
                got.as_mut_ptr(),
                round_to_bf16(_mm512_loadu_ps(xs.as_ptr())),
            )
        };
        for (x, g) in xs.iter().zip(got) {
            assert_eq!(g.to_bits(), round(*x).to_bits(), "{x:e}");
        }
        let nan = unsafe { round_to_bf16(_mm512_set1_ps(f32::NAN)) };
        let mut out = [0f32; 16];
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), nan) };
        assert!(out.iter().all(|x| x.is_nan()));
    }
}
