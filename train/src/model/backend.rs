//! Where the model runs: `cpu` is Burn's `flex` backend (pure Rust, multithreaded, `gemm`
//! matmul; `ndarray` is deprecated and `burn-cpu` needs an LLVM download at build time), `wgpu`
//! is the GPU through wgpu, its kernels compiled by the shader compiler each platform's GPUs are
//! best served by: MSL on macOS (Metal), SPIR-V elsewhere (Vulkan), WGSL only as the fallback for
//! an adapter neither serves (train/Cargo.toml chooses per target). The precision is f32 unless
//! asked; `auto` takes the narrowest float the device computes (bf16, else f16, else f32).

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

/// The dtype of the frozen weights and their products. `Auto` is resolved against the device
/// ([`resolve_precision`]) before anything is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 where the device computes it (f32's range), else f16, else f32.
    Auto,
    #[default]
    F32,
    F16,
    Bf16,
}

impl Precision {
    /// The concrete precisions in the order `auto` prefers them: half the memory of f32 first,
    /// and of the two halves bf16, whose range is f32's (f16 overflows at 65 504).
    pub(crate) const PREFERENCE: [Precision; 3] = [Precision::Bf16, Precision::F16, Precision::F32];

    /// `bf16, f16, f32`: precisions as messages list them.
    pub fn names(ps: &[Precision]) -> String {
        ps.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The tensor dtype; `None` for `auto`, which names no dtype until it is resolved.
    pub fn dtype(self) -> Option<DType> {
        match self {
            Precision::Auto => None,
            Precision::F32 => Some(DType::F32),
            Precision::F16 => Some(DType::F16),
            Precision::Bf16 => Some(DType::BF16),
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
            Precision::Auto => "auto",
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        })
    }
}

/// The device for a backend.
pub fn device(backend: Backend) -> Result<Device> {
    match backend {
        Backend::Cpu => Ok(Device::flex()),
        Backend::Wgpu => wgpu_device(),
    }
}

/// The adapter wgpu chose and what Burn's GPU runtime makes of it, as `decision` reports it on
/// stderr.
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
    /// The shader compiler the kernels go through: `SPIR-V` (Vulkan), `MSL` (Metal), or `WGSL`
    /// where the adapter lacks what the native one needs.
    pub compiler: String,
    /// The precisions the device computes, in [`Precision::PREFERENCE`] order (f32 always).
    pub precisions: Vec<Precision>,
    /// Cooperative-matrix (tensor-core) shapes the matmul kernels may use; 0 for none.
    pub cooperative_matrix: usize,
    /// The largest device-local memory heap, where the runtime reports one (Vulkan does).
    pub memory: Option<u64>,
    /// The largest single buffer the runtime allocates (the adapter's storage-buffer binding
    /// limit, or its largest buffer if smaller): every tensor must fit one.
    pub largest_buffer: Option<u64>,
    /// The most buffers one kernel binds ([`max_bindings`]).
    pub max_bindings: Option<u32>,
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

    /// `SPIR-V on "NAME"`: the compiler and the adapter, for messages.
    pub fn short(&self) -> String {
        format!("{} on {:?}", self.compiler, self.name)
    }

    /// What `decision` prints on stderr once the adapter is up: the adapter; the compiler, the
    /// precisions, tensor cores and memory; for a software adapter a warning that `--backend
    /// cpu` is faster.
    pub fn report(&self) -> Vec<String> {
        let missing: Vec<Precision> = Precision::PREFERENCE
            .into_iter()
            .filter(|p| !self.precisions.contains(p))
            .collect();
        let mut kernels = format!(
            "wgpu kernels: {} compiler; computes {}",
            self.compiler,
            Precision::names(&self.precisions)
        );
        if !missing.is_empty() {
            kernels += &format!(" (not {})", Precision::names(&missing));
        }
        kernels += &match self.cooperative_matrix {
            0 => "; no cooperative-matrix (tensor-core) matmul".to_string(),
            n => format!("; cooperative-matrix (tensor-core) matmul, {n} shapes"),
        };
        if let Some(bytes) = self.memory {
            kernels += &format!(
                "; {:.2} GiB device memory",
                bytes as f64 / (1u64 << 30) as f64
            );
        }
        if let Some(bytes) = self.largest_buffer {
            kernels += &format!("; buffers up to {}", crate::plan::size(bytes));
        }
        if let Some(n) = self.max_bindings {
            kernels += &format!(", {n} bound a kernel");
        }
        let mut lines = vec![
            format!("wgpu adapter: {}", self.describe()),
            kernels,
            matmul_line(AUTOTUNE),
        ];
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

    fn from_info(i: &burn::tensor::wgpu::wgpu::AdapterInfo, device: &Device) -> Self {
        let (compiler, cooperative_matrix, memory) = runtime_facts(device);
        let largest_buffer = largest_buffer(device);
        let max_bindings = max_bindings(device);
        AdapterSummary {
            name: i.name.clone(),
            device_type: format!("{:?}", i.device_type),
            backend: format!("{:?}", i.backend),
            driver: i.driver.clone(),
            driver_info: i.driver_info.clone(),
            compiler,
            precisions: supported_precisions(device),
            cooperative_matrix,
            memory,
            largest_buffer,
            max_bindings,
        }
    }
}

