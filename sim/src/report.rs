//! The report of a simulation: `decision-sim/1` JSON, the table on stdout and an SVG bar chart
//! of success (with its interval) and cost per mode. The table and the chart are drawn from the
//! JSON, so they show exactly what the file says.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::run::{ModeRun, SimConfig};
use crate::stats::{ALPHA, MARGIN, non_inferiority, success_interval};

pub const SCHEMA: &str = "decision-sim/1";

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// One mode's figures; `llm` is the reference run on the same tasks.
fn mode_json(run: &ModeRun, llm: &ModeRun, price: f64) -> Value {
    let n = run.tasks.len().max(1) as f64;
    let ok = run.tasks.iter().filter(|t| t.end.is_success()).count() as u64;
    let (lo, hi) = success_interval(ok, run.tasks.len() as u64);
    let calls: usize = run.tasks.iter().map(|t| t.llm_calls).sum();
    let failed = run.tasks.len() as u64 - ok;
    let steps: usize = run.tasks.iter().map(|t| t.steps).sum();
    let seconds: f64 = run.tasks.iter().map(|t| t.seconds).sum();
    let mut failures: BTreeMap<&str, u64> = BTreeMap::new();
    for t in &run.tasks {
        if !t.end.is_success() {
            *failures.entry(t.end.as_str()).or_default() += 1;
        }
    }
    let delegated: BTreeMap<&str, f64> = run
        .points
        .iter()
        .map(|(p, c)| {
            (
                p.as_str(),
                round(c.delegated as f64 / c.decisions.max(1) as f64, 4),
            )
        })
        .collect();
    let decisions: BTreeMap<&str, u64> = run
        .points
        .iter()
        .map(|(p, c)| (p.as_str(), c.decisions))
        .collect();
    let all_delegated: u64 = run.points.values().map(|c| c.delegated).sum();
    let vs_llm = if std::ptr::eq(run, llm) {
        json!({"difference": 0.0, "p_value": null, "non_inferior": null})
    } else {
        match non_inferiority(&run.successes(), &llm.successes(), MARGIN, ALPHA) {
            Some(ni) => json!({
                "difference": round(ni.difference, 4),
                "t": round(ni.t, 4),
                "p_value": ni.p_value,
                "non_inferior": ni.non_inferior,
            }),
            None => json!({"difference": null, "p_value": null, "non_inferior": null}),
        }
    };
    json!({
        "success": round(ok as f64 / n, 4),
        "success_low": round(lo, 4),
        "success_high": round(hi, 4),
        "successes": ok,
        "failures": failures,
        "vs_llm": vs_llm,
        "delegated": delegated,
        "delegated_all": round(all_delegated as f64 / steps.max(1) as f64, 4),
        "decisions": decisions,
        "steps_per_task": round(steps as f64 / n, 3),
        "llm_calls_per_task": round(calls as f64 / n, 3),
        "cost_per_task": round((calls as f64 * price + failed as f64) / n, 4),
        "seconds_per_task": round(seconds / n, 3),
        "model_ms_per_decision": run.model_ms_per_state.map(|x| round(x, 3)),
        "receipts": run.receipts.len(),
    })
}

/// The report. `runs` in the order asked; `llm` the reference (one of `runs` or run beside
/// them); `model` names the scorer; `scored` / `cache_hits` count the model's work.
pub fn report(
    cfg: &SimConfig,
    runs: &[ModeRun],
    llm: &ModeRun,
    model: Option<&str>,
    scored: u64,
    cache_hits: u64,
) -> Value {
    let mut modes = serde_json::Map::new();
    for r in runs {
        let reference = if r.mode == crate::Mode::Llm { r } else { llm };
        modes.insert(
            r.mode.to_string(),
            mode_json(r, reference, cfg.llm.price_per_call),
        );
    }
    json!({
        "schema": SCHEMA,
        "rules": cfg.rules.as_str(),
        "tasks": cfg.tasks,
        "seed": cfg.seed,
        "model": model,
        "llm": {"price_per_call": cfg.llm.price_per_call, "latency_ms": cfg.llm.latency_ms},
        "thresholds": cfg.thresholds,
        "margin": MARGIN,
        "alpha": ALPHA,
        "cost": "LLM price per call + 1 per failed task",
        "model_states_scored": scored,
        "model_cache_hits": cache_hits,
        "order": runs.iter().map(|r| r.mode.to_string()).collect::<Vec<_>>(),
        "modes": modes,
    })
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |x| format!("{:.1}", 100.0 * x))
}

