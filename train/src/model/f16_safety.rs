//! Training on an f16 base safely. f16 has f32's precision budget cut to 11 bits and its range
//! cut to ±65 504, and a LoRA run over a frozen f16 base meets that range in two places:
//!
//! - **A frozen product overflows** in the forward pass: its output (or its input, cast down)
//!   passes 65 504, as the large-activation channels of Qwen-family `down_proj`s do. Every f16
//!   product is checked on the device ([`ProductChecks`]: one flag per product, read once per
//!   micro-batch), and a product that came out non-finite is named by its checkpoint path. By
//!   `[train] f16_overflow`, that projection is computed in f32 from then on ([`promote`]: its
//!   frozen weight cast up; the trainer redoes the micro-batch, logs it in `metrics.jsonl` and
//!   keeps it in every checkpoint), or the run stops naming it and the settings that avoid it.
//! - **Gradients underflow** as they flow back through the f16 products (below 6e-8 they flush
//!   to zero) or overflow when large. Dynamic loss scaling ([`LossScaler`], PyTorch's
//!   `GradScaler`): the loss is multiplied by a scale before the backward pass and the gradients
//!   divided by it after; a step whose gradients are not finite is skipped and the scale halves,
//!   and after `GROWTH_INTERVAL` good steps in a row it doubles.
//!
//! bf16 keeps f32's range, so neither applies to it; `[train] loss_scale = "auto"` scales only
//! for an f16 base.

use std::cell::{Cell, RefCell};

use anyhow::{Context, Result, bail};
use burn::tensor::{DType, FloatDType, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::qwen3::{Proj, Qwen3};
use crate::model::reduce;

/// `[train] f16_overflow`: what a frozen f16 product that overflows does to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum F16Overflow {
    /// Compute that projection in f32 from then on (its weight takes twice the memory).
    #[default]
    F32,
    /// Stop the run, naming the projection and the settings that avoid it.
    Stop,
}

/// `[train] loss_scale`: dynamic loss scaling of the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossScaleMode {
    /// On for an f16 base, off otherwise.
    #[default]
    Auto,
    Dynamic,
    Off,
}

impl LossScaleMode {
    /// Whether a run whose base computes in `dtype` scales its loss.
    pub fn applies(self, dtype: DType) -> bool {
        match self {
            LossScaleMode::Auto => dtype == DType::F16,
            LossScaleMode::Dynamic => true,
            LossScaleMode::Off => false,
        }
    }
}

/// The dynamic loss scale, as `torch.amp.GradScaler` keeps it with its defaults: it starts at
/// 2^16, halves on every step whose gradients are not finite, and doubles after
/// [`LossScaler::GROWTH_INTERVAL`] finite steps in a row. Saved in every checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct LossScaler {
    pub scale: f32,
    /// Finite steps since the scale last changed.
    pub good_steps: u32,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self {
            scale: 65536.0,
            good_steps: 0,
        }
    }
}

impl LossScaler {
    pub(crate) const GROWTH_INTERVAL: u32 = 2000;

    /// After a step: `finite` says whether its gradients were. Returns whether to apply it.
    pub fn update(&mut self, finite: bool) -> bool {
        if !finite {
            self.scale *= 0.5;
            self.good_steps = 0;
            return false;
        }
        self.good_steps += 1;
        if self.good_steps >= Self::GROWTH_INTERVAL {
            self.scale *= 2.0;
            self.good_steps = 0;
        }
        true
    }
}

/// The device-side checks of one forward pass's f16 products: for each, the f32 sum of its output,
/// which is finite exactly when every element is. Nothing is read from the device until
/// [`Self::overflowed`].
#[derive(Default)]
pub struct ProductChecks {
    layer: Cell<usize>,
    sums: RefCell<Vec<(usize, &'static str, Tensor<1>)>>,
}

impl ProductChecks {
    pub fn new() -> Self {
        Self::default()
    }

    /// The decoder layer whose products come next.
    pub(crate) fn at_layer(&self, layer: usize) {
        self.layer.set(layer);
    }

    /// Check `y`, the f16 output of projection `proj` (`mlp.down_proj`), on the device.
    ///
    /// Its sum in f32 stands for it: f16 values are at most 65 504 in size, so no sum of fewer
    /// than 2^111 of them leaves f32's range, while an infinity or a NaN carries through every
    /// addition (`inf + -inf` is a NaN). So the sum is finite exactly when the output is. It
    /// reads `y` once, in runs of 64 a thread ([`reduce::sum_all`]), where `is_finite().any()`
    /// wrote a flag for every element and reduced the flags a column a thread.
    pub fn record<const D: usize>(&self, proj: &'static str, y: &Tensor<D>) {
        let sum = reduce::sum_all(y.clone());
        self.sums.borrow_mut().push((self.layer.get(), proj, sum));
    }

