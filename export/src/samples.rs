//! The sample states the parity gate runs: `--check-data`, else the run's validation states,
//! else a fixed set of probe states built here (so an export is never published unchecked).

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

/// Probe states for a model without data of its own: each decision point the model knows
/// (or `tool`, `stop`, `route`), option counts from 2 to `max_options.min(6)`, short and long
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
    let widest = max_options.clamp(2, 6);
    let mut out = Vec::new();
    for (i, point) in points.iter().enumerate() {
        for k in 2..=widest {
            let context = &contexts[(i + k) % contexts.len()];
            let candidates = (0..k)
                .map(|j| Candidate {
                    id: format!("c{j}"),
                    label: names[(i + j) % names.len()].to_string(),
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
        let p = probes(&[], 4);
        assert_eq!(p.len(), 3 * 3);
        assert!(p.iter().all(|s| (2..=4).contains(&s.candidates.len())));
        let ids: Vec<&str> = p.iter().map(|s| s.id.as_str()).collect();
        assert!(ids.contains(&"probe-route-4"));
        let many = probes(&["a".into(), "b".into(), "c".into(), "d".into()], 26);
        let picked = spread(many.clone(), 5);
        assert_eq!(picked.len(), 5);
        assert_eq!(picked[0].id, many[0].id);
        assert_ne!(picked[4].point, "a");
    }
}
