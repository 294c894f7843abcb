//! Temperature scaling (contracts section 2): after training, one temperature per decision point
//! is fitted on the validation split by minimising the NLL of `softmax(logits / T)`.
//!
//! The NLL is convex in `β = 1/T` (a log-sum-exp of functions linear in β, minus a linear term),
//! so its minimum is found exactly by bisection on the sign of the derivative
//! `dNLL/dβ = mean_s( E_p[z] − z_answer )`. `T` is kept within [`T_MIN`, `T_MAX`]: when every
//! state is already right with a margin the NLL keeps falling as `T → 0`, and the bound stops it.
//! A point with fewer than `min_states` validation states gets the global temperature.
//!
//! A fit that ends on a bound is not a minimum: [`Temperatures`] says which ones did, the run
//! warns, and `decision.json` records them (`temperature_clamped`, `temperatures_clamped`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::ScoredState;
use decision_prompt::spec::{DecisionSpec, TemperatureClamp};

pub(crate) const T_MIN: f64 = 0.05;
pub(crate) const T_MAX: f64 = 20.0;

/// The fitted temperatures: a global one and one per decision point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Temperatures {
    /// Fitted on all validation states; used for points without their own.
    pub global: f32,
    /// Per decision point; a point missing here uses `global`.
    pub points: BTreeMap<String, f32>,
    /// Set when `global` sits at a bound of [`T_MIN`, `T_MAX`] rather than at a minimum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_clamped: Option<TemperatureClamp>,
    /// The points of `points` whose temperature sits at a bound.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clamped: BTreeMap<String, TemperatureClamp>,
}

impl Default for Temperatures {
    fn default() -> Self {
        Self {
            global: 1.0,
            points: BTreeMap::new(),
            global_clamped: None,
            clamped: BTreeMap::new(),
        }
    }
}

impl Temperatures {
    pub(crate) fn for_point(&self, point: &str) -> f32 {
        self.points.get(point).copied().unwrap_or(self.global)
    }

