//! decision-worker: keel's local selector worker over an exported bundle.
//!
//! keel runs it as `decision-worker --model BUNDLE` (`KEEL_LAYA_WORKER` / `KEEL_LAYA_MODEL`) and
//! speaks a line protocol with it ([`protocol`]). The worker verifies and loads the bundle
//! ([`bundle`]: manifest hashes, `decision.json`, `tokenizer.json`, `thresholds.json`,
//! `model.onnx` in tract — no Burn), renders each request with the training prompt
//! (`decision-prompt`, the code `decision train` and `decision score` use), names its decision
//! point from the candidate ids, and lets the bundle's thresholds decide: at or above the point's
//! threshold the pick, otherwise `escalate`. Every decision is logged as a contract receipt
//! ([`log`]).

pub mod bundle;
pub mod log;
pub mod protocol;

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::Result;
use serde_json::json;

use bundle::Bundle;
use protocol::{CAPACITY, Decision, INFERENCE, KeelVerdict, Request, frame, parse_request};

/// Requests longer than this are refused (`inference`) without being held in memory; keel sends
/// at most 90 000 bytes.
pub const MAX_LINE: usize = 1 << 20;

/// What the worker answered for one request, with what the receipt needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Decision {
        reply: Decision,
        point: String,
        /// The calibrated probabilities, aligned with the candidates.
        probs: Vec<f64>,
        pick: usize,
        threshold: Option<f64>,
        /// Why the pick was not taken (`below-threshold`, `no-threshold`, `single-candidate`).
        escalated: Option<&'static str>,
        /// What keel will do with the reply.
        keel: KeelVerdict,
        /// Where the time went; none for a single candidate, which is not scored.
        timing: Option<Timing>,
    },
    Capacity {
        point: String,
        reason: String,
    },
    Inference {
        reason: String,
    },
}

impl Answer {
    pub fn reply_json(&self) -> String {
        match self {
            Answer::Decision { reply, .. } => reply.to_json(),
            Answer::Capacity { .. } => CAPACITY.into(),
            Answer::Inference { .. } => INFERENCE.into(),
        }
    }
}

/// Where one decision's time went: rendering and tokenizing the prompt, then the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub prompt_tokens: usize,
    pub encode_ms: f64,
    pub model_ms: f64,
}

/// Options that are not in the bundle.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `--point` / `DECISION_WORKER_POINT`: this point for every request, whatever the rules say.
    pub point: Option<String>,
}
/// Decide one parsed request.
pub fn decide(bundle: &Bundle, opts: &ServeOptions, req: &Request) -> Answer {
    let ids = req.ids();
    let point = match &opts.point {
        Some(p) => p.clone(),
        None => bundle.spec.point_for(&ids),
    };
    let k = ids.len();
    let max = bundle.prompter.max_options;
    if k > max {
        return Answer::Capacity {
            point,
            reason: format!("{k} candidates, the model labels at most max_options = {max}"),
        };
    }
    let threshold = bundle.threshold(&point);
    if k == 1 {
        // The model was trained to choose among 2 or more options; one is not a question it can
        // judge, so it never auto-accepts it.
        let reply = Decision::escalate(&ids, &[1.0]);
        let keel = reply.check(&ids).unwrap_or(KeelVerdict::Abstained);
        return Answer::Decision {
            reply,
            point,
            probs: vec![1.0],
            pick: 0,
            threshold,
            escalated: Some("single-candidate"),
            keel,
            timing: None,
        };
    }
    let state = bundle.state(&point, &req.state, &req.candidates);
    let t0 = Instant::now();
    let encoded = bundle.prompter.encode(&state);
    let encode_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let enc = match encoded {
        Ok(e) if e.truncated => {
            return Answer::Capacity {
                point,
                reason: format!(
                    "the prompt is longer than max_tokens = {} (training would cut {} bytes of context)",
                    bundle.prompter.max_tokens, e.dropped_context_bytes
                ),
            };
        }
        Ok(e) => e,
        Err(e) => {
            let too_long = bundle
                .prompter
                .untruncated_len(&state)
                .is_ok_and(|n| n > bundle.prompter.max_tokens);
            return if too_long {
                Answer::Capacity {
                    point,
                    reason: format!("{e:#}"),
                }
            } else {
                Answer::Inference {
                    reason: format!("encoding the prompt: {e:#}"),
                }
            };
        }
    };
    let t1 = Instant::now();
    let probs = match bundle.probabilities(&enc, &point) {
        Ok(p) => p,
        Err(e) => {
            return Answer::Inference {
                reason: format!("{e:#}"),
            };
        }
    };
    let timing = Some(Timing {
        prompt_tokens: enc.input_ids.len(),
        encode_ms,
        model_ms: t1.elapsed().as_secs_f64() * 1000.0,
    });
    let pick = decision_data::stats::first_max(&probs);
    let escalated = escalation(threshold, probs[pick]);
    let reply = if escalated.is_some() {
        Decision::escalate(&ids, &probs)
    } else {
        Decision::pick(&ids, &probs, pick)
    };
    match reply.check(&ids) {
        Ok(keel) => Answer::Decision {
            reply,
            point,
            probs,
            pick,
            threshold,
            escalated,
            keel,
            timing,
        },
        // Cannot happen by construction; if it did, keel would refuse the reply anyway.
        Err(why) => Answer::Inference {
            reason: format!("the reply would fail keel's checks: {why}"),
        },
    }
}

