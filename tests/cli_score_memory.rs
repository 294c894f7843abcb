//! `decision score` has no memory plan: it sizes its batches to the memory free. On the CPU it
//! runs fewer batches side by side than threads where more would not fit, on a GPU fewer rows a
//! batch; it says so, and the scores are those of the unconstrained run.
//! `DECISION_DEVICE_MEMORY` stands for the machine's memory (here far too little for more).

use std::path::Path;

use serde_json::Value;

#[path = "support/checkers.rs"]
mod checkers;
#[path = "support/cli.rs"]
mod cli;

/// `decision score` of `states.jsonl` in `dir` with the tiny base, batches of 8, with `env` set;
/// stderr, and each state's probabilities.
fn score(dir: &Path, backend: &str, out: &str, env: &[(&str, &str)]) -> (String, Vec<Vec<f64>>) {
    let o = cli::score_tiny_base(dir, backend, out, env);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if !o.status.success() {
        return (err, Vec::new());
    }
    let probs = std::fs::read_to_string(dir.join(out))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["probs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_f64().unwrap())
                .collect()
        })
        .collect();
    (err, probs)
}

fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], tol: f64) {
    assert_eq!(a.len(), b.len());
    assert!(!a.is_empty());
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert!((x - y).abs() <= tol, "{x} against {y}");
    }
}

#[test]
fn on_the_cpu_fewer_batches_side_by_side_where_more_would_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    cli::gen_states(dir.path(), 4, 3);
    let four = [("RAYON_NUM_THREADS", "4")];
    let (err, all) = score(dir.path(), "cpu", "all.jsonl", &four);
    assert!(!err.contains("[score]"), "{err}");
    let (err, one) = score(
        dir.path(),
        "cpu",
        "one.jsonl",
        &[four[0], ("DECISION_DEVICE_MEMORY", "0.001")],
    );
    assert!(
        err.contains("[score] 1 batch of 8 rows side by side, not 4"),
        "{err}"
    );
    // Each row is scored alone in its batch's padding: the same up to summation order.
    assert_close(&all, &one, 1e-6);
}

#[test]
fn on_a_gpu_fewer_rows_a_batch_where_more_would_not_fit() {
    let test = "on_a_gpu_fewer_rows_a_batch_where_more_would_not_fit";
    let dir = tempfile::tempdir().unwrap();
    cli::gen_states(dir.path(), 4, 3);
    let (err, cpu) = score(dir.path(), "cpu", "cpu.jsonl", &[]);
    assert!(!cpu.is_empty(), "{err}");
    let (err, gpu) = score(
        dir.path(),
        "wgpu",
        "gpu.jsonl",
        &[("DECISION_DEVICE_MEMORY", "0.001")],
    );
    if err.contains("no usable GPU adapter") {
        checkers::not_run(test, "vulkan", &err);
        return;
    }
    assert!(
        err.contains("[score] batches of 1 row, not 8: the prompts run to"),
        "{err}"
    );
    // The wgpu kernels against the CPU's (the tiny base in f32): as `wgpu_scores_like_the_cpu_backend`.
    assert_close(&cpu, &gpu, 1e-5);
}

/// A `DECISION_DEVICE_MEMORY` that is not a size in GiB is refused before any scoring, as
/// `decision train` refuses it, and nothing is written.
#[test]
fn a_memory_budget_that_is_not_a_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    cli::gen_states(dir.path(), 1, 3);
    let (err, probs) = score(
        dir.path(),
        "cpu",
        "out.jsonl",
        &[("DECISION_DEVICE_MEMORY", "24GB")],
    );
    assert!(probs.is_empty());
    assert!(
        err.contains("DECISION_DEVICE_MEMORY=\"24GB\": expected a size in GiB"),
        "{err}"
    );
    assert!(!dir.path().join("out.jsonl").exists());
}
