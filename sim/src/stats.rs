//! The report's statistics: a success rate's 95 % interval (Wilson, as `fit` bounds its buckets)
//! and the non-inferiority test of a mode against `llm` on the same tasks.
//!
//! Non-inferiority is a one-sided paired t-test: with `d_i = success_mode(i) − success_llm(i)`
//! on task `i` (each −1, 0 or 1), H0 is `mean(d) ≤ −margin`, H1 `mean(d) > −margin`;
//! `t = (mean(d) + margin) / (sd(d) / √n)` with `n − 1` degrees of freedom, and the mode is
//! non-inferior when `p < alpha`. This is `scipy.stats.ttest_1samp(d, -margin,
//! alternative="greater")` (`scripts/sim_reference.py` computes the committed cross-check).
//! When every `d_i` is equal (`sd = 0`) the test has no spread to work with: `p` is 0 when the
//! common difference is above `−margin` and 1 otherwise (scipy answers NaN there).

use decision_fit::bounds::wilson;

/// The paper's margin (3 points of task success) and level.
pub const MARGIN: f64 = 0.03;
pub const ALPHA: f64 = 0.05;

/// A success rate with its two-sided 95 % Wilson interval.
pub fn success_interval(successes: u64, n: u64) -> (f64, f64) {
    wilson(successes, n, 0.95).unwrap_or((0.0, 1.0))
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonInferiority {
    /// `mean(d)`: the mode's success minus llm's, on the same tasks.
    pub difference: f64,
    pub t: f64,
    pub df: u64,
    pub p_value: f64,
    pub non_inferior: bool,
}

/// `P(T > t)` for Student's t with `df` (a whole number ≥ 1) degrees of freedom, by the finite
/// series of Abramowitz & Stegun 26.7.3 / 26.7.4 in `θ = atan(t / √df)`: exact up to rounding,
/// `df` terms at most.
pub fn t_sf(t: f64, df: u64) -> f64 {
    if t.is_infinite() {
        return if t > 0.0 { 0.0 } else { 1.0 };
    }
    let nu = df.max(1);
    let theta = (t.abs() / (nu as f64).sqrt()).atan();
    let (s, c2) = (theta.sin(), theta.cos().powi(2));
    // A = P(|T| <= |t|).
    let a = if nu % 2 == 1 {
        // (2/π)(θ + sinθ cosθ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + ... up to cos^(ν−3)θ))
        let mut sum = 0.0;
        if nu > 1 {
            let mut term = 1.0;
            sum = 1.0;
            let mut k = 1;
            while 2 * k < nu - 1 {
                term *= (2 * k) as f64 / (2 * k + 1) as f64 * c2;
                sum += term;
                k += 1;
            }
            sum *= s * c2.sqrt();
        }
        2.0 / std::f64::consts::PI * (theta + sum)
    } else {
        // sinθ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ... up to cos^(ν−2)θ)
        let mut term = 1.0;
        let mut sum = 1.0;
        let mut k = 1;
        while 2 * k < nu {
            term *= (2 * k - 1) as f64 / (2 * k) as f64 * c2;
            sum += term;
            k += 1;
        }
        s * sum
    };
    let tail = ((1.0 - a) / 2.0).clamp(0.0, 1.0);
    if t >= 0.0 { tail } else { 1.0 - tail }
}

/// The one-sided paired test of `mode` against `reference` (success per task, same tasks in the
/// same order) at `margin`. `None` for fewer than two tasks or unequal lengths.
pub fn non_inferiority(
    mode: &[bool],
    reference: &[bool],
    margin: f64,
    alpha: f64,
) -> Option<NonInferiority> {
    if mode.len() != reference.len() || mode.len() < 2 {
        return None;
    }
    let d: Vec<f64> = mode
        .iter()
        .zip(reference)
        .map(|(&m, &r)| f64::from(u8::from(m)) - f64::from(u8::from(r)))
        .collect();
    let n = d.len() as f64;
    let mean = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let df = mode.len() as u64 - 1;
    let shifted = mean + margin;
    let (t, p) = if var == 0.0 {
        let t = if shifted > 0.0 {
            f64::INFINITY
        } else if shifted < 0.0 {
            f64::NEG_INFINITY
        } else {
            0.0
        };
        (t, if shifted > 0.0 { 0.0 } else { 1.0 })
    } else {
        let t = shifted / (var / n).sqrt();
        (t, t_sf(t, df))
    };
    Some(NonInferiority {
        difference: mean,
        t,
        df,
        p_value: p,
        non_inferior: p < alpha,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` tasks where the mode and llm agree but for `worse` tasks the mode failed and llm
    /// succeeded, and `better` the other way round; `both` tasks both succeeded.
    fn paired(n: usize, both: usize, worse: usize, better: usize) -> (Vec<bool>, Vec<bool>) {
        let mut m = Vec::new();
        let mut r = Vec::new();
        for i in 0..n {
            let (a, b) = if i < both {
                (true, true)
            } else if i < both + worse {
                (false, true)
            } else if i < both + worse + better {
                (true, false)
            } else {
                (false, false)
            };
            m.push(a);
            r.push(b);
        }
        (m, r)
    }

    #[test]
    fn matches_a_hand_computation() {
        // 100 tasks, the mode loses 6 and wins 2: d has six −1, two +1, 92 zeros.
        // mean = −0.04; Σ(d − mean)² = 6·0.96² + 2·1.04² + 92·0.04² = 5.5296 + 2.1632 + 0.1472
        // = 7.84, var = 7.84 / 99, se = √(var / 100) = 0.028141; t = (−0.04 + 0.03) / se
        // = −0.35535; with 99 df, P(T > −0.35535) = 0.63845 (t tables / the regularised beta).
        let (m, r) = paired(100, 80, 6, 2);
        let ni = non_inferiority(&m, &r, 0.03, 0.05).unwrap();
        assert!((ni.difference + 0.04).abs() < 1e-12);
        let se = (7.84f64 / 99.0 / 100.0).sqrt();
        assert!((ni.t - (-0.01 / se)).abs() < 1e-12, "{}", ni.t);
        assert!((ni.t + 0.355_35).abs() < 1e-4, "{}", ni.t);
        assert!((ni.p_value - 0.638_45).abs() < 5e-4, "{}", ni.p_value);
        assert!(!ni.non_inferior);
        // Equal success, 5 tasks lost and 5 won of 500: var = 10 / 499, se = √(var / 500)
        // = 0.0063309, t = 0.03 / se = 4.7387: non-inferior, p ≈ 1.4e-6.
        let (m, r) = paired(500, 400, 5, 5);
        let ni = non_inferiority(&m, &r, 0.03, 0.05).unwrap();
        assert_eq!(ni.difference, 0.0);
        assert!((ni.t - 0.03 / (10.0f64 / 499.0 / 500.0).sqrt()).abs() < 1e-12);
        assert!(ni.non_inferior && ni.p_value < 1e-5, "{ni:?}");
        // No spread at all.
        let (m, r) = paired(10, 10, 0, 0);
        assert_eq!(non_inferiority(&m, &r, 0.03, 0.05).unwrap().p_value, 0.0);
        assert!(non_inferiority(&m[..1], &r[..1], 0.03, 0.05).is_none());
        // The t tail: symmetric, 0.5 at 0; df 1 is Cauchy (1/2 − atan(t)/π); df 2 has the
        // closed form 1/2 − t / (2√(2 + t²)); large df approaches the normal's 0.025 at 1.96.
        assert!((t_sf(0.0, 7) - 0.5).abs() < 1e-12);
        assert!((t_sf(1.3, 9) + t_sf(-1.3, 9) - 1.0).abs() < 1e-12);
        let cauchy = 0.5 - 1.7f64.atan() / std::f64::consts::PI;
        assert!((t_sf(1.7, 1) - cauchy).abs() < 1e-12);
        let two = 0.5 - 1.7 / (2.0 * (2.0f64 + 1.7 * 1.7).sqrt());
        assert!((t_sf(1.7, 2) - two).abs() < 1e-12);
        assert!((t_sf(1.959_964, 20_000) - 0.025).abs() < 1e-4);
    }

    #[test]
    fn matches_scipy() {
        // scripts/sim_reference.py writes these with scipy.stats.ttest_1samp.
        let text = include_str!("../tests/fixtures/noninferiority.json");
        let cases: serde_json::Value = serde_json::from_str(text).unwrap();
        let cases = cases["cases"].as_array().unwrap();
        assert!(cases.len() >= 5);
        for c in cases {
            let counts: Vec<usize> = ["n", "both", "worse", "better"]
                .iter()
                .map(|k| c[k].as_u64().unwrap() as usize)
                .collect();
            let (m, r) = paired(counts[0], counts[1], counts[2], counts[3]);
            let margin = c["margin"].as_f64().unwrap();
            let ni = non_inferiority(&m, &r, margin, 0.05).unwrap();
            let (t, p) = (c["t"].as_f64().unwrap(), c["p_value"].as_f64().unwrap());
            assert!((ni.t - t).abs() < 1e-9, "{c}: t {}", ni.t);
            assert!((ni.p_value - p).abs() < 1e-9, "{c}: p {}", ni.p_value);
            let successes = (counts[1] + counts[3]) as u64;
            let (lo, hi) = success_interval(successes, counts[0] as u64);
            let wlo = c["mode_success_low"].as_f64().unwrap();
            let whi = c["mode_success_high"].as_f64().unwrap();
            assert!(
                (lo - wlo).abs() < 1e-9 && (hi - whi).abs() < 1e-9,
                "{c}: {lo} {hi}"
            );
        }
    }
}
