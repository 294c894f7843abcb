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

/// The adapter wgpu chose, as `decision` reports it on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// As the driver names it: `NVIDIA GeForce RTX 4090`, `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// wgpu's device type: `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    /// The graphics API: `Vulkan`, `Metal`, `Dx12`, `Gl`.
    pub backend: String,
    /// The driver and its details (`llvmpipe`, `Mesa 22.3.6 (LLVM 15.0.6)`); may be empty.
    pub driver: String,
    pub driver_info: String,
}

/// Names of software rasterisers (lowercase), for drivers that do not report device type `Cpu`;
/// Windows' WARP counts too, matched as a whole word.
const SOFTWARE_ADAPTERS: [&str; 5] = [
    "llvmpipe",
    "lavapipe",
    "softpipe",
    "swiftshader",
    "microsoft basic render",
];

impl AdapterSummary {
    /// A CPU or software adapter (Mesa's llvmpipe / lavapipe, SwiftShader, Windows' WARP): the
    /// "GPU" is the processor, and Burn's `flex` backend does the same work far faster.
    pub fn is_software(&self) -> bool {
        if self.device_type == "Cpu" {
            return true;
        }
        let text = format!("{} {} {}", self.name, self.driver, self.driver_info).to_lowercase();
        SOFTWARE_ADAPTERS.iter().any(|s| text.contains(s))
            || text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == "warp")
    }

    /// `"NAME" (TYPE, BACKEND; driver DRIVER, INFO)`.
    pub fn describe(&self) -> String {
        let driver = [self.driver.as_str(), self.driver_info.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        let mut s = format!("{:?} ({}, {}", self.name, self.device_type, self.backend);
        if !driver.is_empty() {
            s += &format!("; driver {driver}");
        }
        s + ")"
    }

    /// What `decision` prints on stderr once the adapter is up: the adapter, and for a software
    /// one a warning that `--backend cpu` is faster.
    pub fn report(&self) -> Vec<String> {
        let mut lines = vec![format!("wgpu adapter: {}", self.describe())];
        if self.is_software() {
            lines.push(
                "warning: this wgpu adapter is a software rasteriser running on the CPU, not a \
                 GPU: it is much slower than `--backend cpu` (the same model, same answers); use \
                 --backend cpu, or install the GPU's Vulkan driver"
                    .to_string(),
            );
        }
        lines
    }
}

#[cfg(feature = "wgpu")]
impl From<&burn::tensor::wgpu::wgpu::AdapterInfo> for AdapterSummary {
    fn from(i: &burn::tensor::wgpu::wgpu::AdapterInfo) -> Self {
        AdapterSummary {
            name: i.name.clone(),
            device_type: format!("{:?}", i.device_type),
            backend: format!("{:?}", i.backend),
            driver: i.driver.clone(),
            driver_info: i.driver_info.clone(),
        }
    }
}

/// The wgpu device and its adapter, brought up once per process (the runtime can be initialised
/// only once; every later model shares the device).
#[cfg(feature = "wgpu")]
static WGPU: std::sync::OnceLock<std::result::Result<(Device, AdapterSummary), String>> =
    std::sync::OnceLock::new();

/// The adapter the wgpu backend runs on, once [`device`] has brought it up.
#[cfg(feature = "wgpu")]
pub fn wgpu_adapter() -> Option<AdapterSummary> {
    WGPU.get()?.as_ref().ok().map(|(_, a)| a.clone())
}

#[cfg(not(feature = "wgpu"))]
pub fn wgpu_adapter() -> Option<AdapterSummary> {
    None
}

#[cfg(feature = "wgpu")]
fn wgpu_device() -> Result<Device> {
    let up = WGPU.get_or_init(|| {
        let r = init_wgpu();
        if let Ok((_, adapter)) = &r {
            for line in adapter.report() {
                eprintln!("{line}");
            }
        }
        r
    });
    match up {
        Ok((device, _)) => Ok(device.clone()),
        Err(why) => bail!(
            "the wgpu backend found no usable GPU adapter ({why}). On Linux without a GPU install \
             a Vulkan driver (Debian/Ubuntu: `apt-get install mesa-vulkan-drivers`, the lavapipe \
             software driver, slower than --backend cpu); on macOS wgpu uses Metal"
        ),
    }
}

