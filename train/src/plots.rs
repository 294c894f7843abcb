//! The run's plots, as small self-contained SVG files: loss curves (training loss per logged
//! step, validation loss per evaluation) and the reliability diagram (accuracy against
//! confidence per bin, before and after temperature scaling, with the bin counts).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::calibration::Temperatures;
use crate::metrics::{Bin, ECE_BINS, ScoredState, reliability};
use decision_data::stats::first_max;

const W: f64 = 640.0;
const H: f64 = 400.0;
const ML: f64 = 60.0; // left margin
const MR: f64 = 20.0;
const MT: f64 = 40.0;
const MB: f64 = 50.0;

/// A named series of (x, y) points drawn as a polyline.
pub(crate) struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn frame(title: &str, xlabel: &str, ylabel: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>
<rect x="{ML}" y="{MT}" width="{}" height="{}" fill="none" stroke="#444"/>
"##,
        W / 2.0,
        esc(title),
        ML + (W - ML - MR) / 2.0,
        H - 12.0,
        esc(xlabel),
        MT + (H - MT - MB) / 2.0,
        MT + (H - MT - MB) / 2.0,
        esc(ylabel),
        W - ML - MR,
        H - MT - MB,
    );
    s
}

fn ticks(s: &mut String, x0: f64, x1: f64, y0: f64, y1: f64) {
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let px = ML + f * (W - ML - MR);
        let py = H - MB - f * (H - MT - MB);
        let _ = writeln!(
            s,
            r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            H - MB + 16.0,
            fmt_num(x0 + f * (x1 - x0))
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            ML - 6.0,
            py + 4.0,
            fmt_num(y0 + f * (y1 - y0))
        );
        let _ = writeln!(
            s,
            r##"<line x1="{ML}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/>"##,
            W - MR
        );
    }
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// Line chart of the given series; axes fit the data.
pub(crate) fn line_chart(title: &str, xlabel: &str, ylabel: &str, series: &[Series]) -> String {
    let all = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y1) = (0.0, 1.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let mut s = frame(title, xlabel, ylabel);
    ticks(&mut s, x0, x1, y0, y1);
    let px = |x: f64| ML + (x - x0) / (x1 - x0) * (W - ML - MR);
    let py = |y: f64| H - MB - (y - y0) / (y1 - y0) * (H - MT - MB);
    for (i, ser) in series.iter().enumerate() {
        let pts: Vec<String> = ser
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
            ser.color,
            pts.join(" ")
        );
        let ly = MT + 16.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"/>"#,
            W - MR - 150.0,
            W - MR - 130.0,
            ser.color
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            W - MR - 125.0,
            ly + 4.0,
            esc(ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Reliability diagram: per-bin accuracy against mean confidence, before and after temperature
/// scaling, with the diagonal of perfect calibration and bar heights for the bin counts.
pub(crate) fn reliability_diagram(
    title: &str,
    before: &[Bin],
    after: &[Bin],
    ece_before: f64,
    ece_after: f64,
) -> String {
    let mut s = frame(title, "confidence (top label)", "accuracy");
    ticks(&mut s, 0.0, 1.0, 0.0, 1.0);
    let px = |x: f64| ML + x * (W - ML - MR);
    let py = |y: f64| H - MB - y * (H - MT - MB);
    let total: usize = after.iter().map(|b| b.n).sum::<usize>().max(1);
    for b in after {
        let h = b.n as f64 / total as f64 * 0.3;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#cfd8e3"/>"##,
            px(b.lo),
            py(h),
            px(b.hi) - px(b.lo),
            py(0.0) - py(h)
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="4 3"/>"##,
        px(0.0),
        py(0.0),
        px(1.0),
        py(1.0)
    );
    for (bins, color, name, e) in [
        (before, "#d62728", "T = 1", ece_before),
        (after, "#1f77b4", "fitted T", ece_after),
    ] {
        let pts: Vec<String> = bins
            .iter()
            .filter(|b| b.n > 0)
            .map(|b| format!("{:.1},{:.1}", px(b.confidence), py(b.accuracy)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        for b in bins.iter().filter(|b| b.n > 0) {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                px(b.confidence),
                py(b.accuracy)
            );
        }
        let ly = if name == "T = 1" {
            MT + 16.0
        } else {
            MT + 32.0
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}" fill="{color}">{name}: ECE {e:.4}</text>"#,
            ML + 10.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A run's `plots/loss.svg` (from its `metrics.jsonl`) and `plots/reliability.svg` (the
/// validation states `scored` at T = 1 and at the fitted temperatures).
pub(crate) fn write_run_plots(
    run_dir: &Path,
    metrics: &Path,
    scored: &[ScoredState],
    temps: &Temperatures,
) -> Result<()> {
    let text = std::fs::read_to_string(metrics)?;
    let (mut train, mut valid) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let step = v["step"].as_f64().unwrap_or(0.0);
        match v["kind"].as_str() {
            Some("train") => train.push((step, v["loss"].as_f64().unwrap_or(f64::NAN))),
            Some("eval") => valid.push((step, v["loss"].as_f64().unwrap_or(f64::NAN))),
            _ => {}
        }
    }
    let loss = line_chart(
        "loss (cross-entropy + Brier)",
        "step",
        "loss",
        &[
            Series {
                name: "train",
                color: "#1f77b4",
                points: train,
            },
            Series {
                name: "valid",
                color: "#ff7f0e",
                points: valid,
            },
        ],
    );
    let bins = |t: &dyn Fn(&ScoredState) -> f32| -> Vec<Bin> {
        let pairs: Vec<(f64, bool)> = scored
            .iter()
            .map(|s| {
                let p = s.probs(t(s));
                let pick = first_max(&p);
                (p[pick], pick == s.answer)
            })
            .collect();
        reliability(&pairs, ECE_BINS)
    };
    let before = bins(&|_| 1.0);
    let after = bins(&|s| temps.for_point(&s.point));
    let ece = crate::metrics::bins_ece;
    let rel = reliability_diagram(
        "reliability (validation)",
        &before,
        &after,
        ece(&before),
        ece(&after),
    );
    let dir = run_dir.join("plots");
    decision_data::atomic::write_atomic(dir.join("loss.svg"), loss.as_bytes())?;
    decision_data::atomic::write_atomic(dir.join("reliability.svg"), rel.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let svg = line_chart(
            "loss",
            "step",
            "loss",
            &[Series {
                name: "train <a&b>",
                color: "#1f77b4",
                points: vec![(0.0, 2.0), (10.0, 1.0), (20.0, f64::NAN)],
            }],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("train &lt;a&amp;b&gt;"));
        assert!(!svg.contains("NaN"));
        let bins = crate::metrics::reliability(&[(0.95, true), (0.55, false)], 15);
        let svg = reliability_diagram("reliability", &bins, &bins, 0.1, 0.05);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("ECE 0.0500"));
    }
}
