//! Temperature scaling (contracts section 2): after training, one temperature per decision point
//! is fitted on the validation split by minimising the NLL of `softmax(logits / T)`.
//!
//! The NLL is convex in `β = 1/T` (a log-sum-exp of functions linear in β, minus a linear term),
//! so its minimum is found exactly by bisection on the sign of the derivative
//! `dNLL/dβ = mean_s( E_p[z] − z_answer )`. `T` is kept within [`T_MIN`, `T_MAX`]: when every
//! state is already right with a margin the NLL keeps falling as `T → 0`, and the bound stops it.
//! A point with fewer than `min_states` validation states gets the global temperature.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::{ECE_BINS, ScoredState, metrics};

pub const T_MIN: f64 = 0.05;
pub const T_MAX: f64 = 20.0;

/// Default for `min_states`: points with fewer validation states use the global fit.
pub const MIN_STATES_PER_POINT: usize = 50;

/// The fitted temperatures: a global one and one per decision point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Temperatures {
    /// Fitted on all validation states; used for points without their own.
    pub global: f32,
    /// Per decision point; a point missing here uses `global`.
    pub points: BTreeMap<String, f32>,
}

impl Default for Temperatures {
    fn default() -> Self {
        Self {
            global: 1.0,
            points: BTreeMap::new(),
        }
    }
}

impl Temperatures {
    pub fn for_point(&self, point: &str) -> f32 {
        self.points.get(point).copied().unwrap_or(self.global)
    }
}

/// Mean NLL at inverse temperature `beta` and its derivative in `beta`.
fn nll_and_grad(states: &[&ScoredState], beta: f64) -> (f64, f64) {
    let (mut nll, mut grad) = (0.0, 0.0);
    for s in states {
        let z: Vec<f64> = s.logits.iter().map(|&x| x as f64).collect();
        let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(beta * b));
        let e: Vec<f64> = z.iter().map(|&x| (beta * x - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        let lse = m + sum.ln();
        nll += lse - beta * z[s.answer];
        let ez: f64 = e.iter().zip(&z).map(|(ei, zi)| ei * zi).sum::<f64>() / sum;
        grad += ez - z[s.answer];
    }
    let n = states.len().max(1) as f64;
    (nll / n, grad / n)
}

/// The NLL-minimising temperature of `states`, within [`T_MIN`, `T_MAX`]; 1.0 when empty.
pub fn fit_temperature(states: &[&ScoredState]) -> f32 {
    if states.is_empty() {
        return 1.0;
    }
    let (mut lo, mut hi) = (1.0 / T_MAX, 1.0 / T_MIN);
    if nll_and_grad(states, lo).1 >= 0.0 {
        return T_MAX as f32;
    }
    if nll_and_grad(states, hi).1 <= 0.0 {
        return T_MIN as f32;
    }
    for _ in 0..100 {
        let mid = (lo * hi).sqrt();
        if nll_and_grad(states, mid).1 < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi / lo < 1.0 + 1e-9 {
            break;
        }
    }
    (1.0 / (lo * hi).sqrt()) as f32
}

/// Fit the global temperature and one per point that has at least `min_states` states.
pub fn fit(states: &[ScoredState], min_states: usize) -> Temperatures {
    let all: Vec<&ScoredState> = states.iter().collect();
    let global = fit_temperature(&all);
    let mut by_point: BTreeMap<&str, Vec<&ScoredState>> = BTreeMap::new();
    for s in states {
        by_point.entry(&s.point).or_default().push(s);
    }
    let points = by_point
        .into_iter()
        .filter(|(_, v)| v.len() >= min_states)
        .map(|(k, v)| (k.to_string(), fit_temperature(&v)))
        .collect();
    Temperatures { global, points }
}

/// ECE before (T = 1) and after (fitted temperatures) on the same states.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CalibrationReport {
    pub ece_before: f64,
    pub ece_after: f64,
    pub nll_before: f64,
    pub nll_after: f64,
    pub bins: usize,
}

pub fn report(states: &[ScoredState], t: &Temperatures) -> CalibrationReport {
    let before = metrics(states, &|_| 1.0);
    let after = metrics(states, &|s| t.for_point(&s.point));
    CalibrationReport {
        ece_before: before.ece,
        ece_after: after.ece,
        nll_before: before.nll,
        nll_after: after.nll,
        bins: ECE_BINS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn state(point: &str, logits: Vec<f32>, answer: usize) -> ScoredState {
        ScoredState {
            id: String::new(),
            point: point.into(),
            after_error: false,
            rules: None,
            logits,
            answer,
        }
    }

    /// States drawn from a calibrated model at temperature `t_true`, then presented with
    /// logits multiplied by `t_true`: the fit must find `t_true` back.
    fn overconfident(n: usize, t_true: f32, seed: u64, point: &str) -> Vec<ScoredState> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let z: Vec<f32> = (0..4).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                let p = crate::loss::softmax(&z);
                let u: f64 = rng.random();
                let mut acc = 0.0;
                let mut answer = 3;
                for (i, pi) in p.iter().enumerate() {
                    acc += pi;
                    if u < acc {
                        answer = i;
                        break;
                    }
                }
                state(point, z.iter().map(|x| x * t_true).collect(), answer)
            })
            .collect()
    }

    #[test]
    fn recovers_known_temperature() {
        let s = overconfident(4000, 2.5, 7, "tool");
        let refs: Vec<&ScoredState> = s.iter().collect();
        let t = fit_temperature(&refs);
        assert!((t - 2.5).abs() < 0.25, "fitted {t}");
        // the fit is a minimum: nudging T either way raises the NLL
        let nll = |t: f64| nll_and_grad(&refs, 1.0 / t).0;
        assert!(nll(t as f64) <= nll(t as f64 * 1.05));
        assert!(nll(t as f64) <= nll(t as f64 / 1.05));
        let r = report(
            &s,
            &Temperatures {
                global: t,
                points: BTreeMap::new(),
            },
        );
        assert!(r.ece_after < r.ece_before);
    }

    #[test]
    fn small_points_fall_back_to_global() {
        let mut s = overconfident(300, 2.0, 1, "tool");
        s.extend(overconfident(20, 0.5, 2, "stop"));
        let t = fit(&s, MIN_STATES_PER_POINT);
        assert!(t.points.contains_key("tool"));
        assert!(!t.points.contains_key("stop"));
        assert_eq!(t.for_point("stop"), t.global);
    }

    #[test]
    fn separable_data_hits_the_lower_bound() {
        let s = [
            state("tool", vec![5.0, 0.0], 0),
            state("tool", vec![0.0, 5.0], 1),
        ];
        let refs: Vec<&ScoredState> = s.iter().collect();
        assert_eq!(fit_temperature(&refs), T_MIN as f32);
    }
}
