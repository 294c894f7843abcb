//! One mode over N tasks of the shop. Tasks are `Episode::new(rules, seed, i)` for `i` in
//! `0..tasks`, the same in every mode, so modes are compared on the same tasks; all episodes of
//! a mode advance in lock step, one decision each per round, so the model scores a round's new
//! states in one batch.

use std::collections::BTreeMap;

use anyhow::Result;
use decision_data::r#gen::{End, Episode, RulesVersion, task_id};
use decision_data::{
    Fallback, Outcome, OutcomeStatus, Receipt, ReceiptResult, Shadow, State, Validation,
};

use crate::Thresholds;
use crate::llm::Llm;
use crate::mode::Mode;
use crate::scorer::Cache;
use decision_data::stats::first_max;

/// The `split` written into the simulated states (they are nobody's training data).
pub const SPLIT: &str = "test";

/// What every mode of one simulation shares.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub rules: RulesVersion,
    pub tasks: usize,
    pub seed: u64,
    pub llm: Llm,
    /// `cascade`'s thresholds per point.
    pub thresholds: Thresholds,
    /// Time stamp of every receipt (RFC 3339): the simulation's start.
    pub at: String,
}

/// One task's outcome in one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskResult {
    pub task_id: String,
    pub end: End,
    /// Decisions taken.
    pub steps: usize,
    pub llm_calls: usize,
    /// Decisions the model's pick was acted on.
    pub model_decisions: usize,
    /// Simulated wall time: LLM latency per call plus the model's measured time per state it
    /// was consulted on (not in `shadow`, where it runs beside the LLM).
    pub seconds: f64,
    /// The states met, in order, with the id acted on.
    pub trajectory: Vec<(State, String)>,
}

/// Decisions and delegated decisions at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PointCount {
    pub decisions: u64,
    pub delegated: u64,
}

/// A mode's run.
#[derive(Debug, Clone)]
pub struct ModeRun {
    pub mode: Mode,
    pub tasks: Vec<TaskResult>,
    pub points: BTreeMap<String, PointCount>,
    /// Contract receipts, one per decision, outcome filled in (`shadow` and `cascade` only).
    pub receipts: Vec<Receipt>,
    /// Mean measured model time per consulted state, milliseconds (`None`: never consulted).
    pub model_ms_per_state: Option<f64>,
}

impl ModeRun {
    pub fn successes(&self) -> Vec<bool> {
        self.tasks.iter().map(|t| t.end.is_success()).collect()
    }
}

/// What the model said about a state, when consulted.
struct ModelView {
    probs: Option<Vec<f64>>,
    ms: f64,
}

