//! Confidence bounds on a success rate, matching the reference implementations:
//!
//! * [`wilson`]: the two-sided Wilson score interval, as
//!   `statsmodels.stats.proportion.proportion_confint(s, n, alpha=1-level, method="wilson")`
//!   (same formula, same clipping to [0, 1]);
//! * [`clopper_pearson_upper`]: the one-sided Clopper–Pearson upper bound on an error rate,
//!   `scipy.stats.beta.ppf(level, e + 1, n - e)`, and 1 when `e = n`.
//!
//! The normal quantile is Wichura's AS 241 (PPND16, relative error about 1e-16); the beta
//! quantile inverts the regularised incomplete beta function (continued fraction) by a
//! safeguarded Newton iteration to full double precision. Both agree with scipy to well within
//! 1e-9 (tests/fixtures/fit/bounds.json, from scripts/fit_reference.py).

// The published coefficients are kept digit for digit, beyond what an f64 holds.
#![allow(clippy::excessive_precision)]

/// Two-sided Wilson score interval `(lower, upper)` for `s` successes in `n` trials at
/// confidence `level` (e.g. 0.95). `None` when `n = 0`.
pub fn wilson(s: u64, n: u64, level: f64) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    let alpha = (1.0 - level) / 2.0;
    let crit = -norm_ppf(alpha);
    let nf = n as f64;
    let q = s as f64 / nf;
    let crit2 = crit * crit;
    let denom = 1.0 + crit2 / nf;
    let center = (q + crit2 / (2.0 * nf)) / denom;
    let dist = crit * (q * (1.0 - q) / nf + crit2 / (4.0 * nf * nf)).sqrt() / denom;
    Some((
        (center - dist).clamp(0.0, 1.0),
        (center + dist).clamp(0.0, 1.0),
    ))
}

/// Wilson lower bound, or the plain rate when `bound` is off; `None` for `n = 0`.
pub(crate) fn lower_bound(s: u64, n: u64, level: f64, use_wilson: bool) -> Option<f64> {
    if n == 0 {
        None
    } else if use_wilson {
        wilson(s, n, level).map(|(lo, _)| lo)
    } else {
        Some(s as f64 / n as f64)
    }
}

/// One-sided Clopper–Pearson upper bound at confidence `level` on the error rate, given `e`
/// errors in `n` trials: the `level` quantile of Beta(e + 1, n − e); 1 when `e = n`.
pub fn clopper_pearson_upper(e: u64, n: u64, level: f64) -> f64 {
    assert!(e <= n, "errors {e} > trials {n}");
    if e == n {
        return 1.0;
    }
    beta_ppf(level, (e + 1) as f64, (n - e) as f64)
}

/// Horner evaluation of `c[0] + c[1]·r + … + c[7]·r⁷`.
fn poly(c: &[f64; 8], r: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, &k| acc * r + k)
}

// Wichura (1988), algorithm AS 241, PPND16: numerator and denominator coefficients, low order
// first, for the central region and the two tail regions.
const A: [f64; 8] = [
    3.387132872796366608,
    133.14166789178437745,
    1971.5909503065514427,
    13731.693765509461125,
    45921.953931549871457,
    67265.770927008700853,
    33430.575583588128105,
    2509.0809287301226727,
];
const B: [f64; 8] = [
    1.0,
    42.313330701600911252,
    687.1870074920579083,
    5394.1960214247511077,
    21213.794301586595867,
    39307.89580009271061,
    28729.085735721942674,
    5226.495278852545925,
];
const C: [f64; 8] = [
    1.42343711074968357734,
    4.6303378461565452959,
    5.7694972214606914055,
    3.64784832476320460504,
    1.27045825245236838258,
    0.24178072517745061177,
    0.0227238449892691845833,
    7.7454501427834140764e-4,
];
const D: [f64; 8] = [
    1.0,
    2.05319162663775882187,
    1.6763848301838038494,
    0.68976733498510000455,
    0.14810397642748007459,
    0.0151986665636164571966,
    5.475938084995344946e-4,
    1.05075007164441684324e-9,
];
const E: [f64; 8] = [
    6.6579046435011037772,
    5.4637849111641143699,
    1.7848265399172913358,
    0.29656057182850489123,
    0.026532189526576123093,
    0.0012426609473880784386,
    2.71155556874348757815e-5,
    2.01033439929228813265e-7,
];
const F: [f64; 8] = [
    1.0,
    0.59983220655588793769,
    0.13692988092273580531,
    0.0148753612908506148525,
    7.868691311456132591e-4,
    1.8463183175100546818e-5,
    1.4215117583164458887e-7,
    2.04426310338993978564e-15,
];

/// Quantile of the standard normal distribution (Wichura 1988, algorithm AS 241, PPND16).
pub(crate) fn norm_ppf(p: f64) -> f64 {
    if p.is_nan() || !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        return q * poly(&A, r) / poly(&B, r);
    }
    let r = (-(if q < 0.0 { p } else { 1.0 - p }).ln()).sqrt();
    let val = if r <= 5.0 {
        poly(&C, r - 1.6) / poly(&D, r - 1.6)
    } else {
        poly(&E, r - 5.0) / poly(&F, r - 5.0)
    };
    if q < 0.0 { -val } else { val }
}

