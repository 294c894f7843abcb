//! The `decision` binary as the root package's tests run it: offline (`HF_HUB_OFFLINE=1`, so
//! nothing is fetched from the hub), in a folder the test chooses. Included by the tests that use
//! it (`#[path] mod cli;`).

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// `decision ARGS`, run in `dir`, whatever its exit status.
pub fn decision_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_decision"))
        .current_dir(dir)
        .env("HF_HUB_OFFLINE", "1")
        .args(args)
        .output()
        .expect("run decision")
}

/// `decision ARGS`, run in `dir`, which must succeed: else the test fails with its output.
pub fn decision_ok(dir: &Path, args: &[&str]) -> Output {
    let o = decision_in(dir, args);
    assert!(
        o.status.success(),
        "decision {}: {}",
        args.join(" "),
        text(&o)
    );
    o
}

/// `decision gen states` of `tasks` tasks of the v1 rules into `dir/states.jsonl` (seed `seed`),
/// and of two tasks into `dir/valid.jsonl` (seed `seed + 1`: other ids and tasks).
pub fn gen_states(dir: &Path, tasks: u32, seed: u64) {
    for (tasks, seed, out) in [(tasks, seed, "states.jsonl"), (2, seed + 1, "valid.jsonl")] {
        let (tasks, seed) = (tasks.to_string(), seed.to_string());
        decision_ok(
            dir,
            &[
                "gen", "states", "--rules", "v1", "--tasks", &tasks, "--seed", &seed, "--out", out,
            ],
        );
    }
}

/// `dir/run.toml`: a run named `name` of the tiny base (models/tiny-base) on `dir/states.jsonl`,
/// validated on `dir/valid.jsonl` ([`gen_states`] writes both; up to 16 options and 512 tokens),
/// then the sections in `rest` (`[lora]`, `[train]`, `[eval]`).
pub fn write_tiny_base_run(dir: &Path, name: &str, rest: &str) {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-base");
    let source = base.display().to_string().replace('\\', "/");
    std::fs::write(
        dir.join("run.toml"),
        format!(
            "name = {name:?}\n[model]\ninit = \"pretrained\"\nsource = {source:?}\n[data]\n\
             train = \"states.jsonl\"\nvalid = \"valid.jsonl\"\nmax_options = 16\n\
             max_tokens = 512\n{rest}"
        ),
    )
    .unwrap();
}

/// `decision score` of `dir/states.jsonl` with the tiny base (models/tiny-base) on `backend`,
/// batches of 8, into `dir/out`, run in `dir` with `env` set and `DECISION_DEVICE_MEMORY` unset
/// unless `env` sets it; whatever its exit status.
pub fn score_tiny_base(dir: &Path, backend: &str, out: &str, env: &[(&str, &str)]) -> Output {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-base");
    let mut c = Command::new(env!("CARGO_BIN_EXE_decision"));
    c.current_dir(dir).env("HF_HUB_OFFLINE", "1");
    c.env_remove("DECISION_DEVICE_MEMORY");
    c.envs(env.iter().copied());
    c.args([
        "score",
        "--model",
        base.to_str().unwrap(),
        "--data",
        "states.jsonl",
        "--out",
        out,
        "--batch-size",
        "8",
        "--backend",
        backend,
    ]);
    c.output().expect("run decision")
}

/// What the command printed: stdout, then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