    /// Store the temperatures in `spec` (`decision.json`), clamps included.
    pub(crate) fn record_in(&self, spec: &mut DecisionSpec) {
        spec.temperature = self.global as f64;
        spec.temperatures = self
            .points
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64))
            .collect();
        spec.temperature_clamped = self.global_clamped;
        spec.temperatures_clamped = self.clamped.clone();
    }

    /// One warning per temperature that sits at a bound, naming its decision point.
    pub(crate) fn warnings(&self) -> Vec<String> {
        let what = |c: TemperatureClamp| match c {
            TemperatureClamp::Floor => format!(
                "its floor T = {T_MIN}: the validation NLL was still falling (every state right by \
                 a wide margin), so the probabilities are at least this sharp and no sharper is \
                 known; more varied validation states would calibrate it"
            ),
            TemperatureClamp::Ceiling => format!(
                "its ceiling T = {T_MAX}: the validation NLL was still falling, so the logits carry \
                 almost no signal there"
            ),
        };
        let mut out: Vec<String> = self
            .clamped
            .iter()
            .map(|(p, &c)| {
                format!(
                    "the temperature of decision point {p:?} sits at {}; decision.json records it \
                     in temperatures_clamped",
                    what(c)
                )
            })
            .collect();
        if let Some(c) = self.global_clamped {
            out.push(format!(
                "the global temperature (for points without their own) sits at {}; decision.json \
                 records it as temperature_clamped",
                what(c)
            ));
        }
        out
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

/// The NLL-minimising temperature of `states`, within [`T_MIN`, `T_MAX`] (1.0 when empty), and
/// the bound the fit ran into when the minimum lies beyond it.
pub(crate) fn fit_bounded(states: &[&ScoredState]) -> (f32, Option<TemperatureClamp>) {
    if states.is_empty() {
        return (1.0, None);
    }
    let (mut lo, mut hi) = (1.0 / T_MAX, 1.0 / T_MIN);
    if nll_and_grad(states, lo).1 >= 0.0 {
        return (T_MAX as f32, Some(TemperatureClamp::Ceiling));
    }
    if nll_and_grad(states, hi).1 <= 0.0 {
        return (T_MIN as f32, Some(TemperatureClamp::Floor));
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
    ((1.0 / (lo * hi).sqrt()) as f32, None)
}

/// Fit the global temperature and one per point that has at least `min_states` states, noting
/// each that sits at a bound.
pub fn fit(states: &[ScoredState], min_states: usize) -> Temperatures {
    let all: Vec<&ScoredState> = states.iter().collect();
    let (global, global_clamped) = fit_bounded(&all);
    let mut by_point: BTreeMap<&str, Vec<&ScoredState>> = BTreeMap::new();
    for s in states {
        by_point.entry(&s.point).or_default().push(s);
    }
    let mut t = Temperatures {
        global,
        global_clamped,
        ..Temperatures::default()
    };
    for (k, v) in by_point.into_iter().filter(|(_, v)| v.len() >= min_states) {
        let (temp, clamp) = fit_bounded(&v);
        t.points.insert(k.to_string(), temp);
        if let Some(c) = clamp {
            t.clamped.insert(k.to_string(), c);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::metrics;
    use rand::{Rng, SeedableRng};

    /// `[eval] min_states_per_point` as the configs set it.
    const MIN_STATES_PER_POINT: usize = 50;

    fn state(point: &str, logits: Vec<f32>, answer: usize) -> ScoredState {
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
        let (t, clamp) = fit_bounded(&refs);
        assert!((t - 2.5).abs() < 0.25 && clamp.is_none(), "fitted {t}");
        // the fit is a minimum: nudging T either way raises the NLL
        let nll = |t: f64| nll_and_grad(&refs, 1.0 / t).0;
        assert!(nll(t as f64) <= nll(t as f64 * 1.05));
        assert!(nll(t as f64) <= nll(t as f64 / 1.05));
        let before = metrics(&s, &|_| 1.0);
        let after = metrics(&s, &|_| t);
        assert!(after.ece < before.ece);
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
        assert_eq!(
            fit_bounded(&refs),
            (T_MIN as f32, Some(TemperatureClamp::Floor))
        );
    }

    #[test]
    fn a_point_at_the_floor_is_recorded_as_clamped_and_warned_about() {
        // `stop`: every state right by a wide margin (the tiny base's stop point); `tool`: noisy.
        let mut s = overconfident(300, 2.0, 3, "tool");
        for i in 0..60 {
            let a = i % 2;
            let mut z = vec![0.0, 0.0];
            z[a] = 12.0;
            s.push(state("stop", z, a));
        }
        let t = fit(&s, MIN_STATES_PER_POINT);
        assert_eq!(t.points["stop"], T_MIN as f32);
        assert_eq!(t.clamped.get("stop"), Some(&TemperatureClamp::Floor));
        assert!(!t.clamped.contains_key("tool"), "{:?}", t.clamped);
        assert_eq!(
            t.global_clamped, None,
            "the global fit has the noisy states too"
        );
        let w = t.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("\"stop\"") && w[0].contains("floor"), "{w:?}");

        let mut spec = DecisionSpec::defaults(decision_prompt::spec::PromptTemplate::plain());
        t.record_in(&mut spec);
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            v["temperatures_clamped"],
            serde_json::json!({"stop": "floor"})
        );
        assert!(v.get("temperature_clamped").is_none());
        assert!((v["temperatures"]["stop"].as_f64().unwrap() - T_MIN).abs() < 1e-6);
        spec.validate().unwrap();

        // nothing at a bound: nothing recorded, no warning
        let t = fit(&overconfident(300, 2.0, 4, "tool"), MIN_STATES_PER_POINT);
        assert!(t.clamped.is_empty() && t.global_clamped.is_none() && t.warnings().is_empty());
    }
}
