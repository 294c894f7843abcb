//! The wgpu backend runs the same model, and trains it, as the CPU backend does: through SPIR-V
//! on a Vulkan GPU, and on a machine without a GPU through Mesa's software drivers (`.ci/run`
//! installs them): lavapipe's Vulkan lacks what Burn's SPIR-V kernels need, so the backend runs
//! WGSL kernels on llvmpipe through OpenGL (train/src/model/backend.rs, docs/results.md). On a
//! machine with no Vulkan adapter at all the tests say NOT RUN and pass, unless `$DECISION_REQUIRE_CHECKERS` names `vulkan` (as `.ci/run` does), where they fail.

use std::path::{Path, PathBuf};
use std::time::Instant;

use decision_data::State;
use decision_train::run_config::RunConfig;
use decision_train::trainer::{TrainOptions, train};
use decision_train::{Backend, Batch, DecisionModel, LoadOptions, Precision};

#[path = "../../tests/support/checkers.rs"]
mod checkers;

fn state(id: &str, context: &str, options: &[&str]) -> State {
    let candidates = options.iter().map(|o| (o.to_string(), o.to_string()));
    State::unlabelled(id, "tool", context, candidates)
}

/// Kernel autotuning on a software driver costs far more than it saves for a tiny model.
fn minimal_autotune() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("CUBECL_AUTOTUNE_LEVEL").is_none() {
            // SAFETY: set before the runtime starts (the first test to get here does it under
            // the `Once`; the other waits), and nothing else in this binary writes the
            // environment.
            unsafe { std::env::set_var("CUBECL_AUTOTUNE_LEVEL", "minimal") };
        }
    });
}

/// The wgpu device, or `None` (NOT RUN, or a failure where Vulkan is required) when this machine
/// has no adapter.
fn gpu(test: &str) -> Option<burn::tensor::Device> {
    minimal_autotune();
    match decision_train::model::backend::device(Backend::Wgpu) {
        Ok(d) => Some(d),
        Err(e) if format!("{e:#}").contains("no usable GPU adapter") => {
            checkers::not_run(test, "vulkan", &format!("{e:#}"));
            None
        }
        Err(e) => panic!("bringing up the wgpu device: {e:#}"),
    }
}

#[test]
fn wgpu_scores_like_the_cpu_backend() {
    if gpu("wgpu_scores_like_the_cpu_backend").is_none() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model/untied-gqa3");
    let src = dir.to_str().unwrap();
    let cpu = DecisionModel::load(src, &LoadOptions::default()).unwrap();
    let gpu = DecisionModel::load(
        src,
        &LoadOptions {
            backend: Backend::Wgpu,
            ..Default::default()
        },
    )
    .unwrap();
    let states = vec![
        state(
            "a",
            "user asks to cancel order ord_117",
            &["lookup_order", "cancel_order"],
        ),
        state(
            "b",
            "the agent called search_docs and got 3 results",
            &["refund_order", "ask_user", "stop"],
        ),
        state("c", "cancel", &["cancel_order", "lookup_order"]),
    ];
    // Weights loaded to stay as they are sit in buffers of their own, outside the runtime's
    // pools (whose pages then follow the activations' sizes, not the largest weight's).
    use burn::module::Module;
    let weights = gpu.model.num_params() as u64 * 4;
    let held = decision_train::model::backend::gpu_memory(&gpu.device).unwrap();
    assert!(
        held.own_buffers >= weights,
        "{held:?}: the {weights} bytes of weights are not in buffers of their own"
    );
    // On the GPU the batch runs padded to a multiple of 16 tokens, past its longest row; on the
    // CPU at that row's length.
    let encoded: Vec<_> = states
        .iter()
        .map(|s| gpu.prompter.encode(s).unwrap())
        .collect();
    let rows: Vec<&[u32]> = encoded.iter().map(|e| e.input_ids.as_slice()).collect();
    let longest = rows.iter().map(|r| r.len()).max().unwrap();
    let on_gpu = Batch::left_padded_on(&rows, gpu.pad_id, &gpu.device).seq_len();
    let on_cpu = Batch::left_padded_on(&rows, cpu.pad_id, &cpu.device).seq_len();
    assert_eq!((on_gpu % 16, on_cpu), (0, longest));
    assert!(
        on_gpu > longest,
        "the test's rows ({longest} tokens) are padded on the GPU"
    );
    let want = cpu.score(&states, 3).unwrap();
    let got = gpu.score(&states, 3).unwrap();
    let mut worst = 0f64;
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.pick_index, g.pick_index);
        assert_eq!(w.logits.len(), g.logits.len());
        for (a, b) in w.logits.iter().zip(&g.logits) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("wgpu vs cpu: max |Δlogit| {worst:.2e}");
    // Different kernels and summation orders in f32: 1e-4 on O(1) logits.
    assert!(worst < 1e-4, "wgpu logits differ from cpu by {worst}");
}

