//! The whole workflow end to end, shortened: `decision demo --quick` (300 tasks, a few dozen
//! training steps per run) generates states, fine-tunes the committed tiny base on v1, evaluates,
//! fits thresholds from shadow receipts, LoRA-retrains on v2, refits with --previous, exports the
//! bundle and verifies it, and runs the shop's agent with each model (`decision sim`: shadow,
//! fit, then llm / model / fixed:0.5 / cascade on 150 new tasks, before and after the rule
//! change). The assertions read the files the steps wrote.

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
    // The loop ran the shipped model: bundle-v2 (exported before the refit, for `sim`) holds
    // the same model.onnx as the bundle.
    let onnx_sha = |m: &serde_json::Value| {
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "model.onnx")
            .map(|f| f["sha256"].clone())
            .expect("model.onnx in the manifest")
    };
    assert_eq!(
        onnx_sha(&read_json(&out.join("bundle-v2/manifest.json"))),
        onnx_sha(&manifest)
    );

    // thresholds.json: the contract's schema; fit judged every shadow receipt of the v2 eval
    // (each point's `judged` is its count of receipts), a fitted point has a threshold in [0, 1]
    // and any other status has none; the bundle carries the same file.
    let th = read_json(&out.join("thresholds.json"));
    assert_eq!(th["schema"], "decision-thresholds/1");
    let points = th["points"].as_object().expect("points");
    let receipts = std::fs::read_to_string(out.join("receipts-v2.jsonl")).unwrap();
    let mut per_point = std::collections::BTreeMap::<String, u64>::new();
    for line in receipts.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        *per_point
            .entry(r["point"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    for p in ["tool", "args", "stop"] {
        let e = points.get(p).unwrap_or_else(|| panic!("point {p} missing"));
        assert_eq!(e["judged"].as_u64(), per_point.get(p).copied(), "{p}: {e}");
        match e["status"].as_str().unwrap() {
            "fitted" => assert!((0.0..=1.0).contains(&e["threshold"].as_f64().unwrap())),
            "insufficient-data" | "no-acceptable-bucket" => assert!(e["threshold"].is_null()),
            other => panic!("{p}: status {other}"),
        }
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
    // The v1 model learnt v1 (and is calibrated there); on v2 test it fails where the rule
    // changed.
    assert!(acc("v1_model", "v1_test", "accuracy") >= 0.9);
    assert!(acc("v1_model", "v1_test", "ece") <= 0.1);
    assert!(acc("v1_model", "v2_test", "accuracy") <= acc("v1_model", "v1_test", "accuracy") - 0.1);
    assert!(old_t < 0.5, "v1 model on touched v2 states: {old_t}");
    assert!(summary["steps"].as_array().unwrap().len() >= 12);

    // The loop (decision sim): every stage ran its modes on the same tasks, and the figures say
    // what the thresholds are for.
    let sim = &summary["sim"];
    let fig = |stage: &str, mode: &str, k: &str| -> f64 {
        sim[stage]["modes"][mode][k]
            .as_f64()
            .unwrap_or_else(|| panic!("sim.{stage}.modes.{mode}.{k}: {}", sim[stage]))
    };
    let delegated = |stage: &str, mode: &str, p: &str| -> f64 {
        sim[stage]["modes"][mode]["delegated"][p]
            .as_f64()
            .unwrap_or(0.0)
    };
    for (stage, modes) in [
        (
            "v1_model_v1_tasks",
            &["llm", "model", "fixed:0.5", "cascade"][..],
        ),
        (
            "v1_model_v2_tasks",
            &["llm", "model", "fixed:0.5", "cascade"][..],
        ),
        ("v1_model_v2_refit", &["llm", "cascade"][..]),
        (
            "v2_model_v2_tasks",
            &["llm", "model", "fixed:0.5", "cascade"][..],
        ),
    ] {
        assert_eq!(sim[stage]["tasks"], 120, "{stage}");
        for m in modes {
            let (lo, s, hi) = (
                fig(stage, m, "success_low"),
                fig(stage, m, "success"),
                fig(stage, m, "success_high"),
            );
            assert!(lo <= s && s <= hi, "{stage} {m}");
        }
        // llm never delegates; the model alone never calls the LLM.
        for p in ["tool", "args", "stop"] {
            assert_eq!(delegated(stage, "llm", p), 0.0, "{stage} {p}");
        }
        assert!(fig(stage, "llm", "llm_calls_per_task") > 3.0, "{stage}");
        if modes.contains(&"model") {
            assert_eq!(fig(stage, "model", "llm_calls_per_task"), 0.0, "{stage}");
        }
    }
    // The same v2 tasks in the three v2 stages: llm's figures agree exactly.
    for k in ["success", "llm_calls_per_task"] {
        let a = fig("v1_model_v2_tasks", "llm", k);
        assert_eq!(a, fig("v1_model_v2_refit", "llm", k), "{k}");
        assert_eq!(a, fig("v2_model_v2_tasks", "llm", k), "{k}");
    }
    // With thresholds fitted from shadow trajectories the cascade is never worse than the LLM
    // alone by the margin, at every stage (the paper's claim), and on v1 tasks it hands the
    // model decisions and costs less.
    for stage in [
        "v1_model_v1_tasks",
        "v1_model_v2_tasks",
        "v1_model_v2_refit",
        "v2_model_v2_tasks",
    ] {
        assert_eq!(
            sim[stage]["modes"]["cascade"]["vs_llm"]["non_inferior"], true,
            "{stage}: {}",
            sim[stage]["modes"]["cascade"]
        );
    }
    let v1 = "v1_model_v1_tasks";
    assert!(
        ["tool", "args", "stop"]
            .iter()
            .any(|p| delegated(v1, "cascade", p) > 0.3)
    );
    assert!(fig(v1, "cascade", "cost_per_task") < fig(v1, "llm", "cost_per_task"));
    assert!(fig(v1, "cascade", "llm_calls_per_task") < fig(v1, "llm", "llm_calls_per_task"));
    // After the rule change the v1 model, deciding alone, loses tasks it won on v1.
    assert!(fig("v1_model_v2_tasks", "model", "success") <= fig(v1, "model", "success") - 0.1);
}
