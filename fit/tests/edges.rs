//! End-to-end cases the rules pin: exact bucket edges (0.3, 1.0, 0.0), an empty point, all
//! successes, a dip, fallbacks with success outcomes, keel and contract lines together, the
//! accounting invariant, `--previous` (drift, never overwritten), config errors before any data,
//! and the report.

use std::fs;
use std::path::{Path, PathBuf};

use decision_fit::drift::Verdict;
use decision_fit::policy::Status;
use decision_fit::{FitArgs, fit};
use serde_json::{Value, json};

fn line(id: &str, point: &str, conf: f64, outcome: Option<&str>, extra: Value) -> String {
    let mut v = json!({
        "id": id, "at": "2026-11-30T12:00:00Z", "point": point, "candidates": ["a", "b"],
        "result": {"kind": "pick", "id": "a", "confidence": conf}, "validation": "accepted",
    });
    if let Some(s) = outcome {
        v["outcome"] = json!({"status": s});
    }
    if let Value::Object(m) = extra {
        for (k, x) in m {
            v[k] = x;
        }
    }
    v.to_string()
}

fn write_lines(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

fn config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("fit.toml");
    fs::write(&p, text).unwrap();
    p
}

fn args(receipts: Vec<PathBuf>, config: PathBuf, out: PathBuf) -> FitArgs {
    FitArgs {
        receipts,
        config,
        out,
        previous: None,
        report: None,
    }
}

