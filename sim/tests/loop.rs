//! The simulation end to end with stand-in models: modes run on the same tasks, the report has
//! the decision-sim/1 shape, and the receipts of `shadow` fit to the same thresholds whether fit
//! reads them from memory or from the file the simulation writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use decision_data::State;
use decision_data::r#gen::RulesVersion;
use decision_sim::cli::{LoadedModel, SimArgs, simulate};
use decision_sim::{Cache, Llm, Mode, Scorer, SimConfig, Thresholds, run_mode};

/// Answers the key with confidence `right`, except on every `wrong_every`-th task, where it is
/// as sure of the next candidate instead (a model that is confidently wrong on some tasks).
/// Counts the states it was asked to score.
struct KeyScorer {
    right: f64,
    wrong_every: u64,
    states: u64,
}

impl Scorer for KeyScorer {
    fn score(&mut self, states: &[&State]) -> Result<Vec<Option<Vec<f64>>>> {
        self.states += states.len() as u64;
        Ok(states
            .iter()
            .map(|s| {
                let k = s.candidates.len();
                let answer = s
                    .candidates
                    .iter()
                    .position(|c| Some(&c.id) == s.answer.as_ref())
                    .unwrap();
                let index: u64 = s.task_id.rsplit("-t").next().unwrap().parse().unwrap();
                // Unsure on the stop decisions, so that thresholds differ by point.
                let conf = if s.point == "stop" { 0.6 } else { self.right };
                let top = if index.is_multiple_of(self.wrong_every) {
                    (answer + 1) % k
                } else {
                    answer
                };
                let mut p = vec![(1.0 - conf) / (k - 1) as f64; k];
                p[top] = conf;
                Some(p)
            })
            .collect())
    }

    fn name(&self) -> String {
        "key-scorer".into()
    }
}

fn cfg(tasks: usize, thresholds: Thresholds) -> SimConfig {
    SimConfig {
        rules: RulesVersion::V1,
        tasks,
        seed: 42,
        llm: Llm::default(),
        thresholds,
        at: "2026-12-01T00:00:00.000Z".into(),
    }
}

#[test]
fn modes_run_on_the_same_tasks() {
    let mut scorer = KeyScorer {
        right: 0.97,
        wrong_every: 9,
        states: 0,
    };
    let mut cache = Cache::new(&mut scorer, 16);
    let none: Thresholds = [("tool", None), ("args", None), ("stop", None)]
        .into_iter()
        .map(|(p, t)| (p.to_string(), t))
        .collect();
    let c = cfg(120, none);
    let llm = run_mode(&c, Mode::Llm, None).unwrap();
    let shadow = run_mode(&c, Mode::Shadow, Some(&mut cache)).unwrap();
    let never = run_mode(&c, Mode::Cascade, Some(&mut cache)).unwrap();
    let model = run_mode(&c, Mode::Model, Some(&mut cache)).unwrap();
    // The same tasks: every mode starts each task from the same state.
    for run in [&shadow, &never, &model] {
        assert_eq!(run.tasks.len(), 120);
        for (a, b) in run.tasks.iter().zip(&llm.tasks) {
            assert_eq!(a.task_id, b.task_id);
            assert_eq!(a.trajectory[0].0, b.trajectory[0].0);
        }
    }
    // Where the LLM acts on every decision, the runs are identical, decision by decision.
    for run in [&shadow, &never] {
        for (a, b) in run.tasks.iter().zip(&llm.tasks) {
            assert_eq!(a.trajectory, b.trajectory, "{} {}", run.mode, a.task_id);
            assert_eq!(a.end, b.end);
        }
        assert!(run.points.values().all(|p| p.delegated == 0));
    }
    // The model decides everything in `model` mode: no LLM call; it solves every task where it
    // follows the key and none where every pick is wrong.
    assert!(model.tasks.iter().all(|t| t.llm_calls == 0));
    for (i, t) in model.tasks.iter().enumerate() {
        assert_eq!(
            t.end.is_success(),
            !i.is_multiple_of(9),
            "{}: {:?}",
            t.task_id,
            t.end
        );
    }
    // The LLM fails some tasks on its own (its confidently wrong slice), the key never does.
    let llm_ok = llm.tasks.iter().filter(|t| t.end.is_success()).count();
    assert!((40..115).contains(&llm_ok), "llm solved {llm_ok} of 120");
    // Shadow's receipts: one per decision, judged against the key, outcome filled in.
    let decisions: usize = shadow.tasks.iter().map(|t| t.steps).sum();
    assert_eq!(shadow.receipts.len(), decisions);
    assert!(
        shadow
            .receipts
            .iter()
            .all(|r| r.shadow.is_some() && r.outcome.is_some() && r.fallback.is_none())
    );
    // Cascade below every threshold: each receipt is a fallback to the LLM.
    assert!(never.receipts.iter().all(|r| r.fallback_used()));
}

