//! `decision eval`: metrics of a model on states, overall and per group, the option-order flip
//! rate, shadow receipts for `decision fit`, and the side-by-side comparison with a baseline.
//!
//! Probabilities use the model's own temperatures (`decision.json`). The groups are the
//! decision point, `after_error`, `rules`, and — for states made by `decision gen states` —
//! whether the rule change between v1 and v2 touches the state.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use decision_data::{Split, SplitRatios, State};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::data_order::{mix_seed, permuted};
use crate::loss::{LossWeights, state_loss};
use crate::metrics::{Metrics, Report, ScoredState, flips, metrics, share};
use crate::model::decision_model::DecisionModel;

/// The JSON `--report` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EvalReport {
    pub schema: String,
    pub model: String,
    pub data: String,
    pub split: String,
    pub report: Report,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Box<EvalReport>>,
}

/// Raw option logits of every state (temperature 1), in input order; refused, naming the
/// state, when a state's logits are not finite (they would make receipts `fit` rejects). On the
/// CPU at most `side_by_side` batches run at once, the memory plan's count (`None`: no plan; as
/// many as the free memory holds, `crate::model::score::logits_in_batches`).
pub(crate) fn score_states(
    dm: &DecisionModel,
    states: &[State],
    batch_size: usize,
    side_by_side: Option<usize>,
) -> Result<Vec<ScoredState>> {
    let encoded = states
        .iter()
        .map(|s| dm.encode(s))
        .collect::<Result<Vec<_>>>()?;
    let logits = crate::model::score::logits_in_batches(
        &dm.model,
        &encoded,
        dm.pad_id,
        batch_size,
        side_by_side,
        &mut |_| {},
    );
    crate::model::score::check_finite(&logits, &|i| format!("state {:?}", states[i].id))
        .with_context(|| dm.origin.clone())?;
    Ok(states
        .iter()
        .zip(logits)
        .zip(&encoded)
        .map(|((s, l), e)| ScoredState {
            id: s.id.clone(),
            point: s.point.clone(),
            after_error: s.after_error,
            rules: s.rules.clone(),
            logits: l.into_iter().map(|x| x as f32).collect(),
            answer: s.answer_index().unwrap_or(usize::MAX),
            truncated: e.truncated,
        })
        .collect())
}

/// Mean training loss (contract section 2) of labelled states at temperature 1.
pub(crate) fn mean_loss(scored: &[ScoredState], states: &[State], w: LossWeights) -> f64 {
    let mut sum = 0.0;
    let mut n = 0usize;
    for (sc, st) in scored.iter().zip(states) {
        if sc.answer == usize::MAX {
            continue;
        }
        let teacher: Option<Vec<f32>> = st
            .teacher
            .as_ref()
            .map(|t| t.iter().map(|&x| x as f32).collect());
        sum += state_loss(&sc.logits, sc.answer, teacher.as_deref(), w);
        n += 1;
    }
    sum / n.max(1) as f64
}

/// Share of states whose pick changes under `k` other random candidate orders; batches as in
/// [`score_states`].
pub fn flip_rate(
    dm: &DecisionModel,
    states: &[State],
    k: usize,
    seed: u64,
    batch_size: usize,
    side_by_side: Option<usize>,
) -> Result<f64> {
    Ok(share(&flipped(
        dm,
        states,
        k,
        seed,
        batch_size,
        side_by_side,
    )?))
}

/// For each state, whether its pick changes under `k` other random candidate orders.
pub fn flipped(
    dm: &DecisionModel,
    states: &[State],
    k: usize,
    seed: u64,
    batch_size: usize,
    side_by_side: Option<usize>,
) -> Result<Vec<bool>> {
    if states.is_empty() || k == 0 {
        return Ok(vec![false; states.len()]);
    }
    let pick = |s: &ScoredState| decision_data::stats::first_max(&s.probs(1.0));
    let original: Vec<usize> = score_states(dm, states, batch_size, side_by_side)?
        .iter()
        .map(pick)
        .collect();
    let mut permuted_picks: Vec<Vec<usize>> = vec![Vec::with_capacity(k); states.len()];
    for round in 0..k {
        let orders: Vec<Vec<usize>> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut o: Vec<usize> = (0..s.candidates.len()).collect();
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(
                    seed,
                    0xf11b + round as u64,
                    i as u64,
                ));
                o.shuffle(&mut rng);
                o
            })
            .collect();
        let shown: Vec<State> = states
            .iter()
            .zip(&orders)
            .map(|(s, o)| permuted(s, o))
            .collect();
        let scored = score_states(dm, &shown, batch_size, side_by_side)?;
        for (i, sc) in scored.iter().enumerate() {
            permuted_picks[i].push(orders[i][pick(sc)]);
        }
    }
    Ok(flips(&original, &permuted_picks))
}