    /// The checkpoint paths (`model.layers.3.mlp.down_proj`) of the products whose output was
    /// not finite, in the order they ran: one read from the device for all of them, and one more
    /// where any was not.
    pub fn overflowed(&self) -> Vec<String> {
        let sums = self.sums.take();
        // Their total (far inside f32's range while they are finite) is the one value read when
        // every product was finite; only a step that overflowed reads them all to name it.
        let Some(total) = sums.iter().map(|(_, _, s)| s.clone()).reduce(|a, b| a + b) else {
            return Vec::new();
        };
        if total.into_scalar::<f32>().is_finite() {
            return Vec::new();
        }
        let names: Vec<(usize, &str)> = sums.iter().map(|(l, p, _)| (*l, *p)).collect();
        let all = Tensor::cat(sums.into_iter().map(|(_, _, s)| s).collect(), 0)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("sums read back as f32");
        names
            .into_iter()
            .zip(all)
            .filter(|(_, s)| !s.is_finite())
            .map(|((layer, proj), _)| format!("model.layers.{layer}.{proj}"))
            .collect()
    }
}

/// The projection at checkpoint path `name` (`model.layers.3.mlp.down_proj`).
fn projection_mut<'a>(model: &'a mut Qwen3, name: &str) -> Result<&'a mut Proj> {
    let rest = name
        .strip_prefix("model.layers.")
        .with_context(|| format!("{name:?} is not a decoder layer's projection"))?;
    let (layer, path) = rest
        .split_once('.')
        .with_context(|| format!("{name:?} names no projection"))?;
    let layer: usize = layer
        .parse()
        .with_context(|| format!("{name:?}: layer {layer:?} is not a number"))?;
    if layer >= model.model.layers.len() {
        bail!(
            "{name:?}: the model has {} layers",
            model.model.layers.len()
        );
    }
    model.model.layers[layer]
        .projections_mut()
        .into_iter()
        .find(|(p, _)| *p == path)
        .map(|(_, proj)| proj)
        .with_context(|| format!("{name:?} names no projection"))
}

/// Compute the projections `names` in f32 from now on: their frozen weights (and biases) cast
/// up. The adapters are f32 already; the others stay as they are.
pub(crate) fn promote(model: &mut Qwen3, names: &[String]) -> Result<()> {
    for name in names {
        let proj = projection_mut(model, name)?;
        proj.weight = proj.weight.clone().map(|t| t.cast(FloatDType::F32));
        if let Some(b) = proj.bias.take() {
            proj.bias = Some(b.map(|t| t.cast(FloatDType::F32)));
        }
    }
    Ok(())
}

/// The error of a run whose f16 product overflowed under `f16_overflow = "stop"`.
pub(crate) fn overflow_error(names: &[String], step: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "at step {step} the f16 product of {} overflowed (an output or input beyond f16's \
         65 504): set `--set train.f16_overflow=f32` to compute {} in f32, or `--set \
         train.dtype=bf16` (f32's range) where the device computes bf16, or `--set \
         train.dtype=f32`",
        names.join(", "),
        if names.len() == 1 {
            "that projection"
        } else {
            "those projections"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// f16 outputs `[4, 96]` all 60 000 but for `bad` at row 2, column 70: each row sums to
    /// 5.76e6, far past f16's range, and only the non-finite ones are named, in layer order.
    #[test]
    fn checks_name_exactly_the_products_with_an_infinity_or_a_nan() {
        let device = Device::flex();
        let output = |bad: Option<f32>| {
            let mut data = vec![60_000.0f32; 4 * 96];
            if let Some(b) = bad {
                data[2 * 96 + 70] = b;
            }
            Tensor::<2>::from_data(TensorData::new(data, [4, 96]), &device).cast(DType::F16)
        };
        let checks = ProductChecks::new();
        for (layer, proj, bad) in [
            (0, "self_attn.q_proj", None),
            (0, "mlp.down_proj", Some(f32::INFINITY)),
            (1, "mlp.up_proj", Some(f32::NAN)),
            (2, "mlp.gate_proj", Some(f32::NEG_INFINITY)),
            (3, "mlp.down_proj", Some(-65_504.0)),
        ] {
            checks.at_layer(layer);
            checks.record(proj, &output(bad));
        }
        assert_eq!(
            checks.overflowed(),
            [
                "model.layers.0.mlp.down_proj",
                "model.layers.1.mlp.up_proj",
                "model.layers.2.mlp.gate_proj"
            ]
        );
        // Both infinities in one output sum to a NaN, still named; all finite, none.
        let checks = ProductChecks::new();
        let mut data = vec![1.0f32; 3 * 64];
        data[5] = f32::INFINITY;
        data[100] = f32::NEG_INFINITY;
        let y = Tensor::<3>::from_data(TensorData::new(data, [1, 3, 64]), &device);
        checks.record("self_attn.o_proj", &y.cast(DType::F16));
        checks.record("self_attn.k_proj", &output(None));
        assert_eq!(checks.overflowed(), ["model.layers.0.self_attn.o_proj"]);
        checks.record("self_attn.k_proj", &output(None));
        assert!(checks.overflowed().is_empty());
        assert!(
            checks.overflowed().is_empty(),
            "nothing recorded, nothing read"
        );
    }

    #[test]
    fn the_scale_halves_on_overflow_and_doubles_after_a_run_of_good_steps() {
        let mut s = LossScaler::default();
        assert_eq!(s.scale, 65536.0);
        assert!(!s.update(false));
        assert!(!s.update(false));
        assert_eq!(s.scale, 16384.0);
        for _ in 0..LossScaler::GROWTH_INTERVAL - 1 {
            assert!(s.update(true));
        }
        assert_eq!(s.scale, 16384.0);
        assert!(s.update(true));
        assert_eq!((s.scale, s.good_steps), (32768.0, 0));
        // an overflow restarts the count
        for _ in 0..10 {
            s.update(true);
        }
        s.update(false);
        assert_eq!((s.scale, s.good_steps), (16384.0, 0));
    }

    #[test]
    fn auto_scales_only_an_f16_base() {
        assert!(LossScaleMode::Auto.applies(DType::F16));
        assert!(!LossScaleMode::Auto.applies(DType::BF16));
        assert!(!LossScaleMode::Auto.applies(DType::F32));
        assert!(LossScaleMode::Dynamic.applies(DType::F32));
        assert!(!LossScaleMode::Off.applies(DType::F16));
    }
}
