//! The whole workflow end to end, shortened: `decision demo --quick` (300 tasks, a few dozen
//! training steps per run) generates states, fine-tunes the committed tiny base on v1, evaluates,
//! fits thresholds from shadow receipts, LoRA-retrains on v2, refits with --previous, exports the
//! bundle and verifies it. The assertions read the files the steps wrote.

use std::path::Path;
use std::process::Command;

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn quick_demo_trains_fits_retrains_and_ships_a_verified_bundle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("demo");
    let status = Command::new(env!("CARGO_BIN_EXE_decision"))
        .args(["demo", "--quick", "--formats", "onnx,peft", "--out"])
        .arg(&out)
        .arg("--configs")
        .arg(root.join("configs"))
        .current_dir(root)
        .status()
        .expect("run decision demo");
    assert!(status.success(), "decision demo --quick failed: {status}");

    // The bundle verifies again, independently of the demo's own verify step.
    let bundle = out.join("bundle");
    let verify = Command::new(env!("CARGO_BIN_EXE_decision"))
        .args(["bundle", "verify"])
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "bundle verify: {}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let manifest = read_json(&bundle.join("manifest.json"));
    assert_eq!(manifest["schema"], "decision-bundle/1");

    // thresholds.json: the contract's schema, every decision point of the receipts present with
    // a status, and the bundle carries the same file.
    let th = read_json(&out.join("thresholds.json"));
    assert_eq!(th["schema"], "decision-thresholds/1");
    let points = th["points"].as_object().expect("points");
    for p in ["tool", "args", "stop"] {
        let status = points.get(p).unwrap_or_else(|| panic!("point {p} missing"))["status"]
            .as_str()
            .unwrap();
        assert!(
            ["fitted", "insufficient-data", "no-acceptable-bucket"].contains(&status),
            "{p}: {status}"
        );
    }
    assert_eq!(read_json(&bundle.join("thresholds.json")), th);

    // The retrained model beats the old one on v2 states, where the rule changed.
    let summary = read_json(&out.join("summary.json"));
    let acc = |m: &str, d: &str, k: &str| summary[m][d][k].as_f64().unwrap();
    let (old, new) = (
        acc("v1_model", "v2_test", "accuracy"),
        acc("v2_model", "v2_test", "accuracy"),
    );
    assert!(new > old, "v2 test accuracy: retrained {new} vs old {old}");
    let (old_t, new_t) = (
        acc("v1_model", "v2_test", "accuracy_touched"),
        acc("v2_model", "v2_test", "accuracy_touched"),
    );
    assert!(
        new_t > old_t,
        "touched v2 states: retrained {new_t} vs old {old_t}"
    );
    for key in ["v1_model", "v2_model"] {
        for d in ["v1_test", "v2_test"] {
            for k in ["accuracy", "ece"] {
                let v = summary[key][d][k].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&v), "{key}.{d}.{k} = {v}");
            }
        }
    }
    assert!(summary["steps"].as_array().unwrap().len() >= 12);
}