fn fit_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/fit.toml")
}

#[test]
fn shadow_receipts_fit_the_same_from_memory_and_from_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let receipts = tmp.path().join("shadow.jsonl");
    let args = SimArgs {
        model: Some("key".into()),
        rules: RulesVersion::V1,
        tasks: 150,
        seed: 101,
        modes: "shadow".into(),
        thresholds: None,
        receipts: Some(receipts.clone()),
        report: None,
        price: 0.002,
        latency_ms: 809.0,
        batch: 32,
    };
    let model = LoadedModel {
        scorer: Box::new(KeyScorer {
            right: 0.99,
            wrong_every: 1000,
            states: 0,
        }),
        thresholds: None,
    };
    let out = simulate(&args, Some(model)).unwrap();
    let shadow = &out.runs[0];
    decision_data::receipts_io::write_receipts(&receipts, &shadow.receipts).unwrap();

    // In memory: fit's aggregation and policy over the receipts as the simulation made them.
    let config = decision_fit::FitConfig::load(&fit_config()).unwrap();
    let mut agg = decision_fit::aggregate::Aggregate::new(&config, BTreeMap::new());
    for r in &shadow.receipts {
        agg.add(r);
    }
    let memory: BTreeMap<String, decision_fit::thresholds::PointFit> = agg
        .points
        .iter()
        .map(|(p, a)| {
            let fit = decision_fit::thresholds::fit_point(a, config.policy(p));
            (p.clone(), fit)
        })
        .collect();
    // From the file, through `decision fit`.
    let fitted = decision_fit::fit(&decision_fit::FitArgs {
        receipts: vec![receipts.clone()],
        config: fit_config(),
        out: tmp.path().join("thresholds.json"),
        previous: None,
        report: None,
    })
    .unwrap();
    assert_eq!(fitted.thresholds.source.valid, shadow.receipts.len() as u64);
    assert_eq!(fitted.thresholds.source.bad, 0);
    assert_eq!(
        memory.keys().collect::<Vec<_>>(),
        fitted.thresholds.points.keys().collect::<Vec<_>>()
    );
    for p in ["args", "stop", "tool"] {
        assert!(memory[p].judged > 100, "{p}: {}", memory[p].judged);
    }
    for (p, m) in &memory {
        let f = &fitted.thresholds.points[p];
        assert_eq!(m.threshold, f.threshold, "{p}");
        assert_eq!(m.judged, f.judged, "{p}");
        assert_eq!(
            serde_json::to_value(m).unwrap(),
            serde_json::to_value(f).unwrap(),
            "{p}"
        );
    }
    // The stand-in is sure (0.99) on tool and args (wrong only on task 0) and unsure (0.6) on
    // stop: tool gets a threshold that delegates its picks, stop does not.
    assert!(memory["tool"].threshold.is_some_and(|t| t <= 0.99));
    assert!(memory["stop"].threshold.is_none_or(|t| t > 0.6));
    // The file that the CLI reads back gives the same thresholds to a cascade.
    let th = decision_sim::cli::read_thresholds(&tmp.path().join("thresholds.json")).unwrap();
    for (p, m) in &memory {
        assert_eq!(th[p], m.threshold, "{p}");
    }
}

