//! `decision data validate` and `decision data stats` as a user runs them, on the fixtures in
//! tests/fixtures/data (expected counts computed from the fixture by Python when it was made).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/data")
        .join(name)
}

fn decision(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_decision"))
        .args(args)
        .output()
        .expect("run decision")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn validate_clean_file_exits_zero() {
    let good = fixture("states_good.jsonl");
    let out = decision(&["data", "validate", good.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("checked 12 row(s) in 1 file(s): clean"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn validate_lists_every_error_and_quarantines() {
    let bad = fixture("states_bad.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("q.jsonl");
    let out = decision(&[
        "data",
        "validate",
        bad.to_str().unwrap(),
        "--quarantine",
        q.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let f = bad.display();
    for line in [
        format!("{f} row 2: answer: \"escalate_to_human\" is not among the candidate ids"),
        format!("{f} row 3: context: required field is missing"),
        format!("{f} row 4: point: \"Tool\" does not match [a-z][a-z0-9_]*"),
        format!("{f} row 4: teacher: sums to 2.5, not 1 (within 0.001)"),
        "checked 5 row(s) in 1 file(s): 3 bad row(s), 4 error(s)".to_string(),
    ] {
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }
    // Quarantine: the three bad lines, unchanged.
    let original_text = std::fs::read_to_string(&bad).unwrap();
    let original: Vec<&str> = original_text.lines().collect();
    let quarantined = std::fs::read_to_string(&q).unwrap();
    assert_eq!(quarantined.lines().collect::<Vec<_>>(), original[1..4]);

    let out = decision(&[
        "data",
        "validate",
        bad.to_str().unwrap(),
        "--max-errors",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" row ")).count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains("... 3 more error(s) not listed (--max-errors 1)"),
        "{stdout}"
    );
}

#[test]
fn validate_lists_every_error_by_default() {
    // contracts section 1: `validate` lists them all, however many
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("many.jsonl");
    let line = |i: usize| {
        format!(
            r#"{{"id": "s{i}", "task_id": "t{i}", "point": "Bad", "context": "c", "candidates": [{{"id": "a", "label": "a"}}, {{"id": "b", "label": "b"}}]}}"#
        )
    };
    std::fs::write(&bad, (0..150).map(line).collect::<Vec<_>>().join("\n")).unwrap();
    let out = decision(&["data", "validate", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" row ")).count(),
        150,
        "{stdout}"
    );
    assert!(!stdout.contains("not listed"), "{stdout}");
}

#[test]
fn validate_missing_file_exits_two() {
    let out = decision(&["data", "validate", "/nonexistent/states.parquet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("/nonexistent/states.parquet"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn stats_counts_the_fixture() {
    let good = fixture("states_good.jsonl");
    let out = decision(&["data", "stats", good.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["states"], 12);
    assert_eq!(v["labelled"], 10);
    assert_eq!(v["after_error"], 3);
    assert_eq!(
        v["by_point"],
        serde_json::json!({"tool": 4, "args": 4, "stop": 4})
    );
    assert_eq!(
        v["by_split"]["train"],
        serde_json::json!({"explicit": 0, "hashed": 9})
    );
    assert_eq!(
        v["by_split"]["valid"],
        serde_json::json!({"explicit": 3, "hashed": 0})
    );
    assert_eq!(
        v["options"],
        serde_json::json!({"2": 3, "3": 3, "4": 3, "5": 3})
    );
    assert_eq!(
        v["answer_position"],
        serde_json::json!({"1": 4, "2": 1, "3": 4, "4": 1})
    );
    assert_eq!(v["teacher"]["judged"], 6);
    assert_eq!(v["teacher"]["correct"], 5);

    let out = decision(&["data", "stats", good.to_str().unwrap()]);
    assert!(
        text(&out.stdout).contains("by point"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn every_command_help_has_an_example() {
    for args in [
        &["--help"][..],
        &["data", "--help"],
        &["data", "validate", "--help"],
        &["data", "stats", "--help"],
    ] {
        let out = decision(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(
            text(&out.stdout).contains("Example"),
            "{args:?}: {}",
            text(&out.stdout)
        );
    }
}
