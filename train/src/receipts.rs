//! Shadow receipts (contracts section 3) from an evaluation: one record per state, as the
//! harness would have logged it in shadow mode. The model's pick and its confidence (at the
//! fitted temperature) are judged against the state's answer key (`shadow.reference`), the
//! validation is `accepted` (the pick is always one of the offered ids) and `model` names the
//! run. States without an answer get no `shadow` (they stay pending for `decision fit`). A state
//! whose prompt is over `max_tokens` is an abstention: decision-worker never cuts a state, it
//! answers `capacity` and the harness decides. Each id is `eval:{model}:{state id}`, so that the
//! receipts of two models can share a folder that `fit` reads.

use std::io::Write;

use anyhow::Result;
use decision_data::{Receipt, ReceiptResult, Shadow, State, Validation};

/// The receipt for `state` given the model's probabilities (aligned with its candidates), or
/// `None` when the worker would not have scored it.
pub(crate) fn shadow_receipt(
    state: &State,
    probs: Option<&[f64]>,
    model: &str,
    at: &str,
) -> Receipt {
    let result = match probs {
        Some(probs) => {
            let pick = decision_data::stats::first_max(probs);
            ReceiptResult::Pick {
                id: state.candidates[pick].id.clone(),
                confidence: probs[pick],
            }
        }
        None => ReceiptResult::Abstain,
    };
    Receipt {
        id: format!("eval:{model}:{}", state.id),
        at: at.to_string(),
        point: state.point.clone(),
        model: Some(model.to_string()),
        candidates: state.candidates.iter().map(|c| c.id.clone()).collect(),
        result,
        validation: Validation::Accepted,
        fallback: None,
        outcome: None,
        shadow: state.answer.clone().map(|reference| Shadow { reference }),
        observed_outcome: None,
    }
}

/// Write receipts as JSON Lines (the harness's camelCase shape) into `w` (an output opened
/// before the evaluation).
pub(crate) fn write_receipts_to(w: &mut impl Write, receipts: &[Receipt]) -> Result<()> {
    for r in receipts {
        serde_json::to_writer(&mut *w, r)?;
        w.write_all(b"\n")?;
    }
    Ok(())
}

/// Current time in RFC 3339 (UTC, seconds).
pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use decision_data::Candidate;

    fn state(answer: Option<&str>) -> State {
        State {
            id: "s1".into(),
            task_id: "t1".into(),
            point: "tool".into(),
            context: "ctx".into(),
            candidates: vec![
                Candidate {
                    id: "lookup".into(),
                    label: "look up".into(),
                },
                Candidate {
                    id: "cancel".into(),
                    label: "cancel".into(),
                },
            ],
            answer: answer.map(String::from),
            teacher: None,
            after_error: false,
            rules: None,
            split: None,
        }
    }

    #[test]
    fn receipt_shape_follows_the_contract() {
        let r = shadow_receipt(
            &state(Some("lookup")),
            Some(&[0.2, 0.8]),
            "tiny-v1",
            "2026-11-30T12:00:00Z",
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["id"], "eval:tiny-v1:s1");
        assert_eq!(v["result"]["kind"], "pick");
        assert_eq!(v["result"]["id"], "cancel");
        assert!((v["result"]["confidence"].as_f64().unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(v["validation"], "accepted");
        assert_eq!(v["shadow"]["reference"], "lookup");
        assert_eq!(v["model"], "tiny-v1");
        assert_eq!(v["candidates"], serde_json::json!(["lookup", "cancel"]));
        assert!(v.get("fallback").is_none() && v.get("outcome").is_none());
        let unlabeled =
            shadow_receipt(&state(None), Some(&[0.6, 0.4]), "m", "2026-11-30T12:00:00Z");
        assert!(unlabeled.shadow.is_none());
        // a state the worker would answer `capacity` for: an abstention, still judged later
        let cut = shadow_receipt(&state(Some("lookup")), None, "m", "2026-11-30T12:00:00Z");
        let v = serde_json::to_value(&cut).unwrap();
        assert_eq!(v["result"], serde_json::json!({"kind": "abstain"}));
        assert_eq!(v["shadow"]["reference"], "lookup");
    }

    #[test]
    fn written_as_lines() {
        let r = shadow_receipt(
            &state(Some("cancel")),
            Some(&[0.3, 0.7]),
            "m",
            &now_rfc3339(),
        );
        let mut out = Vec::new();
        write_receipts_to(&mut out, &[r.clone(), r]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2);
        let back: Receipt = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(back.shadow.unwrap().reference, "cancel");
    }
}
