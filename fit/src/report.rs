//! The report people read before they approve a refit (`--report DIR`): `report.md` and a
//! self-contained `report.html` (inline SVG, no external files or scripts), per point a
//! reliability diagram (success rate against confidence per bucket, with the bucket counts) and
//! a risk–coverage curve over the candidate thresholds with the chosen one marked.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::drift::{self, DriftRow};
use crate::thresholds::{PointFit, Thresholds};

/// One point of a risk–coverage curve: at threshold `t`, the share of valid records that would be
/// auto-accepted and the error rate of the judged ones among them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RiskCoverage {
    pub threshold: f64,
    pub coverage: f64,
    pub risk: f64,
    pub n: u64,
}

/// The curve over the bucket edges, from the highest threshold down (edges with no judged record
/// at or above them are left out).
pub(crate) fn risk_coverage(p: &PointFit) -> Vec<RiskCoverage> {
    let mut out = Vec::new();
    let (mut acc, mut n, mut s) = (0u64, 0u64, 0u64);
    for b in p.buckets.iter().rev() {
        acc += b.accepted;
        n += b.n;
        s += b.success;
        if n > 0 {
            out.push(RiskCoverage {
                threshold: b.lo,
                coverage: if p.records == 0 {
                    0.0
                } else {
                    acc as f64 / p.records as f64
                },
                risk: 1.0 - s as f64 / n as f64,
                n,
            });
        }
    }
    out
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

const W: u32 = 460;
const H: u32 = 320;

/// Reliability diagram as an SVG string.
pub(crate) fn reliability_svg(name: &str, p: &PointFit) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{name}: reliability"), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..1f64, 0f64..1.08f64)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("confidence")
            .y_desc("success rate")
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.35)))
            .map_err(plot_err)?;
        let judged: Vec<_> = p.buckets.iter().filter(|b| b.n > 0).collect();
        chart
            .draw_series(judged.iter().map(|b| {
                Rectangle::new(
                    [(b.lo, 0.0), (b.hi, b.rate.unwrap_or(0.0))],
                    BLUE.mix(0.25).filled(),
                )
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(judged.iter().map(|b| {
                Circle::new(
                    (b.mean_confidence.unwrap_or(b.lo), b.rate.unwrap_or(0.0)),
                    3,
                    BLUE.filled(),
                )
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(judged.iter().map(|b| {
                Text::new(
                    format!("{}", b.n),
                    (
                        (b.lo + b.hi) / 2.0 - 0.03,
                        (b.rate.unwrap_or(0.0) + 0.06).min(1.07),
                    ),
                    ("sans-serif", 10),
                )
            }))
            .map_err(plot_err)?;
        if let Some(t) = p.threshold {
            chart
                .draw_series(LineSeries::new([(t, 0.0), (t, 1.08)], RED.stroke_width(2)))
                .map_err(plot_err)?;
        }
        chart
            .draw_series(LineSeries::new(
                [(0.0, p.policy.target), (1.0, p.policy.target)],
                GREEN.mix(0.7),
            ))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Risk–coverage curve as an SVG string.
pub(crate) fn risk_coverage_svg(name: &str, p: &PointFit) -> Result<String> {
    let curve = risk_coverage(p);
    let max_risk = curve
        .iter()
        .map(|c| c.risk)
        .fold(1.0 - p.policy.target, f64::max)
        .max(0.05)
        * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{name}: risk vs coverage"), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..1f64, 0f64..max_risk)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("coverage (share auto-accepted)")
            .y_desc("error rate above threshold")
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                [(0.0, 1.0 - p.policy.target), (1.0, 1.0 - p.policy.target)],
                GREEN.mix(0.7),
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                curve.iter().map(|c| (c.coverage, c.risk)),
                BLUE,
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(
                curve
                    .iter()
                    .map(|c| Circle::new((c.coverage, c.risk), 3, BLUE.filled())),
            )
            .map_err(plot_err)?;
        chart
            .draw_series(curve.iter().map(|c| {
                Text::new(
                    format!("{:.1}", c.threshold),
                    (c.coverage + 0.01, c.risk + max_risk * 0.03),
                    ("sans-serif", 10),
                )
            }))
            .map_err(plot_err)?;
        if let Some(t) = p.threshold
            && let Some(c) = curve.iter().find(|c| c.threshold == t)
        {
            chart
                .draw_series([Circle::new((c.coverage, c.risk), 7, RED.stroke_width(2))])
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn num(x: Option<f64>) -> String {
    x.map_or_else(|| "—".to_string(), |v| format!("{v:.3}"))
}

fn status(p: &PointFit) -> String {
    serde_json::to_value(p.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Per-point summary table (Markdown).
fn summary_table(t: &Thresholds) -> String {
    let mut s = String::from(
        "| point | status | threshold | policy | target | judged | coverage | success above [lower] | ECE | abstain | rejected | fallback | pending | abandoned | unknown |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, p) in &t.points {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {:?} | {:.3} | {} | {:.3} | {} [{}] | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            status(p),
            num(p.threshold),
            p.policy.kind,
            p.policy.target,
            p.judged,
            p.coverage,
            num(p.success_above),
            num(p.success_above_lower),
            num(p.ece),
            p.rates.abstain,
            p.rates.rejected,
            p.rates.fallback,
            p.rates.pending,
            p.rates.abandoned,
            p.rates.unknown,
        );
    }
    s
}

fn bucket_table(p: &PointFit) -> String {
    let mut s = String::from(
        "| bucket | judged | success | rate | lower | mean confidence | accepted picks |\n|---|---|---|---|---|---|---|\n",
    );
    for b in &p.buckets {
        let _ = writeln!(
            s,
            "| [{:.2}, {:.2}{} | {} | {} | {} | {} | {} | {} |",
            b.lo,
            b.hi,
            if b.hi >= 1.0 { "]" } else { ")" },
            b.n,
            b.success,
            num(b.rate),
            num(b.lower),
            num(b.mean_confidence),
            b.accepted
        );
    }
    s
}

/// report.md: the same content as the HTML without the charts.
pub(crate) fn markdown(
    t: &Thresholds,
    drift_rows: Option<&[DriftRow]>,
    bad_lines: &[String],
    bad_total: u64,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Threshold fit\n");
    let _ = writeln!(
        s,
        "Fitted {} from {} ({} records, {} bad, {} duplicates dropped, sha256 `{}`).\n",
        t.fitted_at,
        t.source.files.join(", "),
        t.source.records,
        t.source.bad,
        t.source.duplicates,
        t.source.sha256
    );
    let _ = writeln!(
        s,
        "A threshold of `null` (—) means the LLM keeps the decision at that point. Rates are over all valid records of the point; each record is counted once (abstain, rejected, fallback, judged, abandoned, unknown, pending, in that order).\n"
    );
    s.push_str(&summary_table(t));
    if let Some(rows) = drift_rows {
        let _ = writeln!(s, "\n## Change against the previous thresholds\n");
        s.push_str(&drift::markdown(rows));
    }
    for (name, p) in &t.points {
        let _ = writeln!(s, "\n## {name}\n");
        let _ = writeln!(
            s,
            "Status **{}**, threshold **{}** ({:?} policy, target {:.3}, bound {:?}, level {}, min_count {}).\n",
            status(p),
            num(p.threshold),
            p.policy.kind,
            p.policy.target,
            p.policy.bound,
            p.policy.level,
            p.policy.min_count
        );
        if p.buckets.is_empty() {
            let _ = writeln!(s, "No accepted picks.");
        } else {
            s.push_str(&bucket_table(p));
        }
    }
    if bad_total > 0 {
        let _ = writeln!(
            s,
            "\n## Bad records ({bad_total}, quarantined in `{}`)\n",
            t.source.quarantine.as_deref().unwrap_or("—")
        );
        for l in bad_lines {
            let _ = writeln!(s, "- {l}");
        }
        if bad_total > bad_lines.len() as u64 {
            let _ = writeln!(
                s,
                "- … and {} more (all listed in the quarantine's errors file)",
                bad_total - bad_lines.len() as u64
            );
        }
    }
    s
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A tiny Markdown-table-to-HTML conversion, enough for the tables above.
fn md_to_html(md: &str) -> String {
    let mut out = String::new();
    let mut in_table = false;
    for line in md.lines() {
        if line.starts_with('|') {
            if line.starts_with("|---") {
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            if !in_table {
                out.push_str("<table><tr>");
                for c in &cells {
                    let _ = write!(out, "<th>{}</th>", html_escape(c));
                }
                out.push_str("</tr>\n");
                in_table = true;
            } else {
                out.push_str("<tr>");
                for c in &cells {
                    let _ = write!(out, "<td>{}</td>", html_escape(c).replace("**", ""));
                }
                out.push_str("</tr>\n");
            }
            continue;
        }
        if in_table {
            out.push_str("</table>\n");
            in_table = false;
        }
        if let Some(h) = line.strip_prefix("## ") {
            let _ = writeln!(out, "<h2>{}</h2>", html_escape(h));
        } else if let Some(h) = line.strip_prefix("# ") {
            let _ = writeln!(out, "<h1>{}</h1>", html_escape(h));
        } else if let Some(item) = line.strip_prefix("- ") {
            let _ = writeln!(out, "<div class=\"bad\">{}</div>", html_escape(item));
        } else if !line.is_empty() {
            let _ = writeln!(out, "<p>{}</p>", html_escape(line).replace("**", ""));
        }
    }
    if in_table {
        out.push_str("</table>\n");
    }
    out
}

/// report.html: the Markdown report with each point's charts inline.
pub fn html(t: &Thresholds, md: &str) -> Result<String> {
    let mut body = String::new();
    // Split the markdown at the per-point sections and put the charts under each heading.
    let mut section = String::new();
    let mut current: Option<String> = None;
    let flush = |body: &mut String, section: &str, current: &Option<String>| -> Result<()> {
        body.push_str(&md_to_html(section));
        if let Some(name) = current
            && let Some(p) = t.points.get(name)
        {
            let _ = writeln!(
                body,
                "<div class=\"charts\">{}{}</div>",
                reliability_svg(name, p)?,
                risk_coverage_svg(name, p)?
            );
        }
        Ok(())
    };
    for line in md.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            flush(&mut body, &section, &current)?;
            section.clear();
            current = t.points.contains_key(h).then(|| h.to_string());
        }
        section.push_str(line);
        section.push('\n');
    }
    flush(&mut body, &section, &current)?;
    Ok(format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Threshold fit</title><style>\
body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}\
td,th{{border:1px solid #ccc;padding:3px 7px;font-size:13px}}th{{background:#f3f3f3}}\
.charts{{display:flex;gap:1em;flex-wrap:wrap}}.bad{{font-family:monospace;font-size:12px}}\
</style></head><body>\n{body}</body></html>\n"
    ))
}