/// Bring up the default wgpu device, keeping the adapter wgpu chose, and check it computes.
#[cfg(feature = "wgpu")]
fn init_wgpu() -> std::result::Result<(Device, AdapterSummary), String> {
    // A missing adapter can panic inside the runtime: turn that into an error too.
    let init = std::panic::catch_unwind(|| {
        let (device, setup) = Device::wgpu_options()
            .device_kind(burn::tensor::DeviceKind::DefaultDevice)
            .init_with_setup()
            .map_err(|e| e.to_string())?;
        let adapter = AdapterSummary::from(&setup.adapter.get_info());
        let t = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &device);
        let sum = t
            .sum()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| format!("{e:?}"))?;
        if sum != [3.0] {
            return Err(format!(
                "adapter {} computed 1 + 2 = {sum:?}",
                adapter.describe()
            ));
        }
        Ok((device, adapter))
    });
    match init {
        Ok(r) => r,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the runtime panicked".into())),
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_device() -> Result<Device> {
    bail!(
        "this build has no wgpu backend: rebuild with the `wgpu` feature of decision-train (on by default)"
    )
}

/// Whether to switch off Mesa's device-select Vulkan layer for this process: only on a headless
/// machine where it has nothing to select with, and only when the user has not configured it.
///
/// Every Mesa install enables that implicit layer; to learn which GPU drives the display it
/// connects to Wayland, and with no `XDG_RUNTIME_DIR` libwayland-client prints "error:
/// XDG_RUNTIME_DIR is invalid or not set in the environment." for every Vulkan instance wgpu
/// makes (four per run). Without `WAYLAND_DISPLAY`, `DISPLAY` and `XDG_RUNTIME_DIR` the layer
/// finds no display, so turning it off (`NODEVICE_SELECT=1`, the switch its manifest names)
/// changes nothing but the noise; `MESA_VK_DEVICE_SELECT` or `NODEVICE_SELECT` already set
/// leave it as the user has it.
pub fn headless_device_select_off(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.is_empty());
    cfg!(target_os = "linux")
        && WGPU_BUILT
        && !["WAYLAND_DISPLAY", "DISPLAY", "XDG_RUNTIME_DIR"]
            .into_iter()
            .any(set)
        && var("MESA_VK_DEVICE_SELECT").is_none()
        && var("NODEVICE_SELECT").is_none()
}

/// Set `NODEVICE_SELECT=1` when [`headless_device_select_off`] says so.
///
/// # Safety
///
/// Changes the process environment: call it at the start of `main`, before any thread exists
/// (nothing may read the environment concurrently).
pub unsafe fn quiet_headless_vulkan() {
    if headless_device_select_off(|k| std::env::var_os(k)) {
        // SAFETY: the caller guarantees no other thread exists yet.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(name: &str, device_type: &str, driver: &str, info: &str) -> AdapterSummary {
        AdapterSummary {
            name: name.into(),
            device_type: device_type.into(),
            backend: "Vulkan".into(),
            driver: driver.into(),
            driver_info: info.into(),
        }
    }

    #[test]
    fn software_adapters_are_told_from_gpus() {
        let software = [
            // Mesa's lavapipe, as wgpu reports it
            adapter(
                "llvmpipe (LLVM 15.0.6, 256 bits)",
                "Cpu",
                "llvmpipe",
                "Mesa 22.3.6 (LLVM 15.0.6)",
            ),
            // the same driver behind a loader that calls it something else
            adapter("llvmpipe (LLVM 19.1.7, 256 bits)", "Other", "", ""),
            adapter("SwiftShader Device (Subzero)", "Cpu", "", ""),
            adapter("SwiftShader Device (LLVM 10.0.0)", "VirtualGpu", "", ""),
            adapter("Microsoft Basic Render Driver", "Other", "", ""),
            adapter("WARP (software)", "Other", "", ""),
            adapter("some adapter", "Cpu", "", ""),
        ];
        for a in &software {
            assert!(a.is_software(), "{a:?}");
            let r = a.report();
            assert_eq!(r.len(), 2, "{r:?}");
            assert!(r[0].contains(&a.name) && r[0].contains(&a.device_type));
            assert!(r[1].contains("slower than `--backend cpu`"), "{r:?}");
        }
        let gpus = [
            adapter(
                "NVIDIA GeForce RTX 4090",
                "DiscreteGpu",
                "NVIDIA",
                "550.54.14",
            ),
            adapter("Apple M2 Max", "IntegratedGpu", "", ""),
            adapter(
                "AMD Radeon Graphics (RADV GFX1103_R1)",
                "IntegratedGpu",
                "radv",
                "Mesa 24.0.5",
            ),
            adapter(
                "Intel(R) Arc(tm) A770 Graphics (DG2)",
                "DiscreteGpu",
                "Intel open-source Mesa driver",
                "Mesa 23.2.1",
            ),
            // a name that merely contains the letters of one
            adapter("Warpdrive X1", "DiscreteGpu", "", ""),
        ];
        for a in &gpus {
            assert!(!a.is_software(), "{a:?}");
            assert_eq!(a.report().len(), 1);
        }
        assert_eq!(
            software[0].describe(),
            "\"llvmpipe (LLVM 15.0.6, 256 bits)\" (Cpu, Vulkan; driver llvmpipe, Mesa 22.3.6 \
             (LLVM 15.0.6))"
        );
    }

    #[test]
    fn device_select_is_switched_off_only_when_headless_and_unconfigured() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let headless = cfg!(target_os = "linux") && WGPU_BUILT;
        assert_eq!(headless_device_select_off(env(&[])), headless);
        assert_eq!(
            headless_device_select_off(env(&[("XDG_RUNTIME_DIR", "")])),
            headless
        );
        for configured in [
            &[("XDG_RUNTIME_DIR", "/run/user/1000")][..],
            &[("WAYLAND_DISPLAY", "wayland-0")],
            &[("DISPLAY", ":0")],
            &[("MESA_VK_DEVICE_SELECT", "1002:73bf")],
            &[("NODEVICE_SELECT", "0")],
        ] {
            assert!(
                !headless_device_select_off(env(configured)),
                "{configured:?}"
            );
        }
    }
}
