//! `decision train --plan` of the shipped 4B config (issue 30): `[train] dtype = "auto"` is planned
//! as the dtype the device will run, on the CPU and on the wgpu adapter this machine has (Mesa's
//! software driver in CI); an explicit dtype the device lacks is refused with what it computes
//! and what that would plan to. The model source is a folder holding only Qwen3-4B's config.json:
//! the plan loads no weights.

use std::path::Path;
use std::process::{Command, Output};

#[path = "support/checkers.rs"]
mod checkers;

fn plan(model: &Path, args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    Command::new(env!("CARGO_BIN_EXE_decision"))
        .current_dir(root)
        .env("DECISION_DEVICE_MEMORY", "24")
        .env("HF_HUB_OFFLINE", "1")
        .args(["train", "--config", "configs/qwen3-4b-lora.toml", "--plan"])
        .arg("--set")
        .arg(format!(
            "model.source={}",
            toml_string(&model.display().to_string())
        ))
        .args(args)
        .output()
        .expect("run decision")
}

fn toml_string(s: &str) -> String {
    format!("{s:?}")
}

fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let shape = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/shapes/qwen3-4b.json");
    std::fs::copy(shape, dir.path().join("config.json")).unwrap();
    dir
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The GiB figure of the plan's `total` line.
fn total_gib(plan: &str) -> f64 {
    let line = plan
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .unwrap_or_else(|| panic!("no total line: {plan}"));
    line.split_whitespace()
        .rev()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_4b_config_plans_the_dtype_the_cpu_runs() {
    let model = model_dir();
    let o = plan(model.path(), &["--backend", "cpu"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("dtype: auto -> bf16"), "{out}");
    assert!(
        out.contains("bf16 weights") && out.contains("  fits"),
        "{out}"
    );
    let bf16 = total_gib(&out);
    // f32 weights take twice the memory (7.5 GiB more, less the 0.4 GiB a bf16 base's replay
    // widens one layer to): the plan follows the dtype, not the config's word
    let o = plan(
        model.path(),
        &["--backend", "cpu", "--set", "train.dtype=f32"],
    );
    let f32 = total_gib(&stdout(&o));
    assert!(f32 > bf16 + 6.5, "f32 {f32} GiB vs bf16 {bf16} GiB");
}

#[test]
fn the_4b_config_plans_the_dtype_the_gpu_runs() {
    let model = model_dir();
    let o = plan(model.path(), &["--backend", "wgpu"]);
    let (out, err) = (stdout(&o), stderr(&o));
    if err.contains("no usable GPU adapter") {
        checkers::not_run("the_4b_config_plans_the_dtype_the_gpu_runs", "vulkan", &err);
        return;
    }
    // the adapter, its compiler and what it computes, before the plan
    let kernels = err
        .lines()
        .find(|l| l.starts_with("wgpu kernels: "))
        .unwrap_or_else(|| panic!("{err}"));
    // "computes f16, f32 (not bf16); ...": what the adapter computes, and what it does not
    let clause = kernels
        .split("computes ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap();
    let (has, lacks) = clause.split_once("(not ").unwrap_or((clause, ""));
    let list = |t: &str| -> Vec<String> {
        t.split([',', ' ', ')'])
            .filter(|w| !w.is_empty())
            .map(String::from)
            .collect()
    };
    let (has, lacks) = (list(has), list(lacks));
    let narrowest = has[0].as_str();
    assert!(
        out.contains(&format!("dtype: auto -> {narrowest}")),
        "{out}{err}"
    );
    assert!(out.contains(&format!("{narrowest} weights")), "{out}");
    // The embedding (151936 x 2560) is the largest tensor, one buffer: "buffers up to 128.00
    // MiB" (llvmpipe's OpenGL) cannot hold it in any dtype, and the plan says so instead of
    // "fits"; a GPU's driver can.
    let limit_mib: f64 = kernels
        .split("buffers up to ")
        .nth(1)
        .and_then(|t| t.split_once(" MiB").map(|(m, _)| m.parse().unwrap()))
        .unwrap_or(f64::INFINITY);
    let width = if narrowest == "f32" { 4.0 } else { 2.0 };
    let embedding_mib = 151936.0 * 2560.0 * width / (1u64 << 20) as f64;
    if embedding_mib > limit_mib {
        assert_eq!(o.status.code(), Some(1), "{out}{err}");
        assert!(
            out.contains("largest tensor: the weight model.embed_tokens.weight [151936, 2560]")
                && out.contains("more than the largest buffer")
                && !out.contains("  fits"),
            "{out}"
        );
    } else {
        assert!(o.status.success() && out.contains("  fits"), "{out}{err}");
    }
    // A dtype the adapter lacks is refused, naming what it computes and what that plans to.
    for dtype in &lacks {
        let o = plan(
            model.path(),
            &[
                "--backend",
                "wgpu",
                "--set",
                &format!("train.dtype={dtype}"),
            ],
        );
        let err = stderr(&o);
        assert!(!o.status.success());
        assert!(
            err.contains(&format!("does not compute {dtype}"))
                && err.contains(&format!("--set train.dtype={narrowest} plans")),
            "{err}"
        );
    }
}
