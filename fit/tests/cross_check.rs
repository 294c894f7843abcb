//! The fitter against scripts/fit_reference.py (pandas, statsmodels, scipy) on a generated
//! receipts file: tests/fixtures/fit/{receipts.parquet, *.toml, reference.json, bounds.json}.
//! Tolerances: 1e-9 for the Wilson and Clopper–Pearson bounds, 1e-12 for plain ratios and
//! means (they differ only by summation order); counts, statuses and thresholds exactly.
//!
//! Regenerate the fixtures (only when the rules change) with the command in
//! tests/fixtures/fit/README.md.

use std::path::{Path, PathBuf};

use decision_data::ReceiptResult;
use decision_data::receipts_io::{ReadOptions, read_receipts};
use decision_fit::bounds::{clopper_pearson_upper, wilson};
use decision_fit::{FitArgs, fit};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/fit")
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() <= tol,
        "{what}: rust {a} vs reference {b} (tolerance {tol})"
    );
}

fn opt_close(a: Option<f64>, b: &Value, tol: f64, what: &str) {
    match (a, b.as_f64()) {
        (None, None) => {}
        (Some(a), Some(b)) => close(a, b, tol, what),
        _ => panic!("{what}: rust {a:?} vs reference {b}"),
    }
}

#[test]
fn bounds_match_statsmodels_and_scipy() {
    let grid: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("bounds.json")).unwrap())
            .unwrap();
    assert!(grid.len() > 40);
    for row in &grid {
        let (s, n, level) = (
            row["s"].as_u64().unwrap(),
            row["n"].as_u64().unwrap(),
            row["level"].as_f64().unwrap(),
        );
        let (lo, hi) = wilson(s, n, level).unwrap();
        let what = format!("s={s} n={n} level={level}");
        close(
            lo,
            row["wilson_lower"].as_f64().unwrap(),
            1e-9,
            &format!("wilson lower {what}"),
        );
        close(
            hi,
            row["wilson_upper"].as_f64().unwrap(),
            1e-9,
            &format!("wilson upper {what}"),
        );
        let cp = clopper_pearson_upper(n - s, n, level);
        close(
            cp,
            row["cp_upper_errors"].as_f64().unwrap(),
            1e-9,
            &format!("clopper-pearson {what}"),
        );
    }
}

