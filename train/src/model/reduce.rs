//! Long sums shaped for the GPU. Without autotuning (the default build), Burn 0.22 reduces an
//! axis with one thread per output (burn-cubecl's `reduce_dim` under
//! `KernelReduceStrategy::Unspecified`, and its fused reductions the same), and a whole-tensor sum
//! on a device without float atomics reduces its axes one after another. So a sum over a million
//! elements in one axis is one thread's work there, and over a `[rows, columns]` product output
//! one thread a row. The sums here give each thread a short run instead: the tensor is read as
//! rows of a divisor of its length, each row summed by its own thread, and what is left the same
//! way.

use burn::tensor::{FloatDType, Tensor};

/// The largest divisor of `n` that is at most `cap` (1 when `n` is 0).
pub(crate) fn divisor_up_to(n: usize, cap: usize) -> usize {
    (1..=n.min(cap))
        .rev()
        .find(|k| n.is_multiple_of(*k))
        .unwrap_or(1)
}

/// The sum of `t` in f32, `[1]`: in rows of up to 4 096 elements and then over the rows (one
/// axis where `t` is no longer), so that no thread sums more than about 4 096 values where `t`'s
/// length has a divisor near that.
pub(crate) fn sum(t: Tensor<1>) -> Tensor<1> {
    let n = t.dims()[0];
    let t = t.cast(FloatDType::F32);
    match divisor_up_to(n, 4096) {
        k if k == n => t.sum(),
        k => t.reshape([n / k, k]).sum(),
    }
}

/// The largest element of `t`, `[1]`, in `t`'s dtype: as [`sum`] cuts it. Burn's whole-tensor
/// maximum reduces every axis in turn, a length-one axis too (a launch for nothing).
pub(crate) fn max(t: Tensor<1>) -> Tensor<1> {
    let n = t.dims()[0];
    match divisor_up_to(n, 4096) {
        k if k == n => t.max(),
        k => t.reshape([n / k, k]).max(),
    }
}

/// The sum in f32 of every element of `t`, `[1]`, read once: first over runs of up to 64 elements
/// of its last axis, a thread a run (fused with the cast), then as [`sum`].
pub(crate) fn sum_all<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    let n = t.shape().num_elements();
    let k = divisor_up_to(t.dims()[D - 1], 64);
    let runs = t.reshape([n / k, k]).cast(FloatDType::F32).sum_dim(1);
    sum(runs.reshape([n / k]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn divisors() {
        assert_eq!(divisor_up_to(1, 4096), 1);
        assert_eq!(divisor_up_to(4096, 4096), 4096);
        assert_eq!(divisor_up_to(6100, 4096), 3050);
        assert_eq!(divisor_up_to(16 << 20, 4096), 4096);
        assert_eq!(divisor_up_to(4099, 4096), 1); // a prime: one axis of its own length
        assert_eq!(divisor_up_to(9728, 64), 64);
        assert_eq!(divisor_up_to(0, 64), 1);
    }

    /// Every way of cutting a tensor into runs and rows sums what the host sums in f64, and finds
    /// its largest element.
    #[test]
    fn sums_equal_the_hosts() {
        let device = Device::flex();
        for (rows, cols) in [(1, 1), (3, 7), (61, 100), (5, 4099), (2, 9000), (70, 128)] {
            let data: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
                .collect();
            let want: f64 = data.iter().map(|&x| x as f64).sum();
            let data_max = data.iter().copied().fold(f32::MIN, f32::max);
            let t = Tensor::<2>::from_data(TensorData::new(data, [rows, cols]), &device);
            let all = sum_all(t.clone()).into_scalar::<f32>() as f64;
            let flat = sum(t.clone().reshape([rows * cols])).into_scalar::<f32>() as f64;
            for got in [all, flat] {
                assert!(
                    (got - want).abs() < 1e-4,
                    "{rows} x {cols}: {got} vs {want}"
                );
            }
            let largest = max(t.reshape([rows * cols])).into_scalar::<f32>();
            assert_eq!(largest, data_max, "{rows} x {cols}");
        }
    }
}