#[test]
fn the_report_has_the_contract_shape_and_the_cascade_holds_success() {
    let thresholds: Thresholds = [("tool", Some(0.95)), ("args", Some(0.95)), ("stop", None)]
        .into_iter()
        .map(|(p, t)| (p.to_string(), t))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let th_path = tmp.path().join("th.json");
    let th_json = serde_json::json!({"schema": "decision-thresholds/1",
        "fitted_at": "2026-11-30T12:00:00Z", "points": {
        "tool": {"status": "fitted", "threshold": 0.95},
        "args": {"status": "fitted", "threshold": 0.95},
        "stop": {"status": "insufficient-data", "threshold": null}}});
    std::fs::write(&th_path, th_json.to_string()).unwrap();
    let args = SimArgs {
        model: Some("key".into()),
        rules: RulesVersion::V1,
        tasks: 300,
        seed: 42,
        modes: "llm,model,fixed:0.5,cascade".into(),
        thresholds: Some(th_path),
        receipts: None,
        report: None,
        price: 0.002,
        latency_ms: 809.0,
        batch: 32,
    };
    // A model that is right and sure (0.97) except on every 12th task, where it is as sure of a
    // wrong option; at stop it is unsure (0.6). The cascade at 0.95 takes its confident picks.
    let model = LoadedModel {
        scorer: Box::new(KeyScorer {
            right: 0.97,
            wrong_every: 12,
            states: 0,
        }),
        thresholds: Some(thresholds.clone()),
    };
    let out = simulate(&args, Some(model)).unwrap();
    let r = &out.report;
    assert_eq!(r["schema"], "decision-sim/1");
    assert_eq!(r["rules"], "v1");
    assert_eq!(r["tasks"], 300);
    assert_eq!(r["seed"], 42);
    for m in ["llm", "model", "fixed:0.5", "cascade"] {
        let mode = &r["modes"][m];
        for k in [
            "success",
            "success_low",
            "success_high",
            "llm_calls_per_task",
            "cost_per_task",
            "seconds_per_task",
        ] {
            assert!(mode[k].is_number(), "{m}.{k}: {}", mode[k]);
        }
        let (lo, s, hi) = (
            mode["success_low"].as_f64().unwrap(),
            mode["success"].as_f64().unwrap(),
            mode["success_high"].as_f64().unwrap(),
        );
        assert!(lo < s && s < hi, "{m}: {lo} {s} {hi}");
        assert!(mode["delegated"].is_object() && mode["vs_llm"].is_object());
    }
    let share = |m: &str, p: &str| r["modes"][m]["delegated"][p].as_f64().unwrap();
    assert_eq!(share("llm", "tool"), 0.0);
    assert_eq!(share("model", "tool"), 1.0);
    assert_eq!(share("cascade", "stop"), 0.0, "stop has no threshold");
    assert_eq!(share("cascade", "tool"), 1.0, "every tool pick is at 0.97");
    // The cascade makes fewer LLM calls than llm and costs less.
    let f = |m: &str, k: &str| r["modes"][m][k].as_f64().unwrap();
    assert!(f("cascade", "llm_calls_per_task") < f("llm", "llm_calls_per_task"));
    assert_eq!(f("model", "llm_calls_per_task"), 0.0);
    assert!(f("cascade", "seconds_per_task") < f("llm", "seconds_per_task"));
    // The table and the chart show every mode.
    let table = decision_sim::report::table(r);
    let svg = decision_sim::report::svg(r);
    for m in ["llm", "model", "fixed:0.5", "cascade"] {
        assert!(table.contains(m) && svg.contains(&format!(">{m}<")), "{m}");
    }
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // Cascade without thresholds is refused, naming the way out.
    let mut no_th = args.clone();
    no_th.thresholds = None;
    no_th.modes = "cascade".into();
    let model = LoadedModel {
        scorer: Box::new(KeyScorer {
            right: 0.9,
            wrong_every: 5,
            states: 0,
        }),
        thresholds: None,
    };
    let e = simulate(&no_th, Some(model)).err().unwrap().to_string();
    assert!(e.contains("--thresholds"), "{e}");
}

#[test]
fn each_distinct_state_is_scored_once() {
    let states = decision_data::r#gen::generate(&decision_data::r#gen::GenOptions {
        tasks: 5,
        ..Default::default()
    })
    .unwrap();
    let mut scorer = KeyScorer {
        right: 0.9,
        wrong_every: 1000,
        states: 0,
    };
    let mut cache = Cache::new(&mut scorer, 4);
    let refs: Vec<&State> = states.iter().chain(&states).collect();
    cache.fill(&refs).unwrap();
    let first = cache.get(&states[0]).unwrap();
    assert_eq!(cache.scored, states.len() as u64);
    assert_eq!(cache.hits, 1);
    assert_eq!(
        first.probs.as_ref().unwrap().len(),
        states[0].candidates.len()
    );
    drop(cache);
    assert_eq!(scorer.states, states.len() as u64);
}