/// The f32 values of every tensor of a safetensors file, by name.
fn tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The `train` lines' losses of a run's metrics.jsonl, by step.
fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

/// The `gpu_reserved_bytes` of a run's `train` lines (this process's part of the run).
fn gpu_reserved(run: &Path) -> Vec<u64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .filter_map(|v| v["gpu_reserved_bytes"].as_u64())
        .collect()
}

/// The worst relative L2 difference, over the adapters' tensors, of two runs' final adapters.
fn adapter_difference(a: &Path, b: &Path) -> f64 {
    let file = |r: &Path| tensors(&r.join("final/adapter/adapter_model.safetensors"));
    let (ta, tb) = (file(a), file(b));
    assert_eq!(ta.len(), tb.len());
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| (x as f64).powi(2)).sum::<f64>().sqrt();
    ta.iter()
        .zip(&tb)
        .map(|((na, va), (nb, vb))| {
            assert_eq!(na, nb);
            norm(&mut va.iter().zip(vb).map(|(x, y)| x - y)) / norm(&mut vb.iter().copied())
        })
        .fold(0.0, f64::max)
}

fn lora_config(dir: &Path, backend: &str, dtype: &str) -> RunConfig {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-base");
    let states: Vec<State> = decision_data::r#gen::generate(&decision_data::r#gen::GenOptions {
        tasks: 4,
        seed: 11,
        ..Default::default()
    })
    .unwrap();
    let (data, valid) = (dir.join("states.jsonl"), dir.join("valid.jsonl"));
    if !data.exists() {
        decision_data::write_states(&data, &states).unwrap();
        // validation states of another seed: other ids and tasks, as a run requires
        let other = decision_data::r#gen::generate(&decision_data::r#gen::GenOptions {
            tasks: 2,
            seed: 12,
            ..Default::default()
        })
        .unwrap();
        decision_data::write_states(&valid, &other[..6]).unwrap();
    }
    let text = format!(
        r#"
name = "wgpu-check"
[model]
init = "pretrained"
source = {base:?}
[data]
train = {data:?}
valid = {valid:?}
max_options = 16
max_tokens = 512
[lora]
rank = 4
alpha = 8.0
dropout = 0.0
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[optim]
lr = 5e-3
warmup_steps = 1
grad_accum = 1
[train]
mode = "lora"
max_steps = 4
batch_size = 2
seed = 3
checkpoint_every = 2
log_every = 1
backend = "{backend}"
dtype = "{dtype}"
recompute = true
[eval]
batch_size = 8
permutations = 0
max_states = 8
"#,
    );
    RunConfig::parse(&text, &[]).unwrap()
}

