//! What `decision score` and `decision eval` refuse at run time (issue 19): an output location
//! that cannot be written (refused before the model is loaded; nothing written, no folder left
//! behind).

use std::fs;
use std::path::{Path, PathBuf};

use decision_train::eval::{EvalArgs, run as run_eval};
use decision_train::weights::{self, HfTensor, SaveDtype};
use decision_train::{Backend, DecisionModel, LoadOptions};

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

fn eval_args(model: &Path, data: &Path, receipts: PathBuf, report: PathBuf) -> EvalArgs {
    EvalArgs {
        run: None,
        model: Some(model.to_str().unwrap().to_string()),
        data: Some(data.to_path_buf()),
        split: "all".into(),
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