#[test]
fn fit_matches_the_reference_for_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("reference.json")).unwrap())
            .unwrap();
    let configs = reference["configs"].as_object().unwrap();
    assert_eq!(configs.len(), 4, "bucket, none, cost, risk");
    for (name, expect) in configs {
        let out = dir.path().join(format!("{name}.json"));
        let args = FitArgs {
            receipts: vec![fixtures().join("receipts.parquet")],
            config: fixtures().join(format!("{name}.toml")),
            out: out.clone(),
            previous: None,
            report: None,
        };
        let got = fit(&args).unwrap();
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(written["schema"], "decision-thresholds/1");
        let t = &got.thresholds;
        assert_eq!(
            t.source.records,
            expect["records"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(t.source.bad, expect["bad"].as_u64().unwrap(), "{name}");
        let points = expect["points"].as_object().unwrap();
        assert_eq!(
            t.points.keys().collect::<Vec<_>>(),
            points.keys().collect::<Vec<_>>(),
            "{name}"
        );
        // Every record accounted for: bad, or in exactly one category of one point.
        assert_eq!(
            t.source.records,
            t.source.bad + t.points.values().map(|p| p.records).sum::<u64>()
        );
        for (pname, e) in points {
            let p = &t.points[pname];
            let at = format!("{name}/{pname}");
            assert!(p.counts.balanced(), "{at}: categories do not add up");
            assert_eq!(written["points"][pname]["status"], e["status"], "{at}");
            assert_eq!(p.threshold, e["threshold"].as_f64(), "{at} threshold");
            close(
                p.policy.target,
                e["target"].as_f64().unwrap(),
                1e-15,
                &format!("{at} target"),
            );
            assert_eq!(p.judged, e["judged"].as_u64().unwrap(), "{at} judged");
            assert_eq!(p.records, e["records"].as_u64().unwrap(), "{at} records");
            close(
                p.coverage,
                e["coverage"].as_f64().unwrap(),
                1e-12,
                &format!("{at} coverage"),
            );
            opt_close(
                p.success_above,
                &e["success_above"],
                1e-12,
                &format!("{at} success_above"),
            );
            opt_close(
                p.success_above_lower,
                &e["success_above_lower"],
                1e-9,
                &format!("{at} success_above_lower"),
            );
            opt_close(p.ece, &e["ece"], 1e-12, &format!("{at} ece"));
            let r = &e["rates"];
            for (k, v) in [
                ("abstain", p.rates.abstain),
                ("rejected", p.rates.rejected),
                ("fallback", p.rates.fallback),
                ("pending", p.rates.pending),
                ("abandoned", p.rates.abandoned),
                ("unknown", p.rates.unknown),
            ] {
                close(v, r[k].as_f64().unwrap(), 1e-12, &format!("{at} rate {k}"));
            }
            for (k, v) in &p.rates.rejected_by {
                close(
                    *v,
                    r["rejected_by"][*k].as_f64().unwrap(),
                    1e-12,
                    &format!("{at} rejected_by {k}"),
                );
            }
            let eb = e["buckets"].as_array().unwrap();
            assert_eq!(p.buckets.len(), eb.len(), "{at} buckets");
            for (b, x) in p.buckets.iter().zip(eb) {
                let bat = format!("{at} bucket {}", b.lo);
                assert_eq!(b.lo, x["lo"].as_f64().unwrap(), "{bat}");
                assert_eq!(b.hi, x["hi"].as_f64().unwrap(), "{bat}");
                assert_eq!(
                    (b.n, b.success, b.accepted),
                    (
                        x["n"].as_u64().unwrap(),
                        x["success"].as_u64().unwrap(),
                        x["accepted"].as_u64().unwrap()
                    ),
                    "{bat}"
                );
                opt_close(b.rate, &x["rate"], 1e-12, &format!("{bat} rate"));
                opt_close(b.lower, &x["lower"], 1e-9, &format!("{bat} lower"));
                opt_close(
                    b.mean_confidence,
                    &x["mean_confidence"],
                    1e-12,
                    &format!("{bat} mean confidence"),
                );
            }
            // The risk rule's bounds, test by test.
            for test in e["risk_tests"].as_array().unwrap() {
                let (n, errors) = (
                    test["n"].as_u64().unwrap(),
                    test["errors"].as_u64().unwrap(),
                );
                close(
                    clopper_pearson_upper(errors, n, p.policy.level),
                    test["upper"].as_f64().unwrap(),
                    1e-9,
                    &format!("{at} risk test at {}", test["threshold"]),
                );
            }
        }
    }
}

#[test]
fn the_fixture_exercises_the_edges() {
    // The cross-check only proves the edge handling if the edges occur among judged picks.
    let (good, bad, _) = read_receipts(
        &[fixtures().join("receipts.parquet")],
        &ReadOptions::default(),
    )
    .unwrap();
    assert!(!bad.is_empty(), "the fixture holds bad records");
    let confidences: Vec<f64> = good
        .iter()
        .filter(|r| r.fallback.is_none() && r.validation == decision_data::Validation::Accepted)
        .filter(|r| {
            r.shadow.is_some()
                || r.outcome
                    .as_ref()
                    .is_some_and(|o| o.status != decision_data::OutcomeStatus::Abandoned)
        })
        .filter_map(|r| match r.result {
            ReceiptResult::Pick { confidence, .. } => Some(confidence),
            ReceiptResult::Abstain => None,
        })
        .collect();
    for edge in [0.0, 0.3, 0.5, 0.9, 1.0] {
        assert!(
            confidences.contains(&edge),
            "no judged pick at exactly {edge}"
        );
    }
    assert!(good.iter().any(|r| {
        r.fallback_used()
            && r.outcome
                .as_ref()
                .is_some_and(|o| o.status == decision_data::OutcomeStatus::Success)
    }));
}
