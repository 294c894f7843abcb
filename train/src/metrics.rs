//! Evaluation metrics on scored states: accuracy, NLL, Brier, ECE, reliability bins, and the
//! grouping by decision point, `after_error` and `rules`.
//!
//! * accuracy: share of states whose highest-probability candidate is the answer (a tie goes to
//!   the first candidate in the presented order);
//! * NLL: mean of `−ln p(answer)` (probabilities floored at 1e-12);
//! * Brier: mean of the multi-class Brier score `Σ_i (p_i − onehot_i)²`, in [0, 2];
//! * ECE: 15 equal-width bins on the top-label confidence; `Σ_b (n_b / N) · |acc_b − conf_b|`.
//!   Bin `b` holds confidences in `[b/15, (b+1)/15)`, the last bin also holds 1.0.

use decision_data::stats::first_max;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::loss::{brier, softmax};

/// Number of equal-width confidence bins for ECE and the reliability diagram.
pub(crate) const ECE_BINS: usize = 15;

/// One evaluated state: its group keys, its option logits (before temperature) and answer.
#[derive(Debug, Clone)]
pub struct ScoredState {
    pub id: String,
    pub point: String,
    pub after_error: bool,
    pub rules: Option<String>,
    /// Option logits in the state's own candidate order, temperature 1.
    pub logits: Vec<f32>,
    pub answer: usize,
    /// Its prompt was over `max_tokens` and scored cut to fit (decision-worker would answer
    /// `capacity` instead).
    pub truncated: bool,
}

impl ScoredState {
    /// Probabilities at temperature `t`.
    pub fn probs(&self, t: f32) -> Vec<f64> {
        let z: Vec<f32> = self.logits.iter().map(|&x| x / t).collect();
        softmax(&z)
    }
}

/// Summary metrics of a set of states.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub n: usize,
    pub accuracy: f64,
    pub nll: f64,
    pub brier: f64,
    pub ece: f64,
}

/// One reliability bin.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Bin {
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
    /// Mean top-label confidence in the bin (0 when empty).
    pub confidence: f64,
    /// Share of correct picks in the bin (0 when empty).
    pub accuracy: f64,
}

/// Reliability bins from (confidence, correct) pairs.
pub fn reliability(pairs: &[(f64, bool)], bins: usize) -> Vec<Bin> {
    let mut n = vec![0usize; bins];
    let mut conf = vec![0.0f64; bins];
    let mut hit = vec![0usize; bins];
    for &(c, ok) in pairs {
        let b = ((c * bins as f64).floor() as usize).min(bins - 1);
        n[b] += 1;
        conf[b] += c;
        hit[b] += ok as usize;
    }
    (0..bins)
        .map(|b| Bin {
            lo: b as f64 / bins as f64,
            hi: (b + 1) as f64 / bins as f64,
            n: n[b],
            confidence: if n[b] > 0 { conf[b] / n[b] as f64 } else { 0.0 },
            accuracy: if n[b] > 0 {
                hit[b] as f64 / n[b] as f64
            } else {
                0.0
            },
        })
        .collect()
}

/// Expected calibration error over equal-width bins (0 with no pairs).
pub fn ece(pairs: &[(f64, bool)], bins: usize) -> f64 {
    bins_ece(&reliability(pairs, bins))
}

/// Expected calibration error of reliability bins (0 when they are empty)
/// ([`decision_data::calibration::expected_calibration_error`]).
pub(crate) fn bins_ece(bins: &[Bin]) -> f64 {
    decision_data::calibration::expected_calibration_error(
        bins.iter().map(|b| (b.n as u64, b.accuracy, b.confidence)),
    )
    .unwrap_or(0.0)
}

/// Metrics of the states picked by `keep`, at temperature(s) from `temp`.
pub fn metrics<'a>(
    states: impl IntoIterator<Item = &'a ScoredState>,
    temp: &dyn Fn(&ScoredState) -> f32,
) -> Metrics {
    let mut n = 0usize;
    let (mut correct, mut nll, mut br) = (0usize, 0.0f64, 0.0f64);
    let mut pairs = Vec::new();
    for s in states {
        let p = s.probs(temp(s));
        let pick = first_max(&p);
        n += 1;
        correct += (pick == s.answer) as usize;
        nll += -p[s.answer].max(1e-12).ln();
        br += brier(&p, s.answer);
        pairs.push((p[pick], pick == s.answer));
    }
    if n == 0 {
        return Metrics {
            n: 0,
            accuracy: 0.0,
            nll: 0.0,
            brier: 0.0,
            ece: 0.0,
        };
    }
    let d = n as f64;
    Metrics {
        n,
        accuracy: correct as f64 / d,
        nll: nll / d,
        brier: br / d,
        ece: ece(&pairs, ECE_BINS),
    }
}