/// The stdout table.
pub fn table(report: &Value) -> String {
    let mut points: Vec<String> = Vec::new();
    let order: Vec<&str> = report["order"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for m in &order {
        if let Some(d) = report["modes"][m]["delegated"].as_object() {
            for p in d.keys() {
                if !points.contains(p) {
                    points.push(p.clone());
                }
            }
        }
    }
    let mut t = format!(
        "{} tasks of rules {} (seed {}), model {}\n\n",
        report["tasks"],
        report["rules"].as_str().unwrap_or("-"),
        report["seed"],
        report["model"].as_str().unwrap_or("none"),
    );
    t.push_str(&format!(
        "{:<12} {:>7} {:>15} {:>8} {:>9} {:>6}  {:<22} {:>9} {:>8} {:>7}\n",
        "mode",
        "success",
        "95% interval",
        "vs llm",
        "p (n.-i.)",
        "n.-i.",
        format!("delegated {}", points.join("/")),
        "LLM calls",
        "cost",
        "s/task"
    ));
    for m in &order {
        let r = &report["modes"][m];
        let vs = &r["vs_llm"];
        let ni = match vs["non_inferior"].as_bool() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        let diff = vs["difference"]
            .as_f64()
            .map_or("-".into(), |d| format!("{:+.1}", 100.0 * d));
        let p = vs["p_value"]
            .as_f64()
            .map_or("-".into(), |p| format!("{p:.3}"));
        let delegated: Vec<String> = points.iter().map(|p| pct(&r["delegated"][p])).collect();
        t.push_str(&format!(
            "{:<12} {:>6}% {:>15} {:>8} {:>9} {:>6}  {:<22} {:>9.2} {:>8.4} {:>7.2}\n",
            m,
            pct(&r["success"]),
            format!("[{}, {}]", pct(&r["success_low"]), pct(&r["success_high"])),
            diff,
            p,
            ni,
            delegated.join("/"),
            r["llm_calls_per_task"].as_f64().unwrap_or(0.0),
            r["cost_per_task"].as_f64().unwrap_or(0.0),
            r["seconds_per_task"].as_f64().unwrap_or(0.0),
        ));
    }
    t.push_str(&format!(
        "\nsuccess in %, vs llm in points on the same tasks; n.-i.: non-inferior at a {}-point \
         margin (one-sided paired t-test, alpha {}); cost = LLM price per call + 1 per failed task\n",
        report["margin"].as_f64().unwrap_or(MARGIN) * 100.0,
        report["alpha"]
    ));
    t
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Two bar charts side by side: task success per mode with its 95 % interval, and cost per task.
pub fn svg(report: &Value) -> String {
    let order: Vec<&str> = report["order"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let (w, h) = (860.0, 340.0);
    let (top, bottom, panel_w) = (50.0, 270.0, 360.0);
    let n = order.len().max(1) as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"20\" y=\"22\" font-size=\"14\">{} tasks, rules {}, seed {}</text>\n",
        report["tasks"],
        esc(report["rules"].as_str().unwrap_or("-")),
        report["seed"]
    );
    let max_cost = order
        .iter()
        .filter_map(|m| report["modes"][m]["cost_per_task"].as_f64())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    for (panel, (title, key, max)) in [
        ("task success (95% interval)", "success", 1.0),
        ("cost per task", "cost_per_task", max_cost * 1.1),
    ]
    .into_iter()
    .enumerate()
    {
        let x0 = 60.0 + panel as f64 * (panel_w + 70.0);
        let y = |v: f64| bottom - (bottom - top) * (v / max).clamp(0.0, 1.0);
        s.push_str(&format!(
            "<text x=\"{x0}\" y=\"{}\" font-size=\"13\">{title}</text>\n\
             <line x1=\"{x0}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"black\"/>\n\
             <line x1=\"{x0}\" y1=\"{top}\" x2=\"{x0}\" y2=\"{bottom}\" stroke=\"black\"/>\n",
            top - 12.0,
            x0 + panel_w
        ));
        for k in 0..=4 {
            let v = max * k as f64 / 4.0;
            let label = if key == "success" {
                format!("{:.0}%", 100.0 * v)
            } else {
                format!("{v:.3}")
            };
            s.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{label}</text>\n",
                x0 - 5.0,
                y(v) + 4.0
            ));
        }
        let slot = panel_w / n;
        for (i, m) in order.iter().enumerate() {
            let r = &report["modes"][m];
            let v = r[key].as_f64().unwrap_or(0.0);
            let bx = x0 + slot * i as f64 + slot * 0.15;
            let bw = slot * 0.7;
            let colour = if *m == "llm" { "#888888" } else { "#3b6ea8" };
            s.push_str(&format!(
                "<rect x=\"{bx:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{colour}\"/>\n\
                 <text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                y(v),
                bottom - y(v),
                bx + bw / 2.0,
                bottom + 16.0,
                esc(m)
            ));
            let shown = if key == "success" {
                format!("{:.1}%", 100.0 * v)
            } else {
                format!("{v:.3}")
            };
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{shown}</text>\n",
                bx + bw / 2.0,
                y(v) - 4.0
            ));
            if key == "success"
                && let (Some(lo), Some(hi)) =
                    (r["success_low"].as_f64(), r["success_high"].as_f64())
            {
                let cx = bx + bw / 2.0;
                s.push_str(&format!(
                    "<line x1=\"{cx:.1}\" y1=\"{:.1}\" x2=\"{cx:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\n",
                    y(lo),
                    y(hi)
                ));
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