/// The adapter's compiler is the one users get: SPIR-V on Vulkan, MSL on Metal, WGSL only through
/// the fallback API of a Vulkan driver that cannot run the SPIR-V kernels (lavapipe: OpenGL).
/// `dtype = "auto"` takes the narrowest float the device computes.
#[test]
fn wgpu_names_its_compiler_and_auto_takes_what_the_device_computes() {
    let Some(device) = gpu("wgpu_names_its_compiler_and_auto_takes_what_the_device_computes")
    else {
        return;
    };
    let adapter = decision_train::model::backend::wgpu_adapter().unwrap();
    let want = match adapter.backend.as_str() {
        "Vulkan" => "SPIR-V",
        "Metal" => "MSL",
        _ => "WGSL",
    };
    assert_eq!(adapter.compiler, want, "{adapter:?}");
    let auto =
        decision_train::model::backend::resolve_precision(&device, Backend::Wgpu, Precision::Auto)
            .unwrap();
    assert_eq!(auto, adapter.precisions[0]);
    if adapter.name.contains("llvmpipe") {
        // Mesa's software driver: f16 and f32 through Vulkan (no bf16), f32 alone through OpenGL
        let want = match adapter.backend.as_str() {
            "Vulkan" => Precision::F16,
            _ => Precision::F32,
        };
        assert_eq!(auto, want, "{adapter:?}");
    }
    assert_eq!(
        decision_train::model::backend::resolve_precision(&device, Backend::Wgpu, Precision::F32)
            .unwrap(),
        Precision::F32
    );
    if !adapter.precisions.contains(&Precision::Bf16) {
        let err = decision_train::model::backend::resolve_precision(
            &device,
            Backend::Wgpu,
            Precision::Bf16,
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("does not compute bf16"),
            "{err:#}"
        );
    }
}

