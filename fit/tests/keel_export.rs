//! `keel decisions export` lines into `decision fit`, with the outcome patterns shipped in
//! configs/fit.toml and the texts keel really writes, against a count made by hand.

use std::fs;
use std::path::Path;

use decision_fit::policy::Status;
use decision_fit::{FitArgs, fit};
use serde_json::{Value, json};

/// One export line: `{"chatId", "decision": DecisionEvent, "expectedCandidateId"}`.
fn export_line(id: &str, stage: &str, decision: Value, expected: Option<&str>) -> String {
    let mut d = json!({
        "schemaVersion": 1, "id": id, "taskRevision": 1, "backend": "laya", "stage": stage,
        "candidates": [
            {"id": "inspect", "summary": "read"}, {"id": "implement", "summary": "change"},
            {"id": "verify", "summary": "test"}, {"id": "answer", "summary": "reply"}
        ],
        "validation": "accepted", "createdAt": 1764504000000u64,
    });
    for (k, v) in decision.as_object().unwrap() {
        d[k] = v.clone();
    }
    json!({"chatId": "chat-1", "decision": d, "expectedCandidateId": expected}).to_string()
}

fn pick(p: f64, outcome: Option<&str>) -> Value {
    let mut v = json!({"result": {"kind": "selected", "candidate_id": "verify"},
                       "selectedProbability": p, "confidence": 0.3});
    if let Some(o) = outcome {
        v["observedOutcome"] = json!(o);
    }
    v
}

fn ok(n: u32) -> String {
    format!("tools_dispatched={n},denied=0,failed=0,aborted=0,concluded=true")
}

