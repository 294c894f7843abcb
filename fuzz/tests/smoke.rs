//! The short fuzz run of `make test`: every target replays its corpus and then runs a fixed
//! number of mutated inputs from seed 1 (the same inputs every time, a few seconds each); any
//! panic, hang or allocation past the limit fails the test and names the saved input. And the
//! harness itself: a panic, a hang and an allocation bomb are each caught and saved.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_decision-fuzz");

fn run(args: &[&str], findings: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--findings")
        .arg(findings)
        .output()
        .expect("running decision-fuzz")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `runs` inputs of `target` (corpus included), seed 1: no finding.
fn fuzz_briefly(target: &str, runs: u32) {
    let findings = tempfile::tempdir().unwrap();
    let out = run(
        &[target, "--runs", &runs.to_string(), "--seed", "1"],
        findings.path(),
    );
    let report = text(&out);
    if out.status.code() != Some(0) {
        let kept = findings.keep();
        panic!(
            "decision-fuzz {target} found something (exit {:?}); inputs kept in {}:\n{report}",
            out.status.code(),
            kept.display()
        );
    }
    let want = format!("{target}: {runs} executions in ");
    assert!(report.contains(&want), "{report}");
}

// Counts sized to 1 to 4 seconds each on the project's 2-core machine (the execution rates are in
// the README's fuzzing section).
#[test]
fn states_jsonl() {
    fuzz_briefly("states-jsonl", 800);
}

#[test]
fn states_parquet() {
    fuzz_briefly("states-parquet", 1200);
}

#[test]
fn receipts_jsonl() {
    fuzz_briefly("receipts-jsonl", 400);
}

#[test]
fn receipts_parquet() {
    fuzz_briefly("receipts-parquet", 500);
}

#[test]
fn fit_config() {
    fuzz_briefly("fit-config", 1200);
}

#[test]
fn decision_json() {
    fuzz_briefly("decision-json", 1600);
}

#[test]
fn model_config() {
    fuzz_briefly("model-config", 1600);
}

#[test]
fn safetensors() {
    fuzz_briefly("safetensors", 1200);
}

#[test]
fn manifest() {
    fuzz_briefly("manifest", 400);
}

#[test]
fn every_target_listed_is_run_above() {
    let out = Command::new(BIN).arg("list").output().unwrap();
    let listed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let this = include_str!("smoke.rs");
    for t in &listed {
        assert!(
            this.contains(&format!("fuzz_briefly(\"{t}\"")),
            "target {t} has no brief run"
        );
    }
    assert_eq!(listed.len(), 9, "{listed:?}");
}

/// One self-test target: the exit status and the saved input say what was caught.
fn caught(target: &str, extra: &[&str], code: i32, kind: &str, input: &str) {
    let findings = tempfile::tempdir().unwrap();
    let mut args = vec![target, "--runs", "20"];
    args.extend_from_slice(extra);
    let out = run(&args, findings.path());
    let report = text(&out);
    assert_eq!(out.status.code(), Some(code), "{report}");
    assert!(
        report.contains(&format!("FINDING {target}: {kind}")),
        "{report}"
    );
    let saved: Vec<_> = std::fs::read_dir(findings.path().join(target))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!saved.is_empty(), "{report}");
    for p in &saved {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(&format!("{kind}-")), "{name}");
        let bytes = std::fs::read(p).unwrap();
        assert!(bytes.starts_with(input.as_bytes()), "{name}: {bytes:?}");
    }
}

#[test]
fn a_panic_is_caught_saved_and_fails_the_run() {
    caught("selftest-panic", &[], 1, "panic", "panic");
}

#[test]
fn a_hang_is_stopped_and_saved() {
    caught("selftest-hang", &["--timeout", "1"], 2, "hang", "hang");
}

#[test]
fn an_allocation_past_the_limit_is_refused_and_saved() {
    caught(
        "selftest-alloc",
        &["--max-alloc-mib", "1024"],
        3,
        "alloc",
        "alloc",
    );
}
