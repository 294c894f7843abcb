//! No command overwrites its own input (issue 19, "Data loss"): each command given an output
//! that is one of its inputs exits 2 before doing any work, names both flags, and leaves the
//! input byte for byte as it was. The model paths in these commands need not hold a model: the
//! refusal comes before anything is loaded.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

#[path = "support/cli.rs"]
mod cli;
use cli::{decision_in, text};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// Exit 2, and the message names every flag of `flags`.
fn refused(o: &Output, flags: &[&str]) -> String {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    for f in flags {
        assert!(t.contains(f), "message does not name {f}: {t}");
    }
    t
}

/// A folder with a copy of the clean states fixture, `states.jsonl`.
fn workdir() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let bytes = fs::read(fixture("data/states_good.jsonl")).unwrap();
    fs::write(dir.path().join("states.jsonl"), &bytes).unwrap();
    (dir, bytes)
}

#[test]
fn data_validate_refuses_to_quarantine_onto_its_input() {
    let (dir, bytes) = workdir();
    let d = dir.path();
    fs::create_dir(d.join("sub")).unwrap();
    for q in ["states.jsonl", "./sub/../states.jsonl"] {
        let o = decision_in(d, &["data", "validate", "states.jsonl", "--quarantine", q]);
        let t = refused(&o, &["--quarantine", "input"]);
        assert!(!t.contains("clean"), "{t}");
        assert_eq!(fs::read(d.join("states.jsonl")).unwrap(), bytes);
    }
    // Its errors file beside the quarantine counts too: q.jsonl -> q.errors.jsonl.
    fs::copy(d.join("states.jsonl"), d.join("q.errors.jsonl")).unwrap();
    let o = decision_in(
        d,
        &[
            "data",
            "validate",
            "q.errors.jsonl",
            "--quarantine",
            "q.jsonl",
        ],
    );
    refused(&o, &["--quarantine"]);
    assert_eq!(fs::read(d.join("q.errors.jsonl")).unwrap(), bytes);
    // Through a symbolic link.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(d.join("states.jsonl"), d.join("link.jsonl")).unwrap();
        let o = decision_in(
            d,
            &[
                "data",
                "validate",
                "states.jsonl",
                "--quarantine",
                "link.jsonl",
            ],
        );
        refused(&o, &["--quarantine"]);
        assert_eq!(fs::read(d.join("states.jsonl")).unwrap(), bytes);
    }
    // Elsewhere it still works, and the file stays clean.
    let o = decision_in(
        d,
        &[
            "data",
            "validate",
            "states.jsonl",
            "--quarantine",
            "bad.jsonl",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("clean"));
}

#[test]
fn score_refuses_to_write_its_scores_over_the_states() {
    let (dir, bytes) = workdir();
    let d = dir.path();
    let o = decision_in(
        d,
        &[
            "score",
            "--model",
            "no-model",
            "--data",
            "states.jsonl",
            "--out",
            "states.jsonl",
        ],
    );
    let t = refused(&o, &["--out", "--data"]);
    assert!(!t.contains("no-model"), "checked after the model: {t}");
    assert_eq!(fs::read(d.join("states.jsonl")).unwrap(), bytes);
}

#[test]
fn eval_refuses_receipts_or_report_over_the_states() {
    let (dir, bytes) = workdir();
    let d = dir.path();
    for flag in ["--receipts", "--report"] {
        let o = decision_in(
            d,
            &[
                "eval",
                "--model",
                "no-model",
                "--data",
                "states.jsonl",
                flag,
                "states.jsonl",
            ],
        );
        refused(&o, &[flag, "--data"]);
        assert_eq!(fs::read(d.join("states.jsonl")).unwrap(), bytes);
    }
    // Both outputs on one path.
    let o = decision_in(
        d,
        &[
            "eval",
            "--model",
            "no-model",
            "--data",
            "states.jsonl",
            "--receipts",
            "x.json",
            "--report",
            "x.json",
        ],
    );
    refused(&o, &["--receipts", "--report"]);
}

#[test]
fn eval_of_a_missing_run_names_the_run_flag() {
    let (dir, _) = workdir();
    for src in ["/nonexistent", "./nope"] {
        let o = decision_in(
            dir.path(),
            &["eval", "--run", src, "--data", "states.jsonl"],
        );
        let t = refused(&o, &["--run", src, "no such folder"]);
        assert!(!t.contains("--model"), "{t}");
    }
    // A missing local path given as a model is not tried on the Hub.
    fs::create_dir(dir.path().join("runs")).unwrap();
    let o = decision_in(
        dir.path(),
        &["eval", "--model", "runs/nope", "--data", "states.jsonl"],
    );
    let t = refused(&o, &["--model runs/nope", "no such folder"]);
    assert!(!t.contains("Hub") || t.contains("Hub id owner/name"), "{t}");
}