/// Run `mode` on the configured tasks. `cache` is the model; a mode other than `llm` needs one.
pub fn run_mode(cfg: &SimConfig, mode: Mode, mut cache: Option<&mut Cache<'_>>) -> Result<ModeRun> {
    if mode.uses_model() && cache.is_none() {
        anyhow::bail!("mode {mode} needs a model (--model)");
    }
    let model_name = cache.as_ref().map(|c| c.name());
    let mut eps: Vec<Episode> = (0..cfg.tasks as u64)
        .map(|i| Episode::new(cfg.rules, cfg.seed, i, SPLIT))
        .collect();
    let mut results: Vec<TaskResult> = (0..cfg.tasks as u64)
        .map(|i| TaskResult {
            task_id: task_id(cfg.seed, i),
            end: End::Success,
            steps: 0,
            llm_calls: 0,
            model_decisions: 0,
            seconds: 0.0,
            trajectory: Vec::new(),
        })
        .collect();
    let mut pending: Vec<Vec<Receipt>> = vec![Vec::new(); cfg.tasks];
    let mut points: BTreeMap<String, PointCount> = BTreeMap::new();
    let (mut model_ms, mut model_states) = (0.0f64, 0u64);
    loop {
        let live: Vec<usize> = (0..eps.len())
            .filter(|&i| eps[i].state().is_some())
            .collect();
        if live.is_empty() {
            break;
        }
        if mode.uses_model()
            && let Some(c) = cache.as_deref_mut()
        {
            let states: Vec<&State> = live
                .iter()
                .map(|&i| &eps[i].state().expect("live").state)
                .collect();
            c.fill(&states)?;
        }
        for &i in &live {
            let state = eps[i].state().expect("live").state.clone();
            let llm_pick = cfg.llm.answer(&state)?;
            let view = match cache.as_deref_mut() {
                Some(c) if mode.uses_model() => {
                    let s = c.get(&state)?;
                    Some(ModelView {
                        probs: s.probs,
                        ms: s.ms,
                    })
                }
                _ => None,
            };
            let model_pick = view
                .as_ref()
                .and_then(|v| v.probs.as_ref())
                .map(|p| (first_max(p), p[first_max(p)]));
            let threshold = match mode {
                Mode::Model => Some(0.0),
                Mode::Fixed(t) => Some(t),
                Mode::Cascade => cfg.thresholds.get(&state.point).copied().flatten(),
                Mode::Llm | Mode::Shadow => None,
            };
            let delegated = match (model_pick, threshold) {
                (Some((_, conf)), Some(t)) => conf >= t,
                _ => false,
            };
            let acted = if delegated {
                model_pick.expect("delegated").0
            } else {
                llm_pick
            };
            let r = &mut results[i];
            r.steps += 1;
            if delegated {
                r.model_decisions += 1;
            } else {
                r.llm_calls += 1;
                r.seconds += cfg.llm.latency_ms / 1000.0;
            }
            if let Some(v) = &view
                && mode != Mode::Shadow
            {
                r.seconds += v.ms / 1000.0;
                model_ms += v.ms;
                model_states += 1;
            }
            let p = points.entry(state.point.clone()).or_default();
            p.decisions += 1;
            p.delegated += u64::from(delegated);
            if mode.writes_receipts() {
                pending[i].push(receipt(
                    cfg,
                    mode,
                    model_name.as_deref(),
                    &state,
                    model_pick,
                    delegated,
                    threshold,
                ));
            }
            let id = state.candidates[acted].id.clone();
            eps[i].act(&id)?;
            r.trajectory.push((state, id));
        }
    }
    let mut receipts = Vec::new();
    for (i, ep) in eps.iter().enumerate() {
        let end = ep.end().expect("every episode ends");
        let r = &mut results[i];
        r.end = end;
        let status = if end.is_success() {
            OutcomeStatus::Success
        } else {
            OutcomeStatus::Failure
        };
        for mut rec in std::mem::take(&mut pending[i]) {
            rec.outcome = Some(Outcome {
                status,
                duration_ms: Some((r.seconds * 1000.0).round() as u64),
                retries: None,
            });
            receipts.push(rec);
        }
    }
    Ok(ModeRun {
        mode,
        tasks: results,
        points,
        receipts,
        model_ms_per_state: (model_states > 0).then(|| model_ms / model_states as f64),
    })
}

/// The receipt of one decision (contracts section 3). The selector's pick is recorded with its
/// confidence; in `cascade` a pick below the threshold is a fallback to the LLM; in `shadow` it
/// is never acted on. Every receipt is judged against the answer key (`shadow.reference`).
fn receipt(
    cfg: &SimConfig,
    mode: Mode,
    model: Option<&str>,
    state: &State,
    model_pick: Option<(usize, f64)>,
    delegated: bool,
    threshold: Option<f64>,
) -> Receipt {
    let result = match model_pick {
        Some((i, confidence)) => ReceiptResult::Pick {
            id: state.candidates[i].id.clone(),
            confidence,
        },
        None => ReceiptResult::Abstain,
    };
    let fallback =
        (mode == Mode::Cascade && model_pick.is_some() && !delegated).then(|| Fallback {
            used: true,
            to: Some("llm".into()),
            reason: Some(match threshold {
                Some(_) => "below-threshold".into(),
                None => "no-threshold".into(),
            }),
        });
    Receipt {
        // the model in the id: two models' receipts of one simulation can share a folder
        id: match model {
            Some(m) => format!("sim:{mode}:{m}:{}", state.id),
            None => format!("sim:{mode}:{}", state.id),
        },
        at: cfg.at.clone(),
        point: state.point.clone(),
        model: model.map(str::to_string),
        candidates: state.candidates.iter().map(|c| c.id.clone()).collect(),
        result,
        validation: Validation::Accepted,
        fallback,
        outcome: None,
        shadow: state.answer.clone().map(|reference| Shadow { reference }),
        observed_outcome: None,
    }
}