#[test]
fn keel_export_lines_fit_against_a_hand_count() {
    let d = tempfile::tempdir().unwrap();
    let routes = json!([{"id": "r1", "summary": "0G: a"}, {"id": "r2", "summary": "0G: b"}]);
    let lines = [
        // pre_step, judged by the shipped patterns
        export_line("p1", "preStep", pick(0.95, Some(&ok(2))), None), // success
        export_line(
            "p2",
            "preStep",
            pick(
                0.93,
                Some("tools_dispatched=1,denied=0,failed=1,aborted=0,concluded=false"),
            ),
            None,
        ), // failure
        // the label wins over the text: success by label, though the text says failure
        export_line(
            "p3",
            "preStep",
            pick(
                0.91,
                Some("tools_dispatched=2,denied=0,failed=2,aborted=0,concluded=true"),
            ),
            Some("verify"),
        ),
        // failure by label, though the text says success
        export_line("p4", "preStep", pick(0.89, Some(&ok(1))), Some("inspect")),
        // texts that say nothing about the pick: unknown
        export_line(
            "p5",
            "preStep",
            pick(0.85, Some("completed_without_tool_calls")),
            None,
        ),
        export_line("p6", "preStep", pick(0.88, Some("model_max_tokens")), None),
        export_line(
            "p7",
            "preStep",
            pick(0.82, Some("bundle_bound_step_incomplete")),
            None,
        ),
        export_line(
            "p8",
            "preStep",
            pick(
                0.83,
                Some("tools_dispatched=0,denied=0,failed=0,aborted=0,concluded=false"),
            ),
            None,
        ),
        // no outcome, no label: pending
        export_line("p9", "preStep", pick(0.86, None), None),
        // a denied call is a failure; a clean step that did not conclude a success
        export_line(
            "p10",
            "preStep",
            pick(
                0.84,
                Some("tools_dispatched=3,denied=1,failed=0,aborted=0,concluded=true"),
            ),
            None,
        ),
        export_line(
            "p11",
            "preStep",
            pick(
                0.81,
                Some("tools_dispatched=1,denied=0,failed=0,aborted=0,concluded=false"),
            ),
            None,
        ),
        // abstained; rejected out of set; keel's own gate fell back
        export_line(
            "p12",
            "preStep",
            json!({"result": {"kind": "abstained"}, "fallback": "Abstained"}),
            None,
        ),
        export_line(
            "p13",
            "preStep",
            json!({"result": {"kind": "selected", "candidate_id": "deploy"},
                   "selectedProbability": 0.7, "validation": "rejected"}),
            None,
        ),
        export_line(
            "p14",
            "preStep",
            json!({"result": {"kind": "selected", "candidate_id": "verify"},
                   "selectedProbability": 0.99, "fallback": "LowProbability",
                   "observedOutcome": ok(1)}),
            Some("verify"),
        ),
        // keel rejected an id it had offered: its gates, not out of set
        export_line(
            "p15",
            "preStep",
            json!({"result": {"kind": "selected", "candidate_id": "implement"},
                   "selectedProbability": 0.45, "validation": "rejected",
                   "fallback": "Ambiguous"}),
            None,
        ),
        // intake: the quirk (the host's route recorded as selected) is a fallback, whatever
        // the label says
        export_line(
            "i1",
            "intake",
            json!({"backend": "host", "candidates": routes,
                   "result": {"kind": "selected", "candidate_id": "r1"}, "confidence": 0.75,
                   "fallback": "Selector abstained; host scored the 0G catalog",
                   "observedOutcome": "0G scheduled mode model=a strategy=fast trust=high"}),
            Some("r1"),
        ),
        // the same quirk from the selector's backend, and a route keel's host scored (its
        // constant 0.75): the host's routes, fallbacks, in no bucket, whatever the labels say
        export_line(
            "i5",
            "intake",
            json!({"candidates": routes, "result": {"kind": "selected", "candidate_id": "r1"},
                   "selectedProbability": 0.95,
                   "fallback": "Selector abstained; host scored the 0G catalog"}),
            Some("r1"),
        ),
        export_line(
            "i6",
            "intake",
            json!({"backend": "host", "candidates": routes,
                   "result": {"kind": "selected", "candidate_id": "r2"}, "confidence": 0.75}),
            Some("r2"),
        ),
        // a routing text says nothing; a label judges
        export_line(
            "i2",
            "intake",
            json!({"candidates": routes, "result": {"kind": "selected", "candidate_id": "r2"},
                   "selectedProbability": 0.9,
                   "observedOutcome": "0G scheduled mode model=b strategy=fast trust=high"}),
            None,
        ),
        export_line(
            "i3",
            "intake",
            json!({"candidates": routes, "result": {"kind": "selected", "candidate_id": "r2"},
                   "selectedProbability": 0.92, "observedOutcome": "0G catalog empty"}),
            Some("r2"),
        ),
        // bad: a label that was not offered; an event without its stage
        export_line(
            "i4",
            "intake",
            json!({"candidates": routes, "result": {"kind": "selected", "candidate_id": "r2"},
                   "selectedProbability": 0.92}),
            Some("r9"),
        ),
        json!({"chatId": "c", "decision": {"id": "x", "createdAt": 1}, "expectedCandidateId": null})
            .to_string(),
    ];
    let receipts = d.path().join("keel-export.jsonl");
    fs::write(&receipts, lines.join("\n") + "\n").unwrap();
    // The shipped patterns, with thresholds a small sample can reach.
    let shipped =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/fit.toml"))
            .unwrap();
    let outcome = &shipped[shipped.find("[outcome]").unwrap()..];
    let cfg = d.path().join("fit.toml");
    fs::write(
        &cfg,
        format!("[defaults]\nbound = \"none\"\ntarget = 0.6\nmin_count = 1\n\n{outcome}"),
    )
    .unwrap();
    let got = fit(&FitArgs {
        receipts: vec![receipts],
        config: cfg,
        out: d.path().join("t.json"),
        previous: None,
        report: None,
    })
    .unwrap();
    let t = &got.thresholds;
    assert_eq!((t.source.records, t.source.bad), (22, 2));

    let p = &t.points["pre_step"];
    assert_eq!(p.records, 15);
    // judged: p1 s, p2 f, p3 s (label), p4 f (label), p10 f, p11 s
    assert_eq!(p.judged, 6);
    assert_eq!(p.counts.unknown, 4, "p5 p6 p7 p8");
    assert_eq!(p.counts.pending, 1, "p9");
    assert_eq!(p.counts.abstain, 1, "p12");
    assert_eq!(p.counts.rejected_out_of_set, 1, "p13");
    assert_eq!(p.counts.rejected_gate, 1, "p15");
    assert_eq!(p.rates.rejected_by["gate"], 1.0 / 15.0);
    assert_eq!(
        p.counts.fallback, 1,
        "p14: keel's gate, not a selector success"
    );
    // [0.9, 1.0): p1 s, p2 f, p3 s → 2/3 ≥ 0.6; [0.8, 0.9): p4 f, p10 f, p11 s → 1/3 < 0.6
    let bucket = |lo: f64| {
        p.buckets
            .iter()
            .find(|b| (b.lo - lo).abs() < 1e-9)
            .unwrap_or_else(|| panic!("no bucket at {lo}: {:?}", p.buckets))
    };
    assert_eq!((bucket(0.9).n, bucket(0.9).success), (3, 2));
    assert_eq!((bucket(0.8).n, bucket(0.8).success), (3, 1));
    assert_eq!(p.status, Status::Fitted);
    assert_eq!(p.threshold, Some(0.9));
    assert!((p.success_above.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    // accepted picks at or above 0.9 (p1 p2 p3 and the fallen-back p14) over 15 records
    assert!((p.coverage - 4.0 / 15.0).abs() < 1e-12, "{}", p.coverage);

    let i = &t.points["intake"];
    assert_eq!(i.records, 5);
    assert_eq!(
        i.counts.fallback, 3,
        "the intake quirk (i1, i5) and the host's route (i6)"
    );
    assert_eq!(i.counts.unknown, 1, "a routing text");
    assert_eq!(i.judged, 1, "i3, by its label");
    assert_eq!(i.threshold, Some(0.9));
    // the selector's accepted picks at or above 0.9 (i2, i3), not the host's i5 at 0.95
    assert!((i.coverage - 2.0 / 5.0).abs() < 1e-12, "{}", i.coverage);
    // keel's constant 0.75 on the host's route fills no bucket
    assert!(
        i.buckets.iter().all(|b| (b.lo - 0.7).abs() > 1e-9),
        "{:?}",
        i.buckets
    );

    let errors = fs::read_to_string(d.path().join("t.quarantine.errors.jsonl")).unwrap();
    assert!(
        errors.contains("expectedCandidateId") && errors.contains("decision.stage"),
        "{errors}"
    );
}
