//! The sample states the parity gate runs: `--check-data`, else the run's validation states,
//! else a fixed set of probe states built here (so an export is never published unchecked).
//! The probe states also go into every ONNX bundle, with the reference's answers
//! ([`crate::onnx::probes`]), so `bundle verify` can run the bundle's model on them again.

use std::path::Path;

use anyhow::{Result, bail};
use decision_data::{Candidate, State, ValidateOptions};

/// At most `limit` states, spread over the file(s) rather than only the first rows: every
/// `len / limit`-th state.
pub fn spread(states: Vec<State>, limit: usize) -> Vec<State> {
    if states.len() <= limit || limit == 0 {
        return states;
    }
    let step = states.len() as f64 / limit as f64;
    (0..limit)
        .map(|i| states[(i as f64 * step) as usize].clone())
        .collect()
}

/// Read `--check-data` (any format the data crate reads), checked against the contract.
pub fn read(path: &Path, max_options: usize, limit: usize) -> Result<Vec<State>> {
    let opts = ValidateOptions {
        max_options,
        ..Default::default()
    };
    let states = decision_data::read_states(&[path.to_path_buf()], opts)?;
    if states.is_empty() {
        bail!(
            "{}: no states to check the exported model on",
            path.display()
        );
    }
    Ok(spread(states, limit))
}

/// The option counts probed for a model that takes up to `max_options`: every count from 2 to 6,
/// then about ×1.5 apart (8, 12, 18, …), and `max_options` itself, so the widest decision the
/// model accepts is always run.
pub(crate) fn option_counts(max_options: usize) -> Vec<usize> {
    let widest = max_options.max(2);
    let mut counts: Vec<usize> = (2..=widest.min(6)).collect();
    let mut k = 8;
    while k < widest {
        counts.push(k);
        k = k * 3 / 2;
    }
    if counts.last() != Some(&widest) {
        counts.push(widest);
    }
    counts
}

/// Probe states for a model without data of its own: each decision point the model knows
/// (or `tool`, `stop`, `route`), each of [`option_counts`]`(max_options)`, short and long
/// contexts. Their answers are irrelevant: the gate compares two implementations of one model.
pub fn probes(points: &[String], max_options: usize) -> Vec<State> {
    let defaults = ["tool".to_string(), "stop".to_string(), "route".to_string()];
    let points: &[String] = if points.is_empty() { &defaults } else { points };
    let names = [
        "lookup_order",
        "cancel_order",
        "refund_order",
        "ask_user",
        "search_docs",
        "stop",
        "escalate",
        "retry",
    ];
    let contexts = [
        "user: where is my order ord_117?".to_string(),
        "user asks to cancel order ord_42 after the lookup failed; the policy says refunds need a \
         receipt; the agent called search_docs and got 3 results. "
            .repeat(3),
    ];
    let mut out = Vec::new();
    for (i, point) in points.iter().enumerate() {
        for k in option_counts(max_options) {
            let context = &contexts[(i + k) % contexts.len()];
            let candidates = (0..k)
                .map(|j| {
                    let name = names[(i + j) % names.len()];
                    Candidate {
                        id: format!("c{j}"),
                        // Past the eighth option, `refund_order_2` and so on: no label twice.
                        label: match j / names.len() {
                            0 => name.to_string(),
                            n => format!("{name}_{}", n + 1),
                        },
                    }
                })
                .collect();
            out.push(State {
                id: format!("probe-{point}-{k}"),
                task_id: format!("probe-{i}"),
                point: point.clone(),
                context: context.clone(),
                candidates,
                answer: None,
                teacher: None,
                after_error: false,
                rules: None,
                split: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_cover_points_and_option_counts_and_spread_keeps_the_ends() {
        assert_eq!(option_counts(2), [2]);
        assert_eq!(option_counts(4), [2, 3, 4]);
        assert_eq!(option_counts(7), [2, 3, 4, 5, 6, 7]);
        assert_eq!(option_counts(16), [2, 3, 4, 5, 6, 8, 12, 16]);
        assert_eq!(option_counts(26), [2, 3, 4, 5, 6, 8, 12, 18, 26]);
        let p = probes(&[], 4);
        assert_eq!(p.len(), 3 * 3);
        assert!(p.iter().all(|s| (2..=4).contains(&s.candidates.len())));
        // Up to max_options, every label distinct.
        let wide = probes(&["tool".into()], 26);
        let widest = wide.iter().find(|s| s.id == "probe-tool-26").unwrap();
        let labels: std::collections::BTreeSet<&str> =
            widest.candidates.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels.len(), 26);
        let ids: Vec<&str> = p.iter().map(|s| s.id.as_str()).collect();
        assert!(ids.contains(&"probe-route-4"));
        let many = probes(&["a".into(), "b".into(), "c".into(), "d".into()], 26);
        let picked = spread(many.clone(), 5);
        assert_eq!(picked.len(), 5);
        assert_eq!(picked[0].id, many[0].id);
        assert_ne!(picked[4].point, "a");
    }
}