/// The tiny base's LoRA run (all seven projections, recompute, batch 2, 4 steps) on a GPU, through
/// the compiler the adapter gets (SPIR-V on Vulkan, MSL on Metal; here, Mesa's llvmpipe through
/// its OpenGL fallback, WGSL), against the same run on the CPU, in f32 and in f16 (where the device
/// computes it; its loss scaling and product checks on). Each GPU run is killed after step 2 and
/// resumed. Losses per step and the final adapters agree within the tolerances below: in f32 the
/// kernels differ only in summation order; in f16 both sides round each frozen product to f16,
/// with different kernels and accumulation.
///
/// A build with `gpu-autotune` skips this on a software adapter: there Burn's tuned matmul
/// candidates run for half a minute each and wgpu's OpenGL backend gives up on its context after
/// 6 s (train/Cargo.toml).
#[test]
fn wgpu_trains_a_lora_run_like_the_cpu() {
    let test = "wgpu_trains_a_lora_run_like_the_cpu";
    if gpu(test).is_none() {
        return;
    }
    let adapter = decision_train::model::backend::wgpu_adapter().unwrap();
    if adapter.is_software() && decision_train::model::backend::AUTOTUNE {
        checkers::not_run(
            test,
            "gpu",
            &format!(
                "this build autotunes its kernels (gpu-autotune) and the adapter is {}",
                adapter.describe()
            ),
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |backend: &str, dtype: &str, name: &str, opts: &TrainOptions| -> PathBuf {
        let out = dir.path().join(name);
        let started = Instant::now();
        let cfg = lora_config(dir.path(), backend, dtype);
        let s = train(&cfg, &out, opts).unwrap();
        eprintln!(
            "{name}: {} steps in {:.1} s, GPU memory held at most {:?} bytes",
            s.steps,
            started.elapsed().as_secs_f64(),
            s.gpu_memory_peak_bytes
        );
        // What the GPU runtime held, in the summary and each `train` line: at least the
        // weights, within the plan's total (which counts an evaluation batch); nothing on the
        // CPU.
        let held = gpu_reserved(&out);
        if backend == "cpu" {
            assert!(
                s.gpu_memory_peak_bytes.is_none() && held.is_empty(),
                "{held:?}"
            );
        } else {
            let arch = decision_train::plan::architecture(&cfg).unwrap();
            let mut ran = cfg.clone();
            ran.train.dtype = match dtype {
                "f16" => Precision::F16,
                _ => Precision::F32,
            };
            let plan = decision_train::plan::plan(&ran, &arch);
            let peak = s
                .gpu_memory_peak_bytes
                .expect("a GPU run reports its memory");
            // the summary's peak also covers the evaluations after the logged steps
            assert!(
                held.iter().all(|&h| h <= peak) && peak <= plan.total,
                "peak {peak}, steps {held:?}, plan {}",
                plan.total
            );
            for h in held {
                assert!(
                    h >= plan.weights && h <= plan.total,
                    "held {h} bytes; the plan: weights {}, total {}",
                    plan.weights,
                    plan.total
                );
            }
        }
        out
    };
    let plain = TrainOptions::default();
    for (dtype, loss_tol, adapter_tol) in [("f32", 1e-4, 1e-3), ("f16", 2e-2, 5e-2)] {
        if dtype == "f16" && !adapter.precisions.contains(&Precision::F16) {
            continue;
        }
        let cpu = run("cpu", dtype, &format!("cpu-{dtype}"), &plain);
        let name = format!("wgpu-{dtype}");
        let stopped = TrainOptions {
            stop_after: Some(2),
            ..Default::default()
        };
        let gpu = run("wgpu", dtype, &name, &stopped);
        assert_eq!(
            losses(&gpu).len(),
            2,
            "{dtype}: the run stopped after step 2"
        );
        let resumed = TrainOptions {
            resume: true,
            ..Default::default()
        };
        run("wgpu", dtype, &name, &resumed);
        let (lc, lg) = (losses(&cpu), losses(&gpu));
        assert_eq!(lc.len(), 4, "{lc:?}");
        assert_eq!(lg.len(), 4, "{lg:?}");
        for (step, (c, g)) in lc.iter().zip(&lg).enumerate() {
            let rel = (c - g).abs() / c.abs();
            assert!(
                rel <= loss_tol,
                "{dtype} step {}: loss {g} on wgpu, {c} on the cpu",
                step + 1
            );
        }
        let diff = adapter_difference(&gpu, &cpu);
        eprintln!(
            "{dtype}: losses cpu {lc:?} wgpu {lg:?}; adapters differ by {diff:.2e} (relative L2)"
        );
        assert!(diff <= adapter_tol, "{dtype}: adapters differ by {diff:e}");
    }
}

/// A model whose largest weight is larger than the largest buffer the adapter allocates (each
/// tensor is one buffer on a GPU) is refused before any weight is read, naming the weight and the
/// cap, where loading it would fail as if memory had run out. The model here is the tiny base's
/// config with a 300 000-row vocabulary (its f32 embedding 146.48 MiB: past llvmpipe's OpenGL
/// cap of 128 MiB, within a GPU driver's) and no weights at all: on an adapter that can hold it,
/// the load fails later, on the missing weights.
#[test]
fn wgpu_refuses_a_weight_larger_than_its_largest_buffer_before_reading_any() {
    let test = "wgpu_refuses_a_weight_larger_than_its_largest_buffer_before_reading_any";
    if gpu(test).is_none() {
        return;
    }
    let adapter = decision_train::model::backend::wgpu_adapter().unwrap();
    let limit = adapter
        .largest_buffer
        .expect("a GPU adapter states its largest buffer");
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-base");
    let dir = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "decision.json"] {
        std::fs::copy(base.join(f), dir.path().join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = 300_000.into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let opts = LoadOptions {
        backend: Backend::Wgpu,
        precision: Precision::F32,
        hub: None,
        trains: false,
    };
    let err = match DecisionModel::load(dir.path().to_str().unwrap(), &opts) {
        Ok(_) => panic!("a model folder without weights loaded"),
        Err(e) => format!("{e:#}"),
    };
    let embedding = 300_000 * 128 * 4;
    if embedding > limit {
        assert!(
            err.contains(
                "the weight model.embed_tokens.weight [300000, 128] takes 146.48 MiB in F32"
            ) && err.contains("more than the largest buffer")
                && err.contains("--backend cpu"),
            "{err}"
        );
    } else {
        assert!(!err.contains("largest buffer"), "{err}");
    }
}
