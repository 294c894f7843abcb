//! What `decision score` and `decision eval` refuse at run time (issue 19): a model whose finite
//! weights overflow into NaN / infinite logits (no pick without a confidence, no receipt `fit`
//! rejects), and an output location that cannot be written (refused before the model is
//! loaded; nothing written, no folder left behind).

use std::fs;
use std::path::{Path, PathBuf};

use decision_train::cli::{EvalArgs, ScoreArgs};
use decision_train::model::weights::{self, HfTensor, SaveDtype};
use decision_train::run::{eval as run_eval, score as run_score};
use decision_train::{Backend, DecisionModel, LoadOptions, Precision};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(rel)
}

/// A copy of the tied test model with its weights `edit`ed, in `dir`.
fn model_with(dir: &Path, edit: impl FnOnce(&mut Vec<HfTensor>)) {
    let src = fixture("model/tied");
    let m = DecisionModel::load(src.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let mut tensors: Vec<HfTensor> = m.hf_tensors().collect();
    edit(&mut tensors);
    fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let shapes: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    weights::write_safetensors(
        &dir.join("model.safetensors"),
        &shapes,
        tensors.into_iter(),
        SaveDtype::F32,
    )
    .unwrap();
}

/// Every path under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            }
            out.push(p);
        }
    }
    let mut v = Vec::new();
    walk(dir, &mut v);
    let mut names: Vec<String> = v
        .iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    names.sort();
    names
}

fn score_args(model: &Path, data: &Path, out: PathBuf) -> ScoreArgs {
    ScoreArgs {
        model: model.to_str().unwrap().to_string(),
        data: vec![data.to_path_buf()],
        out,
        batch_size: 4,
        backend: Backend::Cpu,
        dtype: Precision::F32,
        emit_tokens: false,
    }
}

fn eval_args(model: &Path, data: &Path, receipts: PathBuf, report: PathBuf) -> EvalArgs {
    EvalArgs {
        run: None,
        model: Some(model.to_str().unwrap().to_string()),
        data: Some(data.to_path_buf()),
        split: None,
        receipts: Some(receipts),
        baseline: None,
        permutations: 0,
        seed: 0,
        batch_size: 4,
        backend: Backend::Cpu,
        report: Some(report),
        name: None,
    }
}

fn states(dir: &Path) -> PathBuf {
    let p = dir.join("states.jsonl");
    fs::copy(fixture("data/states_good.jsonl"), &p).unwrap();
    p
}

#[test]
fn finite_weights_that_overflow_are_refused_by_score_and_eval_naming_the_state() {
    let d = tempfile::tempdir().unwrap();
    let data = states(d.path());
    // Every weight finite (load accepts it), but the final norm's scale at f32's largest value
    // overflows the hidden state, so the label logits are infinite or NaN.
    let model = d.path().join("overflowing");
    model_with(&model, |t| {
        let norm = t
            .iter_mut()
            .find(|x| x.name == "model.norm.weight")
            .unwrap();
        norm.data.iter_mut().for_each(|w| *w = f32::MAX);
    });
    let before = listing(d.path());

    let e = format!(
        "{:#}",
        run_score(score_args(
            &model,
            &data,
            d.path().join("new/deep/scores.jsonl")
        ))
        .unwrap_err()
    );
    assert!(e.contains("non-finite logits"), "{e}");
    assert!(
        e.contains("state \"demo-0\" (state 1 of 12 read from --data)"),
        "{e}"
    );
    assert!(e.contains("--model"), "{e}");
    assert_eq!(
        listing(d.path()),
        before,
        "no scores, no folder made for them"
    );

    let e = format!(
        "{:#}",
        run_eval(&eval_args(
            &model,
            &data,
            d.path().join("receipts.jsonl"),
            d.path().join("report.json")
        ))
        .unwrap_err()
    );
    assert!(
        e.contains("non-finite logits") && e.contains("state \"demo-0\""),
        "{e}"
    );
    assert_eq!(listing(d.path()), before, "no receipts, no report");

    // The library call refuses too.
    let m = DecisionModel::load(model.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let s = decision_data::read_states(std::slice::from_ref(&data), Default::default()).unwrap();
    assert!(m.score(&s, 4).is_err());

    // The same states through the unedited model: scored, every confidence a number.
    let fine = d.path().join("fine");
    model_with(&fine, |_| {});
    let out = d.path().join("scores.jsonl");
    run_score(score_args(&fine, &data, out.clone())).unwrap();
    let text = fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 12);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["confidence"].is_f64(), "{line}");
    }
}

#[test]
fn eval_with_an_unwritable_report_stops_before_the_work_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let data = states(d.path());
    let model = d.path().join("model");
    model_with(&model, |_| {});
    let blocker = d.path().join("blocker");
    fs::write(&blocker, "a file, not a folder").unwrap();
    let receipts = d.path().join("new/receipts.jsonl");
    let before = listing(d.path());

    // A model that evaluates fine: no receipts appear (nor their new folder) for a report that
    // cannot be written.
    let a = eval_args(&model, &data, receipts.clone(), blocker.join("report.json"));
    let e = format!("{:#}", run_eval(&a).unwrap_err());
    assert!(e.contains("--report") && e.contains("blocker"), "{e}");
    assert_eq!(listing(d.path()), before);

    // And the report is checked before the model is loaded: a folder without a model is not
    // what the error is about.
    let empty = d.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let before = listing(d.path());
    let a = eval_args(&empty, &data, receipts.clone(), blocker.join("report.json"));
    let e = format!("{:#}", run_eval(&a).unwrap_err());
    assert!(e.contains("--report") && e.contains("blocker"), "{e}");
    assert_eq!(listing(d.path()), before);

    // Both writable: both written, nothing temporary left.
    let a = eval_args(
        &model,
        &data,
        receipts.clone(),
        d.path().join("r/report.json"),
    );
    run_eval(&a).unwrap();
    assert_eq!(fs::read_to_string(&receipts).unwrap().lines().count(), 12);
    let report: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(d.path().join("r/report.json")).unwrap()).unwrap();
    assert_eq!(report["schema"], "decision-eval/1");
    assert!(!listing(d.path()).iter().any(|n| n.contains(".tmp-")));
}

/// eval writes shadow receipts as JSON Lines: a `.parquet` name (which `fit` would then read as
/// Parquet and reject) is refused before the work, and nothing is written.
#[test]
fn eval_refuses_a_parquet_name_for_its_json_lines_receipts() {
    let d = tempfile::tempdir().unwrap();
    let data = states(d.path());
    let model = d.path().join("model");
    model_with(&model, |_| {});
    let before = listing(d.path());
    let a = eval_args(
        &model,
        &data,
        d.path().join("receipts.parquet"),
        d.path().join("report.json"),
    );
    let e = format!("{:#}", run_eval(&a).unwrap_err());
    assert!(
        e.contains("--receipts") && e.contains("JSON Lines") && e.contains(".jsonl"),
        "{e}"
    );
    assert_eq!(listing(d.path()), before);
}
