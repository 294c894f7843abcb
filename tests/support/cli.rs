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

/// `decision gen states` of `tasks` tasks of the v1 rules into `dir/states.jsonl`.
pub fn gen_states(dir: &Path, tasks: u32, seed: u64) {
    let (tasks, seed) = (tasks.to_string(), seed.to_string());
    decision_ok(
        dir,
        &[
            "gen",
            "states",
            "--rules",
            "v1",
            "--tasks",
            &tasks,
            "--seed",
            &seed,
            "--out",
            "states.jsonl",
        ],
    );
}

/// What the command printed: stdout, then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
