//! Where the model runs: `cpu` is Burn's `flex` backend (pure Rust, multithreaded, `gemm`
//! matmul; `ndarray` is deprecated and `burn-cpu` needs an LLVM download at build time), `wgpu`
//! is Metal on macOS and Vulkan elsewhere. f32 by default; f16 where the device supports it.

use anyhow::{Result, bail};
use burn::prelude::*;
use burn::tensor::DType;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Cpu,
    Wgpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    F16,
    Bf16,
}

impl Precision {
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F16 => DType::F16,
            Precision::Bf16 => DType::BF16,
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "wgpu" => Ok(Backend::Wgpu),
            other => bail!("unknown backend {other:?} (use cpu or wgpu)"),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Cpu => "cpu",
            Backend::Wgpu => "wgpu",
        })
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        })
    }
}

/// Whether this build has the wgpu backend (the `wgpu` cargo feature).
pub const WGPU_BUILT: bool = cfg!(feature = "wgpu");

/// The device for a backend.
pub fn device(backend: Backend) -> Result<Device> {
    match backend {
        Backend::Cpu => Ok(Device::flex()),
        Backend::Wgpu => wgpu_device(),
    }
}

#[cfg(feature = "wgpu")]
fn wgpu_device() -> Result<Device> {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    // The adapter is picked lazily and a missing one panics inside the runtime: probe once with
    // a tiny computation and turn a failure into an error that says what to install.
    let probe = device.clone();
    let ok = std::panic::catch_unwind(move || {
        let t = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &probe);
        t.sum()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .ok()
    });
    match ok {
        Ok(Some(v)) if v == [3.0] => Ok(device),
        _ => bail!(
            "the wgpu backend found no usable GPU adapter. On Linux without a GPU install a Vulkan \
             driver (Debian/Ubuntu: `apt-get install mesa-vulkan-drivers`, the lavapipe software \
             driver); on macOS wgpu uses Metal"
        ),
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_device() -> Result<Device> {
    bail!(
        "this build has no wgpu backend: rebuild with the `wgpu` feature of decision-train (on by default)"
    )
}

/// Check that `device` computes in `precision`.
pub fn check_precision(device: &Device, backend: Backend, precision: Precision) -> Result<DType> {
    let dtype = precision.dtype();
    if !device.supports_dtype(dtype) {
        let other = [Precision::F16, Precision::Bf16]
            .into_iter()
            .filter(|&p| p != precision && device.supports_dtype(p.dtype()))
            .map(|p| format!("{p}, "))
            .collect::<String>();
        bail!("the {backend} backend does not support {precision} on this machine; use {other}f32");
    }
    Ok(dtype)
}