/// Whether this build autotunes the GPU's kernels (the `gpu-autotune` feature, off by default:
/// train/Cargo.toml says why).
pub const AUTOTUNE: bool = cfg!(feature = "gpu-autotune");

/// The report's line on how the GPU's matrix products are chosen in this build.
fn matmul_line(autotune: bool) -> String {
    if autotune {
        "wgpu matmuls: autotuned (each new shape compiles and times Burn's candidate kernels \
         first)"
            .to_string()
    } else {
        "wgpu matmuls: Burn's default kernel per product, untuned (a build with `--features \
         gpu-autotune` times Burn's candidates per shape instead)"
            .to_string()
    }
}

/// The GPU runtime's own account of `device`: the shader compiler its kernels go through (from
/// the runtime's name, `wgpu<spirv>`), the cooperative-matrix shapes it registered, and the
/// memory it reports.
fn runtime_facts(device: &Device) -> (String, usize, Option<u64>) {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => {
            let client = cube.client();
            let name = client.name();
            let compiler = match name {
                n if n.contains("spirv") => "SPIR-V",
                n if n.contains("msl") => "MSL",
                n if n.contains("wgsl") => "WGSL",
                other => other,
            };
            let props = client.properties();
            (
                compiler.to_string(),
                props.features.matmul.cmma.len(),
                props.memory.max_memory(),
            )
        }
        _ => ("none".to_string(), 0, None),
    }
}

/// What the GPU runtime holds of `device`'s memory now: the bytes it has reserved from the
/// driver (its pools' pages, kept for reuse, so the most it has needed so far: what the driver
/// counts against the process, less its own context) and the bytes live tensors use. `None` on
/// the CPU backend. A round trip to the runtime's device thread; it waits for no kernel.
pub fn gpu_memory(device: &Device) -> Option<GpuMemory> {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => {
            let report = cube
                .client()
                .memory_report(burn::cubecl::MemoryScope::Device);
            let usage = report.usage();
            Some(GpuMemory {
                reserved: usage.bytes_reserved,
                in_use: usage.bytes_in_use,
                own_buffers: report
                    .streams
                    .iter()
                    .map(|s| s.pools.persistent.usage.bytes_reserved)
                    .sum(),
            })
        }
        _ => None,
    }
}

/// The largest single buffer the GPU runtime allocates on `device`; `None` on the CPU backend.
pub fn largest_buffer(device: &Device) -> Option<u64> {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => {
            Some(cube.client().properties().memory.max_page_size)
        }
        _ => None,
    }
}

/// The most buffers one kernel binds on `device`, as Burn's fusion counts them when it joins
/// operations into a kernel: the adapter's storage buffers a shader stage, less the one wgpu
/// keeps for itself (15 on llvmpipe's OpenGL, 28 through Metal, thousands through an NVIDIA
/// GPU's Vulkan). `None` on the CPU backend.
pub fn max_bindings(device: &Device) -> Option<u32> {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => {
            Some(cube.client().properties().hardware.max_bindings)
        }
        _ => None,
    }
}

/// [`gpu_memory`]'s answer, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    pub reserved: u64,
    pub in_use: u64,
    /// Of `reserved`, the buffers of their own that weights loaded to stay as they are take
    /// (`LoadOptions::trains`), outside the pools.
    pub own_buffers: u64,
}