/// Why a pick of probability `p` escalates under the point's `threshold`, or `None` to take it:
/// at or above the threshold the harness takes the pick (contracts section 4, as `fit` counts
/// coverage: `confidence >= threshold`); a point without one never auto-accepts.
fn escalation(threshold: Option<f64>, p: f64) -> Option<&'static str> {
    match threshold {
        None => Some("no-threshold"),
        Some(t) if p < t => Some("below-threshold"),
        Some(_) => None,
    }
}

/// The receipt (contracts section 3) of an answer; `worker` holds what the contract has no
/// field for.
pub fn receipt(
    bundle: &Bundle,
    id: &str,
    req: &Request,
    answer: &Answer,
    latency_ms: f64,
) -> Option<serde_json::Value> {
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let ids = req.ids();
    let mut worker = json!({
        "bundle_sha256": bundle.bundle_sha256,
        "model_sha256": bundle.model_sha256,
        "latency_ms": (latency_ms * 1000.0).round() / 1000.0,
    });
    let (point, result, fallback) = match answer {
        Answer::Inference { .. } => return None,
        Answer::Capacity { point, reason } => {
            worker["error"] = json!("capacity");
            worker["reason"] = json!(reason);
            (point, json!({"kind": "abstain"}), None)
        }
        Answer::Decision {
            reply,
            point,
            probs,
            pick,
            threshold,
            escalated,
            keel,
            timing,
        } => {
            if let Some(t) = timing {
                worker["prompt_tokens"] = json!(t.prompt_tokens);
                worker["encode_ms"] = json!((t.encode_ms * 1000.0).round() / 1000.0);
                worker["model_ms"] = json!((t.model_ms * 1000.0).round() / 1000.0);
            }
            worker["threshold"] = json!(threshold);
            worker["probabilities"] = json!(probs);
            worker["model_pick"] = json!(ids[*pick]);
            worker["reply"] = json!(reply.choice);
            if let Some(why) = escalated {
                worker["escalated"] = json!(why);
            }
            let result = match escalated {
                Some(_) => json!({"kind": "abstain"}),
                None => json!({"kind": "pick", "id": ids[*pick], "confidence": probs[*pick]}),
            };
            // keel vetoes some picks our threshold accepted: then keel falls back, and the
            // receipt says so instead of counting a pick keel never took.
            let fallback = keel.fallback_name().map(|name| {
                worker["keel_gate"] = json!(name);
                json!({"used": true, "to": "keel", "reason": format!("keel gate {name}")})
            });
            (point, result, fallback)
        }
    };
    let mut r = json!({
        "id": id,
        "at": at,
        "point": point,
        "model": "decision-worker",
        "candidates": ids,
        "result": result,
        "validation": "accepted",
        "worker": worker,
    });
    if let Some(f) = fallback {
        r["fallback"] = f;
    }
    Some(r)
}