/// ln Γ(x) for x > 0: Lanczos approximation (g = 7, 9 terms) below 10, Stirling's series with
/// five correction terms above (both near double precision in their range).
pub(crate) fn ln_gamma(x: f64) -> f64 {
    if x < 0.5 {
        // reflection
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    if x >= 10.0 {
        let inv = 1.0 / x;
        let inv2 = inv * inv;
        let series = inv
            * (1.0 / 12.0
                - inv2
                    * (1.0 / 360.0
                        - inv2 * (1.0 / 1260.0 - inv2 * (1.0 / 1680.0 - inv2 * (1.0 / 1188.0)))));
        return (x - 0.5) * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI).ln() + series;
    }
    const G: f64 = 7.0;
    const L: [f64; 9] = [
        0.999_999_999_999_809_93,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_13,
        -176.615_029_162_140_59,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_571_6e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut a = L[0];
    let t = x + G + 0.5;
    for (i, c) in L.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// ln B(a, b).
fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

/// The continued fraction of I_x(a, b) (modified Lentz), valid for x < (a + 1) / (a + b + 2).
fn beta_cf(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..100_000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-16 {
            break;
        }
    }
    h
}

/// The regularised incomplete beta function I_x(a, b).
pub(crate) fn beta_cdf(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = a * x.ln() + b * (-x).ln_1p() - ln_beta(a, b);
    if x < (a + 1.0) / (a + b + 2.0) {
        (ln_front.exp() * beta_cf(x, a, b) / a).clamp(0.0, 1.0)
    } else {
        (1.0 - ln_front.exp() * beta_cf(1.0 - x, b, a) / b).clamp(0.0, 1.0)
    }
}

/// ln of the Beta(a, b) density at x.
fn beta_ln_pdf(x: f64, a: f64, b: f64) -> f64 {
    (a - 1.0) * x.ln() + (b - 1.0) * (-x).ln_1p() - ln_beta(a, b)
}

/// Quantile of Beta(a, b): the x in [0, 1] with I_x(a, b) = p. Newton steps kept inside a
/// shrinking bracket (bisection when a step leaves it), to double precision.
pub(crate) fn beta_ppf(p: f64, a: f64, b: f64) -> f64 {
    assert!(a > 0.0 && b > 0.0, "beta_ppf needs a, b > 0");
    if p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    // Closed forms where they exist keep the edge cases exact.
    if b == 1.0 {
        return p.powf(1.0 / a);
    }
    if a == 1.0 {
        return -((-p).ln_1p() / b).exp_m1();
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    // Start from the mean; the bracket makes the start unimportant for convergence.
    let mut x = a / (a + b);
    for _ in 0..400 {
        let f = beta_cdf(x, a, b) - p;
        if f == 0.0 {
            return x;
        }
        if f < 0.0 {
            lo = x;
        } else {
            hi = x;
        }
        let pdf = beta_ln_pdf(x, a, b).exp();
        let mut next = if pdf.is_finite() && pdf > 0.0 {
            x - f / pdf
        } else {
            f64::NAN
        };
        if !(next > lo && next < hi) {
            next = 0.5 * (lo + hi);
        }
        if (next - x).abs() <= 1e-17_f64.max(x.abs() * 2e-16)
            || hi - lo <= f64::EPSILON * hi.max(1e-300)
        {
            return next;
        }
        x = next;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_quantile_known_values() {
        assert!((norm_ppf(0.975) - 1.959_963_984_540_054).abs() < 1e-15);
        assert!((norm_ppf(0.5)).abs() < 1e-300);
        assert!((norm_ppf(1e-10) + 6.361_340_902_404_056).abs() < 1e-12);
    }

    #[test]
    fn beta_closed_forms_and_inverse() {
        // Beta(1, n): 1 - (1 - p)^(1/n)
        let q = beta_ppf(0.95, 1.0, 30.0);
        assert!((q - (1.0 - 0.05f64.powf(1.0 / 30.0))).abs() < 1e-15);
        for &(a, b) in &[(3.0, 50.0), (40.0, 2.0), (500.0, 9000.0), (2.5, 2.5)] {
            for &p in &[0.01, 0.5, 0.95, 0.999] {
                let x = beta_ppf(p, a, b);
                assert!(
                    (beta_cdf(x, a, b) - p).abs() < 1e-12,
                    "a={a} b={b} p={p} x={x}"
                );
            }
        }
    }

    #[test]
    fn wilson_edges() {
        assert_eq!(wilson(0, 0, 0.95), None);
        let (lo, hi) = wilson(10, 10, 0.95).unwrap();
        assert!(lo > 0.69 && lo < 0.73 && hi == 1.0, "{lo} {hi}");
        let (lo, _) = wilson(0, 10, 0.95).unwrap();
        assert!(lo.abs() < 1e-15, "{lo}");
        assert_eq!(clopper_pearson_upper(5, 5, 0.95), 1.0);
    }
}