#[test]
fn edges_empty_point_all_successes_and_fallbacks() {
    let d = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    // edges: 0.3 → [0.3, 0.4), 1.0 → top bucket, 0.0 → bottom bucket
    lines.push(line("e1", "edge", 0.3, Some("success"), json!({})));
    lines.push(line("e2", "edge", 1.0, Some("failure"), json!({})));
    lines.push(line("e3", "edge", 0.0, Some("success"), json!({})));
    // all successes: 40 judged at 0.95
    for i in 0..40 {
        lines.push(line(
            &format!("s{i}"),
            "sure",
            0.95,
            Some("success"),
            json!({}),
        ));
    }
    // fallbacks that then succeeded: never a selector success, never judged
    for i in 0..50 {
        lines.push(line(
            &format!("f{i}"),
            "fb",
            0.95,
            Some("success"),
            json!({"fallback": {"used": true, "to": "b", "reason": "auth"}}),
        ));
    }
    let r = write_lines(d.path(), "r.jsonl", &lines);
    let cfg = config(
        d.path(),
        "[defaults]\nmin_count = 1\nbound = \"none\"\ntarget = 0.9\n[points.empty]\n[points.sure]\nmin_count = 30\n[points.fb]\nmin_count = 30\n",
    );
    let out = d.path().join("t.json");
    let got = fit(&args(vec![r], cfg, out.clone())).unwrap();
    let t = &got.thresholds;

    let edge = &t.points["edge"];
    let lo: Vec<(f64, u64)> = edge.buckets.iter().map(|b| (b.lo, b.n)).collect();
    assert_eq!(lo, vec![(0.0, 1), (0.3, 1), (0.9, 1)]);
    assert_eq!(edge.buckets[2].hi, 1.0);
    // top bucket 0/1 fails target 0.9 → nothing below may be accepted
    assert_eq!(edge.status, Status::NoAcceptableBucket);

    let empty = &t.points["empty"];
    assert_eq!(
        (empty.status, empty.threshold, empty.judged, empty.records),
        (Status::InsufficientData, None, 0, 0)
    );
    assert_eq!(
        (empty.coverage, empty.ece, empty.success_above),
        (0.0, None, None)
    );
    assert!(empty.buckets.is_empty());

    let sure = &t.points["sure"];
    assert_eq!((sure.status, sure.threshold), (Status::Fitted, Some(0.9)));
    assert_eq!((sure.success_above, sure.coverage), (Some(1.0), 1.0));
    // Wilson lower of 40/40 at 95 % (statsmodels: 0.9123783988027135)
    assert!((sure.success_above_lower.unwrap() - 0.912_378_398_802_713_5).abs() < 1e-9);
    assert!((sure.ece.unwrap() - 0.05).abs() < 1e-12);

    let fb = &t.points["fb"];
    assert_eq!(
        (fb.status, fb.judged, fb.rates.fallback),
        (Status::InsufficientData, 0, 1.0)
    );
    assert_eq!(
        fb.buckets[0].accepted, 50,
        "accepted picks still count toward coverage"
    );

    // every record accounted for
    assert_eq!(t.source.records, 93);
    assert_eq!(
        t.source.records,
        t.source.bad + t.points.values().map(|p| p.records).sum::<u64>()
    );
    assert!(t.points.values().all(|p| p.counts.balanced()));
    // thresholds.json carries the contract's fields
    let w: Value = serde_json::from_str(&fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(w["points"]["sure"]["policy"]["kind"], "bucket");
    assert_eq!(w["points"]["empty"]["status"], "insufficient-data");
    assert_eq!(w["points"]["edge"]["status"], "no-acceptable-bucket");
    assert_eq!(w["source"]["quarantine"], "t.quarantine.jsonl");
    assert!(w["fitted_at"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn a_dip_blocks_the_buckets_below_it() {
    let d = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    let mut n = 0;
    for (conf, ok, bad) in [(0.95, 50, 0), (0.85, 48, 2), (0.75, 25, 25), (0.65, 50, 0)] {
        for k in 0..ok + bad {
            n += 1;
            lines.push(line(
                &format!("d{n}"),
                "tool",
                conf,
                Some(if k < ok { "success" } else { "failure" }),
                json!({}),
            ));
        }
    }
    let r = write_lines(d.path(), "r.jsonl", &lines);
    let cfg = config(
        d.path(),
        "[defaults]\nbound = \"none\"\ntarget = 0.9\nmin_count = 30\n",
    );
    let t = fit(&args(vec![r], cfg, d.path().join("t.json")))
        .unwrap()
        .thresholds;
    assert_eq!(
        t.points["tool"].threshold,
        Some(0.8),
        "the 0.7 bucket dips to 50 %; 0.6 stays blocked"
    );
    assert!((t.points["tool"].coverage - 100.0 / 200.0).abs() < 1e-12);
}

const KEEL: &str = r#"{"schemaVersion":1,"id":"k1","backend":"laya","stage":"preStep","candidates":[{"id":"a","summary":"x"},{"id":"b","summary":"y"}],"result":{"kind":"selected","candidate_id":"a"},"validation":"accepted","selectedProbability":0.97,"observedOutcome":"tests passed","createdAt":1764504000000}
{"schemaVersion":1,"id":"k2","backend":"laya","stage":"preStep","candidates":[{"id":"a","summary":"x"}],"result":{"kind":"selected","candidate_id":"a"},"validation":"accepted","confidence":0.91,"observedOutcome":"task failed: lint","createdAt":1764504000000}
{"schemaVersion":1,"id":"k3","backend":"jev","stage":"preStep","candidates":[{"id":"a","summary":"x"}],"result":{"kind":"selected","candidate_id":"a"},"validation":"accepted","confidence":0.91,"observedOutcome":"window closed","createdAt":1764504000000}
{"schemaVersion":1,"id":"k4","backend":"jev","stage":"preStep","candidates":[{"id":"a","summary":"x"}],"result":{"kind":"abstained"},"validation":"accepted","fallback":"abstained","createdAt":1764504000000}
{"schemaVersion":1,"id":"k5","backend":"jev","stage":"preStep","candidates":[{"id":"a","summary":"x"}],"result":{"kind":"selected","candidate_id":"a"},"validation":"stale","confidence":0.5,"createdAt":1764504000000}
{"schemaVersion":1,"id":"k6","backend":"jev","stage":"preStep","candidates":[{"id":"a","summary":"x"}],"result":{"kind":"selected","candidate_id":"a"},"validation":"unauthorized","confidence":2.0,"createdAt":1764504000000}
"#;

#[test]
fn keel_and_contract_lines_fit_together_with_the_configured_patterns() {
    let d = tempfile::tempdir().unwrap();
    let mut text = KEEL.to_string();
    text.push_str(&line("c1", "pre_step", 0.99, Some("success"), json!({})));
    text.push('\n');
    text.push_str("not json at all\n");
    let r = d.path().join("mixed.jsonl");
    fs::write(&r, &text).unwrap();
    let cfg = config(
        d.path(),
        "[defaults]\nmin_count = 1\n[outcome]\nsuccess = [\"^tests passed\"]\nfailure = [\"^task failed\"]\n",
    );
    let out = d.path().join("t.json");
    let got = fit(&args(vec![r], cfg, out.clone())).unwrap();
    let t = &got.thresholds;
    assert_eq!((t.source.records, t.source.bad), (8, 2));
    let p = &t.points["pre_step"];
    assert_eq!(p.records, 6);
    assert_eq!(p.judged, 3, "k1 success, k2 failure (patterns), c1 success");
    assert_eq!(p.counts.unknown, 1, "k3 matches no pattern");
    assert_eq!((p.counts.abstain, p.counts.rejected_stale), (1, 1));
    // quarantine: the two bad lines, byte for byte, and where they came from
    let q = fs::read_to_string(d.path().join("t.quarantine.jsonl")).unwrap();
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"k6\"") || l.starts_with("not json"))
        .collect();
    assert_eq!(q, bad.join("\n") + "\n");
    let errors = fs::read_to_string(d.path().join("t.quarantine.errors.jsonl")).unwrap();
    assert!(
        errors.contains("\"row\":6")
            && errors.contains("confidence")
            && errors.contains("\"row\":8"),
        "{errors}"
    );
}

#[test]
fn previous_file_drift_and_never_overwritten() {
    let d = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    for i in 0..200 {
        let conf = if i % 2 == 0 { 0.95 } else { 0.55 };
        let ok = i % 2 == 0 || i % 10 != 1; // 0.55 bucket: 80 % success
        lines.push(line(
            &format!("p{i}"),
            "tool",
            conf,
            Some(if ok { "success" } else { "failure" }),
            json!({}),
        ));
    }
    let r = write_lines(d.path(), "r.jsonl", &lines);
    let cfg = config(
        d.path(),
        "[defaults]\nbound = \"none\"\ntarget = 0.9\nmin_count = 30\n",
    );
    let prev = d.path().join("old.json");
    let old = json!({"schema": "decision-thresholds/1", "fitted_at": "2026-10-31T12:00:00Z", "points": {
        "tool": {"status": "fitted", "threshold": 0.5, "coverage": 0.8, "success_above": 0.93, "judged": 100},
        "gone": {"status": "fitted", "threshold": 0.7, "coverage": 0.5, "success_above": 0.99}
    }});
    fs::write(&prev, serde_json::to_string_pretty(&old).unwrap()).unwrap();
    let before = fs::read(&prev).unwrap();
    let mut a = args(vec![r.clone()], cfg.clone(), d.path().join("new.json"));
    a.previous = Some(prev.clone());
    a.report = Some(d.path().join("report"));
    let got = fit(&a).unwrap();
    assert_eq!(fs::read(&prev).unwrap(), before, "--previous untouched");
    let rows = got.drift.unwrap();
    let tool = rows.iter().find(|r| r.point == "tool").unwrap();
    assert_eq!(
        (tool.old_threshold, tool.new_threshold),
        (Some(0.5), Some(0.9))
    );
    assert_eq!(tool.share_above_old, Some(0.8));
    assert_eq!(tool.share_above_new, Some(1.0));
    let test = tool.tested.unwrap();
    assert_eq!((test.n, test.success), (200, 180));
    // 0.9 success on 200 at the old threshold: the target 0.9 lies inside its interval
    assert_eq!(tool.verdict, Verdict::WithinNoise);
    let gone = rows
        .iter()
        .find(|r| r.point == "gone")
        .expect("a point only in the previous file is shown");
    assert_eq!(
        (gone.new_status.as_str(), gone.verdict),
        ("no receipts", Verdict::Untestable)
    );

    // the report renders, with both charts per point and the drift table
    let html = fs::read_to_string(d.path().join("report/report.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        2 * got.thresholds.points.len()
    );
    assert!(html.contains("reliability") && html.contains("risk vs coverage"));
    let md = fs::read_to_string(d.path().join("report/report.md")).unwrap();
    assert!(
        md.contains("Change against the previous thresholds") && md.contains("within noise"),
        "{md}"
    );

    // --out naming the previous file is the explicit way to replace it
    let mut same = args(vec![r.clone()], cfg.clone(), prev.clone());
    same.previous = Some(prev.clone());
    fit(&same).unwrap();
    assert_ne!(fs::read(&prev).unwrap(), before);
    // but the quarantine or the report may never land on it
    let mut clash = args(vec![r], cfg, d.path().join("x.json"));
    let q = d.path().join("x.quarantine.jsonl");
    fs::copy(&prev, &q).unwrap();
    clash.previous = Some(q.clone());
    let e = format!("{:#}", fit(&clash).err().unwrap());
    assert!(e.contains("refusing to overwrite"), "{e}");
}

#[test]
fn config_errors_come_before_any_data_is_read() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "[points.tool]\ntarget = 1.5\n");
    let missing = d.path().join("does-not-exist.jsonl");
    let e = format!(
        "{:#}",
        fit(&args(vec![missing], cfg, d.path().join("t.json")))
            .err()
            .unwrap()
    );
    assert!(
        e.contains("fit.toml") && e.contains("outside (0, 1]"),
        "{e}"
    );
    assert!(!d.path().join("t.json").exists());
    let prev = d.path().join("old.json");
    fs::write(
        &prev,
        r#"{"schema": "decision-thresholds/9", "points": {}}"#,
    )
    .unwrap();
    let cfg = config(d.path(), "");
    let mut a = args(
        vec![d.path().join("none.jsonl")],
        cfg,
        d.path().join("t.json"),
    );
    a.previous = Some(prev);
    let e = format!("{:#}", fit(&a).err().unwrap());
    assert!(e.contains("decision-thresholds/9"), "{e}");
}