/// The states of `path` in `split` (`all` = every row). A row's split is its own `split`
/// field, or the hash of its task id. A row offering more than `max_options` (the model's) is
/// a bad row, named by file, row and field.
pub(crate) fn states_of_split(path: &Path, split: &str, max_options: usize) -> Result<Vec<State>> {
    let states = crate::data_order::load_states(path, max_options, None)?;
    if split == "all" {
        return Ok(states);
    }
    let want = Split::parse(split)
        .with_context(|| format!("--split {split}: expected all, train, valid or test"))?;
    let ratios = SplitRatios::default();
    Ok(states
        .into_iter()
        .filter(|s| ratios.split_of(s) == want)
        .collect())
}

/// The full report of a model on labelled states: groups, rule-change group, flip rate.
pub fn evaluate(
    dm: &DecisionModel,
    states: &[State],
    permutations: usize,
    seed: u64,
    batch_size: usize,
) -> Result<(Report, Vec<ScoredState>)> {
    let scored = score_states(dm, states, batch_size, None)?;
    let temp = |s: &ScoredState| dm.temperature(&s.point) as f32;
    let labelled: Vec<ScoredState> = scored
        .iter()
        .filter(|s| s.answer != usize::MAX)
        .cloned()
        .collect();
    let mut report = Report::new(&labelled, &temp);
    let groups: Vec<Option<&str>> = states
        .iter()
        .map(decision_data::r#gen::rule_change_group)
        .collect();
    if groups.iter().any(Option::is_some) {
        for name in ["touched", "untouched", "diverged"] {
            let group: Vec<&ScoredState> = scored
                .iter()
                .zip(&groups)
                .filter(|(s, g)| s.answer != usize::MAX && **g == Some(name))
                .map(|(s, _)| s)
                .collect();
            if !group.is_empty() {
                report
                    .by_rule_change
                    .insert(name.to_string(), metrics(group, &temp));
            }
        }
    }
    if permutations > 0 {
        let labelled_states: Vec<State> = states
            .iter()
            .filter(|s| s.answer.is_some())
            .cloned()
            .collect();
        let flags = flipped(dm, &labelled_states, permutations, seed, batch_size, None)?;
        report.flip_rate = Some(share(&flags));
        let mut by_point: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
        for (s, f) in labelled_states.iter().zip(&flags) {
            by_point.entry(s.point.as_str()).or_default().push(*f);
        }
        report.flip_rate_by_point = by_point
            .into_iter()
            .map(|(p, f)| (p.to_string(), share(&f)))
            .collect();
    }
    Ok((report, scored))
}

fn rows(r: &Report) -> Vec<(String, Metrics)> {
    let mut out = vec![("overall".to_string(), r.overall)];
    out.extend(r.by_point.iter().map(|(k, m)| (format!("point={k}"), *m)));
    out.extend(
        r.by_after_error
            .iter()
            .map(|(k, m)| (format!("after_error={k}"), *m)),
    );
    out.extend(r.by_rules.iter().map(|(k, m)| (format!("rules={k}"), *m)));
    out.extend(
        r.by_rule_change
            .iter()
            .map(|(k, m)| (format!("rule_change={k}"), *m)),
    );
    out
}

/// The metrics table as text.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "{:<24} {:>6} {:>9} {:>8} {:>8} {:>8}\n",
        "group", "n", "accuracy", "nll", "brier", "ece"
    );
    for (name, m) in rows(r) {
        s += &format!(
            "{name:<24} {:>6} {:>9.4} {:>8.4} {:>8.4} {:>8.4}\n",
            m.n, m.accuracy, m.nll, m.brier, m.ece
        );
    }
    if let Some(f) = r.flip_rate {
        let points: Vec<String> = r
            .flip_rate_by_point
            .iter()
            .map(|(p, x)| format!("{p} {x:.4}"))
            .collect();
        s += &format!(
            "flip rate (option order)  {f:.4}  ({})\n",
            points.join(", ")
        );
    }
    s
}

/// New against baseline: accuracy and ECE of both and the differences.
pub fn comparison(new: &Report, base: &Report) -> String {
    let mut s = format!(
        "{:<24} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}\n",
        "group", "n", "acc new", "acc base", "Δacc", "ece new", "ece base", "Δece"
    );
    let base_rows: BTreeMap<String, Metrics> = rows(base).into_iter().collect();
    for (name, m) in rows(new) {
        let Some(b) = base_rows.get(&name) else {
            continue;
        };
        s += &format!(
            "{name:<24} {:>6} {:>9.4} {:>9.4} {:>+8.4} {:>8.4} {:>8.4} {:>+8.4}\n",
            m.n,
            m.accuracy,
            b.accuracy,
            m.accuracy - b.accuracy,
            m.ece,
            b.ece,
            m.ece - b.ece
        );
    }
    if let (Some(a), Some(b)) = (new.flip_rate, base.flip_rate) {
        s += &format!("flip rate  new {a:.4}  base {b:.4}  Δ {:+.4}\n", a - b);
    }
    s
}
