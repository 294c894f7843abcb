//! `decision sim` from the command line: the bundle path (decision-worker's `decide` on
//! `model.onnx`) and the Burn path (the model folder) make the same decisions on the same tasks,
//! and the command's receipts are what `decision fit` reads.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "support/cli.rs"]
mod cli;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn decision(args: &[&str]) -> Output {
    cli::decision_ok(&root(), args)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_bundle_and_its_model_folder_decide_the_same_and_fit_reads_the_receipts() {
    let tmp = tempfile::tempdir().unwrap();
    let model = root().join("models/tiny-base");
    let bundle = tmp.path().join("bundle");
    decision(&[
        "export",
        "--model",
        s(&model),
        "--formats",
        "onnx",
        "--out",
        s(&bundle),
    ]);

    let run = |src: &Path, tag: &str| -> (Value, Vec<Value>) {
        let report = tmp.path().join(format!("{tag}.json"));
        let receipts = tmp.path().join(format!("{tag}.jsonl"));
        let out = decision(&[
            "sim",
            "--model",
            s(src),
            "--rules",
            "v2",
            "--tasks",
            "40",
            "--seed",
            "5",
            "--modes",
            "llm,model,shadow",
            "--report",
            s(&report),
            "--receipts",
            s(&receipts),
        ]);
        let table = String::from_utf8_lossy(&out.stdout);
        for m in ["llm", "model", "shadow"] {
            assert!(table.contains(m), "{table}");
        }
        assert!(report.with_extension("svg").is_file());
        let text = std::fs::read_to_string(&report).unwrap();
        (serde_json::from_str(&text).unwrap(), lines(&receipts))
    };
    let (from_bundle, receipts_bundle) = run(&bundle, "bundle");
    let (from_folder, receipts_folder) = run(&model, "folder");

    assert_eq!(from_bundle["schema"], "decision-sim/1");
    for r in [&from_bundle, &from_folder] {
        assert_eq!(r["tasks"], 40);
        assert_eq!(r["rules"], "v2");
        // The model alone never calls the LLM; llm and shadow act alike (shadow only records).
        assert_eq!(r["modes"]["model"]["llm_calls_per_task"], 0.0);
        assert_eq!(
            r["modes"]["shadow"]["success"],
            r["modes"]["llm"]["success"]
        );
    }
    // Same tasks, same decisions: the model's success and every shadow pick agree between the
    // bundle (tract) and the folder (Burn), confidences within the export's parity tolerance.
    assert_eq!(
        from_bundle["modes"]["model"]["success"],
        from_folder["modes"]["model"]["success"]
    );
    assert_eq!(receipts_bundle.len(), receipts_folder.len());
    assert!(!receipts_bundle.is_empty());
    // each id names its model, so two models' receipts can share a folder; the rest is the same
    let state_of = |r: &Value| {
        let (id, model) = (r["id"].as_str().unwrap(), r["model"].as_str().unwrap());
        assert!(id.contains(&format!(":{model}:")), "{id} names not {model}");
        id.replacen(&format!(":{model}:"), ":", 1)
    };
    assert_ne!(receipts_bundle[0]["id"], receipts_folder[0]["id"]);
    for (a, b) in receipts_bundle.iter().zip(&receipts_folder) {
        assert_eq!(state_of(a), state_of(b));
        assert_eq!(a["outcome"], b["outcome"]);
        assert_eq!(a["shadow"], b["shadow"]);
        assert_eq!(a["result"]["id"], b["result"]["id"], "{a}\n{b}");
        let (ca, cb) = (
            a["result"]["confidence"].as_f64().unwrap(),
            b["result"]["confidence"].as_f64().unwrap(),
        );
        assert!((ca - cb).abs() < 1e-4, "{ca} vs {cb}: {a}");
    }

    // The shadow receipts are contract receipts: fit reads every one of them, both models'
    // together (their ids differ by the model).
    let thresholds = tmp.path().join("thresholds.json");
    let receipts = tmp.path().join("bundle.jsonl");
    let out = decision(&[
        "fit",
        "--receipts",
        s(&receipts),
        s(&tmp.path().join("folder.jsonl")),
        "--config",
        "configs/fit.toml",
        "--out",
        s(&thresholds),
    ]);
    let th: Value = serde_json::from_str(&std::fs::read_to_string(&thresholds).unwrap()).unwrap();
    assert_eq!(th["schema"], "decision-thresholds/1", "{out:?}");
    let n: u64 = th["points"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p["judged"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(n, 2 * receipts_bundle.len() as u64, "{th}");
}

#[test]
fn cascade_without_thresholds_and_receipts_without_a_recording_mode_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = root().join("models/tiny-base");
    for (args, says) in [
        (
            vec!["--modes", "llm,cascade"],
            "mode cascade needs thresholds",
        ),
        (
            vec!["--modes", "llm,model", "--receipts", "r.jsonl"],
            "only the shadow and cascade modes write receipts",
        ),
        (vec!["--modes", "llm,fixed:1.5"], "fixed:1.5"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_decision"))
            .current_dir(tmp.path())
            .args(["sim", "--tasks", "3", "--model", s(&model)])
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!tmp.path().join("r.jsonl").exists());
    }
}

#[test]
fn outputs_that_cannot_be_written_stop_the_simulation_before_it_runs_and_nothing_lands() {
    let tmp = tempfile::tempdir().unwrap();
    let model = root().join("models/tiny-base");
    std::fs::write(tmp.path().join("blocker"), b"a file, not a folder").unwrap();
    for (outputs, says) in [
        (vec!["--receipts", "r.txt"], "unknown format"),
        (
            vec!["--receipts", "r.jsonl", "--report", "blocker/r.json"],
            "--report's chart blocker/r.svg: cannot write there",
        ),
    ] {
        let out = cli::decision_in(
            tmp.path(),
            &[
                &[
                    "sim",
                    "--tasks",
                    "3",
                    "--modes",
                    "shadow",
                    "--model",
                    s(&model),
                ][..],
                &outputs,
            ]
            .concat(),
        );
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{outputs:?}: {text}");
        assert!(text.contains(says), "{outputs:?}: {text}");
        // refused before the simulation: no table printed, no file left
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }
}