/// The wgpu device and its adapter, brought up once per process (the runtime can be initialised
/// only once; every later model shares the device).
static WGPU: std::sync::OnceLock<std::result::Result<(Device, AdapterSummary), String>> =
    std::sync::OnceLock::new();

/// The adapter the wgpu backend runs on, once [`device`] has brought it up.
pub fn wgpu_adapter() -> Option<AdapterSummary> {
    WGPU.get()?.as_ref().ok().map(|(_, a)| a.clone())
}

fn wgpu_device() -> Result<Device> {
    let up = WGPU.get_or_init(|| {
        let r = init_wgpu();
        if let Ok((_, adapter)) = &r {
            super::gpu_watch::install();
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

/// The Vulkan extension without which cubecl's SPIR-V compiler (0.11.3, and its main branch as of
/// August 2026) declares workgroup (shared) memory as a pointer to a pointer: `spirv-val` rejects
/// such kernels and Mesa's lavapipe crashes compiling them. NVIDIA's, AMD's (RADV) and Intel's
/// (ANV) drivers have it; lavapipe (Mesa 22.3 to 25.0) does not.
const SPIRV_NEEDS: &std::ffi::CStr = c"VK_KHR_workgroup_memory_explicit_layout";

/// Whether `adapter` lacks what the SPIR-V kernels need ([`SPIRV_NEEDS`]): only a Vulkan adapter
/// can, and only on the SPIR-V compiler.
#[cfg(not(target_os = "macos"))]
fn spirv_unsafe(adapter: &burn::tensor::wgpu::wgpu::Adapter, compiler: &str) -> bool {
    use burn::tensor::wgpu::wgpu::hal;
    if compiler != "SPIR-V" {
        return false;
    }
    // SAFETY: the hal adapter is only read, while `adapter` is alive.
    let hal_adapter = unsafe { adapter.as_hal::<hal::api::Vulkan>() };
    hal_adapter.is_some_and(|a| {
        !a.physical_device_capabilities()
            .supports_extension(SPIRV_NEEDS)
    })
}

#[cfg(target_os = "macos")]
fn spirv_unsafe(_: &burn::tensor::wgpu::wgpu::Adapter, _: &str) -> bool {
    false
}

/// The most independent blocks of operations Burn's fusion planner (burn-fusion 0.22.1) weighs in
/// one stretch (`[fusion.beam_search] max_blocks`), where Burn's default is 5. With 5, the plans it
/// built for a GPU training step's stretches (the replay of a layer's second half on the tape,
/// the loss head's backward) held fused blocks that depend on each other, and it ran each such
/// stretch one launch per operation (`[repair] falling back to unfused stream order`); with 3 no
/// stretch of a training step or of scoring falls back, and a step launches 9 to 11 % fewer kernels
/// (docs/results.md, "Fewer blocks for Burn's fusion planner").
const FUSION_BLOCKS: usize = 3;

/// Burn's runtime configuration as a `burn.toml` in the working folder (or above it) and Burn's
/// environment variables give it, with [`FUSION_BLOCKS`] where they leave `max_blocks` at Burn's
/// default (a `burn.toml` that sets another value keeps it). Set before any fused operation runs;
/// a configuration Burn has already read stays.
fn plan_fusion() {
    use burn::cubecl::config::RuntimeConfig;
    let as_toml = |c: &burn::BurnConfig| toml::Value::try_from(c).ok();
    fn blocks(v: &mut toml::Value) -> Option<&mut toml::Value> {
        v.get_mut("fusion")?
            .get_mut("beam_search")?
            .get_mut("max_blocks")
    }
    let (Some(mut read), Some(mut default)) = (
        as_toml(&burn::BurnConfig::from_current_dir().override_from_env()),
        as_toml(&burn::BurnConfig::default()),
    ) else {
        return;
    };
    let burns = blocks(&mut default).cloned();
    match blocks(&mut read) {
        Some(b) if Some(&*b) == burns.as_ref() => *b = toml::Value::Integer(FUSION_BLOCKS as i64),
        _ => return,
    }
    if let Ok(config) = read.try_into::<burn::BurnConfig>() {
        burn::BurnConfig::try_set(config);
    }
}

/// Bring up the default wgpu device, keeping the adapter wgpu chose, and check it computes. A
/// Vulkan adapter whose SPIR-V kernels would be invalid ([`spirv_unsafe`]) is left before any
/// kernel runs on it, for the same GPU through the next graphics API (OpenGL on Linux, Direct3D
/// 12 on Windows), where the kernels are compiled from WGSL.
fn init_wgpu() -> std::result::Result<(Device, AdapterSummary), String> {
    use burn::tensor::wgpu::WgpuBackend;
    let up = |api: WgpuBackend| {
        Device::wgpu_options()
            .device_kind(burn::tensor::DeviceKind::DefaultDevice)
            .graphics_api(api)
            .init_with_setup()
            .map_err(|e| e.to_string())
    };
    plan_fusion();
    // A missing adapter can panic inside the runtime: turn that into an error too.
    let init = std::panic::catch_unwind(|| {
        let (mut device, mut setup) = up(WgpuBackend::Auto)?;
        let first = runtime_facts(&device).0;
        if spirv_unsafe(&setup.adapter, &first) {
            let fallback = if cfg!(windows) {
                WgpuBackend::Dx12
            } else {
                WgpuBackend::Gl
            };
            eprintln!(
                "note: the Vulkan driver of {:?} lacks {}, without which Burn's SPIR-V kernels \
                 are invalid (cubecl 0.11.3); running WGSL kernels through {fallback:?} instead",
                setup.adapter.get_info().name,
                SPIRV_NEEDS.to_string_lossy(),
            );
            (device, setup) = up(fallback).map_err(|e| {
                format!(
                    "the Vulkan driver lacks {}, and {fallback:?} has no adapter either: {e}",
                    SPIRV_NEEDS.to_string_lossy()
                )
            })?;
        }
        let adapter = AdapterSummary::from_info(&setup.adapter.get_info(), &device);
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
        Err(panic) => Err(panic_text(&panic)),
    }
}

/// What went wrong on a GPU, read from the runtime's message (Burn's GPU runtime reports a
/// failed allocation, a lost device or a kernel it cannot run by panicking at the next read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GpuFailure {
    /// An allocation the device's memory could not hold.
    OutOfMemory,
    /// The device went away or faulted (a driver reset, a hang, a poisoned device).
    DeviceLost,
    /// A kernel this adapter cannot compile or run.
    Kernel,
}

impl GpuFailure {
    /// The failure `message` describes, if it is one of the three.
    pub fn of(message: &str) -> Option<Self> {
        let m = message.to_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| m.contains(w));
        if any(&[
            "out of memory",
            "out of device memory",
            "outofmemory",
            "out_of_device_memory",
            "can't allocate buffer",
            "cannot allocate",
        ]) {
            Some(GpuFailure::OutOfMemory)
        } else if any(&[
            "device lost",
            "devicelost",
            "device_lost",
            "poisoned",
            "lost device",
            // wgpu's OpenGL backend, when its context stays locked 6 s (a long wait for the
            // device holds it): the device is as good as lost to the run
            "could not lock adapter context",
        ]) {
            Some(GpuFailure::DeviceLost)
        } else if any(&[
            "compil",
            "shader",
            "validation error",
            "spir-v",
            "spirv",
            "unsupported",
            "pipeline",
        ]) {
            Some(GpuFailure::Kernel)
        } else {
            None
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "the runtime panicked".into())
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
pub(crate) fn headless_device_select_off(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.is_empty());
    cfg!(target_os = "linux")
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

/// The precisions `device` computes, in [`Precision::PREFERENCE`] order; f32 always.
pub(crate) fn supported_precisions(device: &Device) -> Vec<Precision> {
    Precision::PREFERENCE
        .into_iter()
        .filter(|p| *p == Precision::F32 || p.dtype().is_some_and(|d| device.supports_dtype(d)))
        .collect()
}

/// `requested` on `device`: `auto` becomes the first of [`Precision::PREFERENCE`] the device
/// computes; an explicit precision the device lacks is an error naming those it has.
pub fn resolve_precision(
    device: &Device,
    backend: Backend,
    requested: Precision,
) -> Result<Precision> {
    let supported = supported_precisions(device);
    if requested == Precision::Auto {
        return Ok(supported[0]);
    }
    if !supported.contains(&requested) {
        bail!(
            "{}; use {} or auto",
            unsupported(backend, requested, &supported),
            Precision::names(&supported)
        );
    }
    Ok(requested)
}

/// `the wgpu backend (SPIR-V on "NAME") does not compute bf16`: the start of every refusal of a
/// precision, naming the device where it is a GPU.
pub fn unsupported(backend: Backend, requested: Precision, supported: &[Precision]) -> String {
    let on = match (backend, wgpu_adapter()) {
        (Backend::Wgpu, Some(a)) => format!(" ({})", a.short()),
        _ => String::new(),
    };
    let list = Precision::names(supported);
    format!(
        "the {backend} backend{on} does not compute {requested} on this machine; it computes {list}"
    )
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
            compiler: "SPIR-V".into(),
            precisions: vec![Precision::F16, Precision::F32],
            cooperative_matrix: 0,
            memory: None,
            largest_buffer: None,
            max_bindings: None,
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
            assert_eq!(r.len(), 4, "{r:?}");
            assert!(r[0].contains(&a.name) && r[0].contains(&a.device_type));
            assert!(r[3].contains("slower than `--backend cpu`"), "{r:?}");
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
            assert_eq!(a.report().len(), 3);
        }
        assert_eq!(
            software[0].describe(),
            "\"llvmpipe (LLVM 15.0.6, 256 bits)\" (Cpu, Vulkan; driver llvmpipe, Mesa 22.3.6 \
             (LLVM 15.0.6))"
        );
    }

    #[test]
    fn the_report_names_the_compiler_precisions_tensor_cores_and_memory() {
        let mut a = adapter("NVIDIA H200", "DiscreteGpu", "NVIDIA", "580.65");
        assert_eq!(
            a.report()[1],
            "wgpu kernels: SPIR-V compiler; computes f16, f32 (not bf16); no cooperative-matrix \
             (tensor-core) matmul"
        );
        a.compiler = "MSL".into();
        a.precisions = Precision::PREFERENCE.to_vec();
        a.cooperative_matrix = 6;
        a.memory = Some(24 << 30);
        assert_eq!(
            a.report()[1],
            "wgpu kernels: MSL compiler; computes bf16, f16, f32; cooperative-matrix (tensor-core) \
             matmul, 6 shapes; 24.00 GiB device memory"
        );
        a.largest_buffer = Some(128 << 20);
        a.max_bindings = Some(28);
        assert!(
            a.report()[1].ends_with(
                "; 24.00 GiB device memory; buffers up to 128.00 MiB, 28 bound a kernel"
            ),
            "{}",
            a.report()[1]
        );
        assert_eq!(a.short(), "MSL on \"NVIDIA H200\"");
        // the third line says how this build picks its matmul kernels
        assert_eq!(a.report()[2], matmul_line(AUTOTUNE));
        assert!(matmul_line(false).contains("untuned"));
        assert!(matmul_line(true).starts_with("wgpu matmuls: autotuned"));
    }

    #[test]
    fn auto_takes_the_narrowest_float_the_cpu_computes() {
        let cpu = Device::flex();
        let supported = supported_precisions(&cpu);
        assert_eq!(supported[0], Precision::Bf16, "{supported:?}");
        assert_eq!(
            resolve_precision(&cpu, Backend::Cpu, Precision::Auto).unwrap(),
            Precision::Bf16
        );
        for p in Precision::PREFERENCE {
            assert_eq!(resolve_precision(&cpu, Backend::Cpu, p).unwrap(), p);
        }
    }

    #[test]
    fn gpu_failures_are_told_apart_by_the_runtimes_messages() {
        use GpuFailure::*;
        for (message, want) in [
            (
                "Error while reading data: An error happened during execution\nCaused by:\n  \
                 out of device memory allocating 4294967296 bytes",
                Some(OutOfMemory),
            ),
            ("can't allocate buffer of size: 123", Some(OutOfMemory)),
            (
                "Vulkan error: ERROR_OUT_OF_DEVICE_MEMORY",
                Some(OutOfMemory),
            ),
            (
                "The device is poisoned\nCaused by:\n  illegal address",
                Some(DeviceLost),
            ),
            ("Parent device is lost (DeviceLost)", Some(DeviceLost)),
            (
                "Could not lock adapter context. This is most-likely a deadlock.",
                Some(DeviceLost),
            ),
            (
                "failed to compile kernel matmul_f16: SPIR-V validation error",
                Some(Kernel),
            ),
            ("index out of bounds: the len is 3 but the index is 7", None),
        ] {
            assert_eq!(GpuFailure::of(message), want, "{message}");
        }
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
        let headless = cfg!(target_os = "linux");
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
