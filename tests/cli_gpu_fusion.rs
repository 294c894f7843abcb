//! Burn's fusion plans a GPU forward pass of the model, and a LoRA training step, whole: no
//! stretch falls back to one launch per operation, as whole stretches of scoring did while the
//! RMSNorm was written `x / rms · w`, and of a training step while the planner weighed Burn's
//! default of 5 blocks at a time (docs/results.md, "Burn's fusion and the norm's order", "Fewer
//! blocks for Burn's fusion planner"). Read from the planner's own log, which a `burn.toml` in
//! the folder where `decision` starts turns on.

use std::path::{Path, PathBuf};

#[path = "support/checkers.rs"]
mod checkers;
#[path = "support/cli.rs"]
mod cli;

/// A `burn.toml` in `dir` that logs each plan the fusion planner chooses, and each fallback, to
/// the file returned.
fn log_fusion_plans(dir: &Path) -> PathBuf {
    let log = dir.join("fusion.log");
    std::fs::write(
        dir.join("burn.toml"),
        format!(
            "[fusion.logger]\nlevel = \"medium\"\nfile = {:?}\nappend = false\n",
            log.to_str().unwrap()
        ),
    )
    .unwrap();
    log
}

/// That `decision` ran (`o`; `test` is reported NOT RUN where no GPU adapter came up), and that
/// the planner's `log` has its plans and no fallback (so a missing fallback line means none
/// happened).
fn assert_planned_whole(test: &str, o: &std::process::Output, log: &Path) {
    let out = cli::text(o);
    if out.contains("no usable GPU adapter") {
        checkers::not_run(test, "vulkan", &out);
        return;
    }
    assert!(o.status.success(), "{out}");
    let log = std::fs::read_to_string(log).expect("the fusion planner's log");
    assert!(log.contains("selected composed strategy"), "{log}");
    let fallbacks: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("falling back to unfused"))
        .collect();
    assert!(
        fallbacks.is_empty(),
        "the planner ran stretches unfused: {fallbacks:?}"
    );
}

#[test]
fn a_gpu_forward_pass_runs_as_the_fusion_planner_planned_it() {
    let test = "a_gpu_forward_pass_runs_as_the_fusion_planner_planned_it";
    let dir = tempfile::tempdir().unwrap();
    cli::gen_states(dir.path(), 4, 3);
    let log = log_fusion_plans(dir.path());
    let o = cli::score_tiny_base(dir.path(), "wgpu", "scores.jsonl", &[]);
    assert_planned_whole(test, &o, &log);
}

/// Two steps of a LoRA run with recompute (the replay's taped halves, the blocked attention, the
/// loss head's backward, the optimizer). With Burn's default of 5 blocks, three of its stretches
/// fell back on llvmpipe.
#[test]
fn a_gpu_training_step_runs_as_the_fusion_planner_planned_it() {
    let test = "a_gpu_training_step_runs_as_the_fusion_planner_planned_it";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cli::gen_states(d, 4, 5);
    let log = log_fusion_plans(d);
    cli::write_tiny_base_run(
        d,
        "fusion",
        r#"[lora]
rank = 4
alpha = 8.0
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[train]
mode = "lora"
max_steps = 2
batch_size = 2
checkpoint_every = 0
eval_every = 0
backend = "wgpu"
dtype = "f32"
recompute = true
[eval]
permutations = 0
max_states = 2
"#,
    );
    let o = cli::decision_in(d, &["train", "--config", "run.toml", "--out", "run"]);
    assert_planned_whole(test, &o, &log);
}