/// Read one line of at most `max` bytes (without its newline). `Ok(None)` at end of input; a
/// longer line is consumed to its end and returned as `Err(length)`.
fn read_bounded(
    input: &mut impl BufRead,
    max: usize,
) -> std::io::Result<Option<Result<Vec<u8>, usize>>> {
    let mut line = Vec::new();
    let mut total = 0usize;
    let mut any = false;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(if !any {
                None
            } else if total > max {
                Some(Err(total))
            } else {
                Some(Ok(line))
            });
        }
        any = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        total += chunk.len();
        if total <= max {
            line.extend_from_slice(chunk);
        } else {
            line = Vec::new();
        }
        let used = done.unwrap_or(buf.len());
        input.consume(used);
        if done.is_some() {
            return Ok(Some(if total > max { Err(total) } else { Ok(line) }));
        }
    }
}

/// Answer requests from `input` until it ends. Each reply is flushed as it is written. A panic
/// while answering one request answers `inference` and the worker goes on.
pub fn serve(
    bundle: &Bundle,
    opts: &ServeOptions,
    mut input: impl BufRead,
    out: &mut impl Write,
    log: &mut log::Log,
) -> Result<u64> {
    let started_ms = chrono::Utc::now().timestamp_millis();
    let pid = std::process::id();
    let mut n = 0u64;
    loop {
        let line = match read_bounded(&mut input, MAX_LINE)? {
            None => break,
            Some(l) => l,
        };
        let t0 = Instant::now();
        let line = match line {
            Ok(l) => l,
            Err(len) => {
                log.note(&format!(
                    "request of {len} bytes is over {MAX_LINE}: inference error"
                ));
                out.write_all(frame(INFERENCE).as_bytes())?;
                out.flush()?;
                continue;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        n += 1;
        let req = match parse_request(&line) {
            Ok(r) => r,
            Err(why) => {
                log.note(&format!(
                    "request {n}: not a valid request ({why}): inference error"
                ));
                out.write_all(frame(INFERENCE).as_bytes())?;
                out.flush()?;
                continue;
            }
        };
        let answer =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decide(bundle, opts, &req)))
                .unwrap_or_else(|p| Answer::Inference {
                    reason: format!(
                        "panic while deciding: {}",
                        p.downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| p.downcast_ref::<&str>().copied())
                            .unwrap_or("(no message)")
                    ),
                });
        // The receipt goes down before the reply, so every reply keel sees has its receipt
        // even when the worker is killed right after; latency is request to decision.
        let latency = t0.elapsed().as_secs_f64() * 1000.0;
        let id = format!("dw-{started_ms}-{pid}-{n}");
        if let Some(r) = receipt(bundle, &id, &req, &answer, latency) {
            log.receipt(&r);
        }
        out.write_all(frame(&answer.reply_json()).as_bytes())?;
        out.flush()?;
        match &answer {
            Answer::Inference { reason } => {
                log.note(&format!("request {n}: inference error: {reason}"))
            }
            Answer::Capacity { reason, .. } => {
                log.note(&format!("request {n}: capacity: {reason}"))
            }
            Answer::Decision { .. } => {}
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lines() {
        let mut input = std::io::Cursor::new(b"ab\n\nxxxxxxxxxx\ncd".to_vec());
        let mut r = std::io::BufReader::with_capacity(3, &mut input);
        assert_eq!(read_bounded(&mut r, 5).unwrap(), Some(Ok(b"ab".to_vec())));
        assert_eq!(read_bounded(&mut r, 5).unwrap(), Some(Ok(Vec::new())));
        assert_eq!(read_bounded(&mut r, 5).unwrap(), Some(Err(10)));
        assert_eq!(read_bounded(&mut r, 5).unwrap(), Some(Ok(b"cd".to_vec())));
        assert_eq!(read_bounded(&mut r, 5).unwrap(), None);
    }

    /// The gate takes a pick exactly at the threshold (`>=`, as `fit` fits it), and escalates
    /// the next float below it and every pick of a point without a threshold.
    #[test]
    fn a_pick_at_the_threshold_is_taken() {
        let t = 0.7753663703573985;
        assert_eq!(escalation(Some(t), t), None);
        assert_eq!(escalation(Some(t), 1.0), None);
        assert_eq!(
            escalation(Some(t), f64::from_bits(t.to_bits() - 1)),
            Some("below-threshold")
        );
        assert_eq!(escalation(None, 1.0), Some("no-threshold"));
    }
}