/// Metrics overall and per group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub overall: Metrics,
    pub by_point: BTreeMap<String, Metrics>,
    /// Keys `"false"` / `"true"`.
    pub by_after_error: BTreeMap<String, Metrics>,
    /// Keys are the `rules` values; states without one are under `"-"`.
    pub by_rules: BTreeMap<String, Metrics>,
    /// For synthetic states: `"touched"` / `"untouched"` / `"diverged"` by the v1 → v2 rule
    /// change (`decision_data::gen::rule_change_group`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_rule_change: BTreeMap<String, Metrics>,
    /// Share of states whose pick changed under other candidate orders (when measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flip_rate: Option<f64>,
    /// The flip rate per decision point (when measured).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flip_rate_by_point: BTreeMap<String, f64>,
}

impl Report {
    pub fn new(states: &[ScoredState], temp: &dyn Fn(&ScoredState) -> f32) -> Self {
        let group = |key: &dyn Fn(&ScoredState) -> String| {
            let mut keys: Vec<String> = states.iter().map(key).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .map(|k| {
                    let m = metrics(states.iter().filter(|s| key(s) == k), temp);
                    (k, m)
                })
                .collect::<BTreeMap<_, _>>()
        };
        Report {
            overall: metrics(states, temp),
            by_point: group(&|s| s.point.clone()),
            by_after_error: group(&|s| s.after_error.to_string()),
            by_rules: group(&|s| s.rules.clone().unwrap_or_else(|| "-".into())),
            by_rule_change: BTreeMap::new(),
            flip_rate: None,
            flip_rate_by_point: BTreeMap::new(),
        }
    }
}

/// Flips: for each state, the pick in its original order against its picks under `K` other
/// orders (each mapped back to original candidate indices); a state flips when any of those
/// picks differs.
pub(crate) fn flips(original_picks: &[usize], permuted_picks: &[Vec<usize>]) -> Vec<bool> {
    original_picks
        .iter()
        .zip(permuted_picks)
        .map(|(o, ps)| ps.iter().any(|p| p != o))
        .collect()
}

/// The share of `true` in `flags` (0 when empty).
pub fn share(flags: &[bool]) -> f64 {
    flags.iter().filter(|&&f| f).count() as f64 / flags.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(point: &str, logits: Vec<f32>, answer: usize) -> ScoredState {
        ScoredState {
            id: String::new(),
            point: point.into(),
            after_error: false,
            rules: None,
            logits,
            answer,
            truncated: false,
        }
    }

    #[test]
    fn ece_by_hand() {
        // Two states at confidence 0.9 (one right, one wrong) and one at 0.5 (right), 15 bins:
        // bin 13 [0.8667, 0.9333): n = 2, acc 0.5, conf 0.9 -> |0.4| · 2/3
        // bin 7 [0.4667, 0.5333): n = 1, acc 1, conf 0.5 -> |0.5| · 1/3
        let pairs = [(0.9, true), (0.9, false), (0.5, true)];
        let e = ece(&pairs, 15);
        assert!((e - (0.4 * 2.0 / 3.0 + 0.5 / 3.0)).abs() < 1e-12, "{e}");
        // confidence 1.0 falls in the last bin
        let bins = reliability(&[(1.0, true)], 15);
        assert_eq!(bins[14].n, 1);
    }

    #[test]
    fn metrics_by_hand() {
        // state A: logits [ln 3, 0] -> p [0.75, 0.25], answer 0 (right)
        // state B: logits [0, 0, 0] -> p [1/3]*3, pick 0 (first on tie), answer 1 (wrong)
        let s = vec![
            st("tool", vec![3f32.ln(), 0.0], 0),
            st("stop", vec![0.0; 3], 1),
        ];
        let m = metrics(&s, &|_| 1.0);
        assert_eq!(m.n, 2);
        assert!((m.accuracy - 0.5).abs() < 1e-12);
        let nll = (-(0.75f64).ln() + 3f64.ln()) / 2.0;
        assert!((m.nll - nll).abs() < 1e-6, "{} vs {nll}", m.nll);
        // Brier A = 0.125; B = (1/3)^2 + (2/3)^2 + (1/3)^2 = 6/9
        assert!((m.brier - (0.125 + 6.0 / 9.0) / 2.0).abs() < 1e-6);
        let r = Report::new(&s, &|_| 1.0);
        assert_eq!(r.by_point.len(), 2);
        assert!((r.by_point["tool"].accuracy - 1.0).abs() < 1e-12);
        assert_eq!(r.by_rules["-"].n, 2);
    }

    #[test]
    fn temperature_changes_confidence_not_pick() {
        let s = vec![st("tool", vec![2.0, 0.0], 0)];
        let hot = metrics(&s, &|_| 4.0);
        let cold = metrics(&s, &|_| 0.5);
        assert_eq!(hot.accuracy, cold.accuracy);
        assert!(hot.nll > cold.nll);
    }

    #[test]
    fn flip_rate_counts_any_change() {
        let f = flips(
            &[0, 1, 2, 0],
            &[vec![0, 0], vec![1, 1], vec![2, 1], vec![0, 0]],
        );
        assert_eq!(f, [false, false, true, false]);
        assert!((share(&f) - 0.25).abs() < 1e-12);
    }
}