#[test]
fn fit_refuses_a_report_folder_that_holds_its_receipts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let receipts = fs::read(fixture("fit/receipts.parquet")).unwrap();
    fs::create_dir(d.join("r")).unwrap();
    fs::write(d.join("r/receipts.parquet"), &receipts).unwrap();
    let config = fixture("fit/bucket.toml");
    let o = decision_in(
        d,
        &[
            "fit",
            "--receipts",
            "r/receipts.parquet",
            "--config",
            config.to_str().unwrap(),
            "--out",
            "t.json",
            "--report",
            "r",
        ],
    );
    refused(&o, &["--report", "--receipts"]);
    assert!(!d.join("t.json").exists());
    assert_eq!(fs::read(d.join("r/receipts.parquet")).unwrap(), receipts);
}

#[test]
fn train_refuses_a_run_folder_that_holds_its_states() {
    let (dir, bytes) = workdir();
    let d = dir.path();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tiny.toml");
    let o = decision_in(
        d,
        &[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--set",
            "data.train=states.jsonl",
            "--out",
            ".",
        ],
    );
    refused(&o, &["--out", "data.train"]);
    assert_eq!(fs::read(d.join("states.jsonl")).unwrap(), bytes);
    assert!(!d.join("run.toml").exists());
}

#[test]
fn export_never_replaces_its_own_run_or_a_folder_that_is_not_a_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // What a run folder holds (the refusal comes before any of it is read).
    let run = d.join("run");
    fs::create_dir_all(run.join("final")).unwrap();
    fs::write(run.join("run.toml"), "name = \"r\"\n").unwrap();
    fs::write(run.join("final/model.safetensors"), b"weights").unwrap();
    let o = decision_in(d, &["export", "--run", "run", "--out", "run", "--force"]);
    refused(&o, &["--out", "--run"]);
    assert_eq!(
        fs::read(run.join("final/model.safetensors")).unwrap(),
        b"weights"
    );
    let o = decision_in(
        d,
        &["export", "--run", "run", "--out", "run/final/b", "--force"],
    );
    refused(&o, &["--out", "--run"]);

    // --force on a folder that is not a bundle: left as it is, and the message says what is there.
    fs::create_dir(d.join("notes")).unwrap();
    fs::write(d.join("notes/todo.txt"), b"keep me").unwrap();
    let o = decision_in(
        d,
        &[
            "export",
            "--model",
            "./no-model",
            "--out",
            "notes",
            "--force",
        ],
    );
    let t = refused(&o, &["--out", "todo.txt", "no bundle manifest"]);
    assert!(!t.contains("no-model"), "checked after the model: {t}");
    assert_eq!(fs::read(d.join("notes/todo.txt")).unwrap(), b"keep me");
    // An --out that cannot be written fails before the model is read, and leaves nothing.
    fs::write(d.join("file"), b"").unwrap();
    let o = decision_in(
        d,
        &["export", "--model", "./no-model", "--out", "file/bundle"],
    );
    let t = refused(&o, &["--out file/bundle"]);
    assert!(!t.contains("no-model"), "{t}");
    let mut left: Vec<String> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["file", "notes", "run"]);
}

#[test]
fn demo_does_not_delete_runs_in_a_folder_it_did_not_make() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::create_dir_all(d.join("runs/mine")).unwrap();
    fs::write(d.join("runs/mine/run.toml"), b"name = 'mine'").unwrap();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let o = decision_in(
        d,
        &[
            "demo",
            "--quick",
            "--out",
            ".",
            "--configs",
            configs.to_str().unwrap(),
        ],
    );
    refused(&o, &["--out", "runs/", "decision demo"]);
    assert_eq!(
        fs::read(d.join("runs/mine/run.toml")).unwrap(),
        b"name = 'mine'"
    );
    // Nor one that holds its configs.
    let other = tempfile::tempdir().unwrap();
    fs::create_dir(other.path().join("configs")).unwrap();
    let o = decision_in(
        other.path(),
        &["demo", "--quick", "--out", ".", "--configs", "configs"],
    );
    refused(&o, &["--out", "--configs"]);
}
