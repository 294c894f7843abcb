//! One JSON Lines receipt, in either shape, detected per line:
//!
//! * the contract's harness record (section 3): it has a `point` key;
//! * keel's `DecisionEvent`: it has a `stage` key (and `createdAt`, `schemaVersion`);
//! * a `keel decisions export` line: a `decision` key holding a `DecisionEvent`, beside `chatId`
//!   and `expectedCandidateId` (the judged reference when not null).
//!
//! Every field is parsed on its own so that an error names the field. Keys we do not know are
//! ignored (a field may be added to either shape); a JSON `null` counts as absent.
//!
//! Decisions where keel's format is ambiguous:
//! * Confidence of a keel pick: `selectedProbability` (the selector's probability for the
//!   candidate it selected, the quantity a calibrated model's threshold applies to) when present,
//!   else `confidence`. Both, when present, must lie in [0, 1]. A `selected` result with neither
//!   is a bad record: without a confidence it cannot be bucketed, and guessing one would bias
//!   the fit.
//! * `fallback` is a reason string: present (non-null) means a fallback was used, with that
//!   reason; keel does not record where it fell back to (`to` stays empty).
//! * `backend` (laya / jev / host) becomes `model`. `taskRevision`, `schemaVersion` and `fit`
//!   are accepted and not kept.
//! * `createdAt` (integer epoch milliseconds) becomes `at` in RFC 3339, UTC, millisecond precision.
//!
//! In both shapes a pick whose id was not offered is a bad record, except when the host itself
//! rejected it as out of set (`rejected-out-of-set`, keel's `rejected`): that record is
//! consistent, and it is what the rejection rate counts.

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::columns::empty_receipt;
use super::rules::{FieldError, Flat, JSON_NAMES, check_pick_offered, err, observed, probability};
use super::{OutcomePatterns, Shape};
use crate::states_io::BadRow;
use crate::{Fallback, Receipt, ReceiptResult, Shadow, Validation};

/// Every key either shape may carry, unparsed.
#[derive(Deserialize)]
struct RawLine<'a> {
    // shared
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    candidates: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    validation: Option<&'a RawValue>,
    #[serde(borrow, default)]
    fallback: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "observedOutcome")]
    observed_outcome: Option<&'a RawValue>,
    // contract
    #[serde(borrow, default)]
    at: Option<&'a RawValue>,
    #[serde(borrow, default)]
    point: Option<&'a RawValue>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    outcome: Option<&'a RawValue>,
    #[serde(borrow, default)]
    shadow: Option<&'a RawValue>,
    // keel
    #[serde(borrow, default)]
    stage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    backend: Option<&'a RawValue>,
    #[serde(borrow, default)]
    confidence: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "selectedProbability")]
    selected_probability: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "createdAt")]
    created_at: Option<&'a RawValue>,
    // `keel decisions export`
    #[serde(borrow, default)]
    decision: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "expectedCandidateId")]
    expected_candidate_id: Option<&'a RawValue>,
}

/// A JSON `null` counts as absent.
fn present(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get().trim() != "null")
}

fn opt<T: DeserializeOwned>(
    raw: Option<&RawValue>,
    field: &str,
    what: &str,
) -> Result<Option<T>, FieldError> {
    match present(raw) {
        None => Ok(None),
        Some(r) => match serde_json::from_str::<T>(r.get()) {
            Ok(v) => Ok(Some(v)),
            Err(_) => err(
                field,
                format!("expected {what}, found {}", preview(r.get())),
            ),
        },
    }
}

fn req<T: DeserializeOwned>(
    raw: Option<&RawValue>,
    field: &str,
    what: &str,
) -> Result<T, FieldError> {
    match opt(raw, field, what)? {
        Some(v) => Ok(v),
        None => err(field, "missing"),
    }
}

fn preview(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_string()
    }
}

fn non_empty(s: String, field: &str) -> Result<String, FieldError> {
    if s.is_empty() {
        err(field, "empty")
    } else {
        Ok(s)
    }
}

fn json_probability(raw: Option<&RawValue>, field: &str) -> Result<Option<f64>, FieldError> {
    let v: Option<f64> = opt(raw, field, "a number")?;
    if let Some(c) = v {
        probability(c, field)?;
    }
    Ok(v)
}

/// Parse one line (without its newline). Blank lines are the caller's business.
pub(super) fn parse_line(
    line: &[u8],
    patterns: &OutcomePatterns,
) -> Result<(Receipt, Shape), FieldError> {
    let raw: RawLine<'_> = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) if e.is_data() => return err("(line)", format!("not a JSON object: {e}")),
        Err(e) => return err("(line)", format!("unparsable JSON: {e}")),
    };
    if present(raw.point).is_some() {
        Ok((contract(&raw, patterns)?, Shape::Contract))
    } else if present(raw.stage).is_some() || present(raw.created_at).is_some() {
        Ok((keel(&raw, patterns)?, Shape::Keel))
    } else if let Some(d) = present(raw.decision) {
        Ok((
            keel_export(d, raw.expected_candidate_id, patterns)?,
            Shape::Keel,
        ))
    } else {
        err(
            "point",
            "missing (neither the contract's `point` nor keel's `stage` is present)",
        )
    }
}

#[derive(Deserialize)]
struct ContractResult<'a> {
    #[serde(borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    confidence: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ContractFallback<'a> {
    #[serde(borrow, default)]
    used: Option<&'a RawValue>,
    #[serde(borrow, default)]
    to: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ContractOutcome<'a> {
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "durationMs")]
    duration_ms: Option<&'a RawValue>,
    #[serde(borrow, default)]
    retries: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ContractShadow<'a> {
    #[serde(borrow, default)]
    reference: Option<&'a RawValue>,
}

fn object<'a, T: Deserialize<'a>>(raw: &'a RawValue, field: &str) -> Result<T, FieldError> {
    serde_json::from_str(raw.get()).or_else(|_| {
        err(
            field,
            format!("expected an object, found {}", preview(raw.get())),
        )
    })
}

/// The harness record: JSON types and nesting are read here, the values then go through the
/// one rule set ([`Flat::fill`]) the Parquet reader uses too.
fn contract(raw: &RawLine<'_>, patterns: &OutcomePatterns) -> Result<Receipt, FieldError> {
    let id: String = req(raw.id, "id", "a string")?;
    let at: String = req(raw.at, "at", "a string")?;
    let point: String = req(raw.point, "point", "a string")?;
    let model: Option<String> = opt(raw.model, "model", "a string")?;
    let candidates: Vec<String> = req(raw.candidates, "candidates", "a list of candidate ids")?;

    let Some(result_raw) = present(raw.result) else {
        return err("result", "missing");
    };
    let res: ContractResult<'_> = object(result_raw, "result")?;
    let kind: String = req(res.kind, "result.kind", "a string")?;
    let result_id: Option<String> = opt(res.id, "result.id", "a string")?;
    let confidence: Option<f64> = opt(res.confidence, "result.confidence", "a number")?;
    let validation: String = req(raw.validation, "validation", "a string")?;

    let (mut fallback_used, mut fallback_to, mut fallback_reason) = (None, None, None);
    if let Some(f) = present(raw.fallback) {
        let f: ContractFallback<'_> = object(f, "fallback")?;
        fallback_used = Some(req::<bool>(f.used, "fallback.used", "true or false")?);
        fallback_to = opt::<String>(f.to, "fallback.to", "a string")?;
        fallback_reason = opt::<String>(f.reason, "fallback.reason", "a string")?;
    }
    let (mut status, mut duration_ms, mut retries) = (None, None, None);
    if let Some(o) = present(raw.outcome) {
        let o: ContractOutcome<'_> = object(o, "outcome")?;
        status = Some(req::<String>(o.status, "outcome.status", "a string")?);
        duration_ms = opt::<i128>(o.duration_ms, "outcome.durationMs", "an integer")?;
        retries = opt::<i128>(o.retries, "outcome.retries", "an integer")?;
    }
    let reference = match present(raw.shadow) {
        None => None,
        Some(s) => {
            let s: ContractShadow<'_> = object(s, "shadow")?;
            Some(req::<String>(s.reference, "shadow.reference", "a string")?)
        }
    };
    let observed_outcome: Option<String> =
        opt(raw.observed_outcome, "observedOutcome", "a string")?;

    let flat = Flat {
        id: Some(&id),
        at: Some(&at),
        at_is_timestamp: false,
        point: Some(&point),
        model: model.as_deref(),
        result_kind: Some(&kind),
        result_id: result_id.as_deref(),
        confidence,
        validation: Some(&validation),
        fallback_used,
        fallback_to: fallback_to.as_deref(),
        fallback_reason: fallback_reason.as_deref(),
        outcome_status: status.as_deref(),
        duration_ms,
        retries,
        shadow_reference: reference.as_deref(),
        observed_outcome: observed_outcome.as_deref(),
    };
    let mut r = empty_receipt();
    flat.fill(
        &JSON_NAMES,
        &mut r,
        |c| {
            *c = candidates;
            Ok(())
        },
        patterns,
    )?;
    Ok(r)
}

#[derive(Deserialize)]
struct KeelResult<'a> {
    #[serde(borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    candidate_id: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "candidateId")]
    candidate_id_camel: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum KeelCandidate {
    Object { id: String },
    Id(String),
}

/// keel's `stage` → our `point`.
pub fn keel_stage_to_point(stage: &str) -> Option<&'static str> {
    Some(match stage {
        "intake" => "intake",
        "preStep" => "pre_step",
        "context" => "context",
        "toolBoundary" => "tool_boundary",
        "completion" => "completion",
        _ => return None,
    })
}

/// keel's `validation` → ours. keel's `rejected` is read here as out of set; [`keel`] makes it
/// `rejected-gate` where the rejected pick was among the candidates (keel rejects an offered id
/// only by its gates: low probability, low confidence, ambiguity).
pub fn keel_validation(v: &str) -> Option<Validation> {
    Some(match v {
        "accepted" => Validation::Accepted,
        "rejected" => Validation::RejectedOutOfSet,
        "stale" => Validation::RejectedStale,
        "expired" => Validation::RejectedExpired,
        "unauthorized" => Validation::RejectedUnauthorized,
        _ => return None,
    })
}

fn keel(raw: &RawLine<'_>, patterns: &OutcomePatterns) -> Result<Receipt, FieldError> {
    let id = non_empty(req(raw.id, "id", "a string")?, "id")?;
    let stage: String = req(raw.stage, "stage", "a string")?;
    let Some(point) = keel_stage_to_point(&stage) else {
        return err(
            "stage",
            format!(
                "unknown value {stage:?} (expected intake, preStep, context, toolBoundary or completion)"
            ),
        );
    };
    let model: Option<String> = opt(raw.backend, "backend", "a string")?;
    if let Some(b) = &model
        && !matches!(b.as_str(), "laya" | "jev" | "host")
    {
        return err(
            "backend",
            format!("unknown value {b:?} (expected laya, jev or host)"),
        );
    }
    let candidates: Vec<KeelCandidate> =
        req(raw.candidates, "candidates", "a list of {id, summary}")?;
    let candidates: Vec<String> = candidates
        .into_iter()
        .map(|c| match c {
            KeelCandidate::Object { id } | KeelCandidate::Id(id) => id,
        })
        .collect();

    let confidence = json_probability(raw.confidence, "confidence")?;
    let selected_probability = json_probability(raw.selected_probability, "selectedProbability")?;

    let Some(result_raw) = present(raw.result) else {
        return err("result", "missing");
    };
    let res: KeelResult<'_> = object(result_raw, "result")?;
    let kind: String = req(res.kind, "result.kind", "a string")?;
    let result = match kind.as_str() {
        "selected" => {
            let id: String = match present(res.candidate_id) {
                Some(_) => req(res.candidate_id, "result.candidate_id", "a string")?,
                None => req(res.candidate_id_camel, "result.candidate_id", "a string")?,
            };
            let Some(confidence) = selected_probability.or(confidence) else {
                return err(
                    "selectedProbability",
                    "a selected result needs selectedProbability or confidence",
                );
            };
            ReceiptResult::Pick { id, confidence }
        }
        "abstained" => ReceiptResult::Abstain,
        other => {
            return err(
                "result.kind",
                format!("unknown value {other:?} (expected selected or abstained)"),
            );
        }
    };

    let v: String = req(raw.validation, "validation", "a string")?;
    let Some(mut validation) = keel_validation(&v) else {
        return err(
            "validation",
            format!(
                "unknown value {v:?} (expected accepted, rejected, stale, expired or unauthorized)"
            ),
        );
    };
    if validation == Validation::RejectedOutOfSet
        && let ReceiptResult::Pick { id, .. } = &result
        && candidates.contains(id)
    {
        validation = Validation::RejectedGate;
    }

    let fallback =
        opt::<String>(raw.fallback, "fallback", "a reason string")?.map(|reason| Fallback {
            used: true,
            to: None,
            reason: Some(reason),
        });

    let created: i64 = match present(raw.created_at) {
        None => return err("createdAt", "missing"),
        Some(r) => match serde_json::from_str::<i64>(r.get()) {
            Ok(v) => v,
            Err(_) => {
                return err(
                    "createdAt",
                    format!("expected epoch milliseconds, found {}", preview(r.get())),
                );
            }
        },
    };
    let Some(at) = DateTime::from_timestamp_millis(created) else {
        return err("createdAt", format!("{created} is out of range"));
    };
    let at = at.to_rfc3339_opts(SecondsFormat::Millis, true);

    let observed_outcome: Option<String> =
        opt(raw.observed_outcome, "observedOutcome", "a string")?;
    let outcome = observed(observed_outcome.as_deref(), patterns);

    let r = Receipt {
        id,
        at,
        point: point.to_string(),
        model,
        candidates,
        result,
        validation,
        fallback,
        outcome,
        shadow: None,
        observed_outcome,
    };
    check_pick_offered(&r, "result.candidate_id")?;
    Ok(r)
}

/// A `keel decisions export` line, `{"chatId", "decision": DecisionEvent, "expectedCandidateId"}`:
/// the event as [`keel`] reads it (its errors name `decision.FIELD`); a non-null
/// `expectedCandidateId`, the id a person says should have been chosen, is the judged reference
/// (`shadow.reference`), which wins over the free-text outcome when both are there. It must be
/// one of the offered candidates.
fn keel_export(
    decision: &RawValue,
    expected: Option<&RawValue>,
    patterns: &OutcomePatterns,
) -> Result<Receipt, FieldError> {
    let inner: RawLine<'_> = object(decision, "decision")?;
    let mut r = keel(&inner, patterns).map_err(|e| FieldError {
        field: format!("decision.{}", e.field),
        reason: e.reason,
    })?;
    if let Some(reference) = opt::<String>(expected, "expectedCandidateId", "a candidate id")? {
        if !r.candidates.contains(&reference) {
            return err(
                "expectedCandidateId",
                format!("{reference:?} is not one of the offered candidates"),
            );
        }
        r.shadow = Some(Shadow { reference });
    }
    Ok(r)
}

/// Turn a field error into a bad record with its place and bytes.
pub(super) fn bad(file: &Arc<PathBuf>, row: u64, e: FieldError, raw: &[u8]) -> BadRow {
    BadRow::from_line(file.clone(), row, raw.to_vec(), vec![e])
}

/// What one line of a JSON Lines file holds.
#[allow(clippy::large_enum_variant)] // one per line, matched and moved once
pub(super) enum Line {
    /// Empty or whitespace: not a record.
    Blank,
    /// The file's last line, without its newline and not even JSON: what a writer killed
    /// mid-append leaves (decision-worker's log). Skipped, not a record.
    Torn,
    Good(Receipt, Shape),
    Bad(FieldError),
}

/// Say that a torn last line ([`Line::Torn`], `len` bytes) was skipped.
pub(super) fn warn_torn(file: &std::path::Path, row: u64, len: usize) {
    eprintln!(
        "warning: {}: row {row}: skipped a torn last line ({len} bytes, no newline, not JSON): \
         the writer was interrupted",
        file.display()
    );
}

/// Read line `row` (1-based, without its `\n`; `complete` when it had one). Returns the line's
/// bytes as the quarantine keeps them (a first line's byte-order mark dropped) and what it holds.
pub(super) fn eval_line<'a>(
    line: &'a [u8],
    row: u64,
    complete: bool,
    patterns: &OutcomePatterns,
) -> (&'a [u8], Line) {
    let line = match line.strip_prefix(crate::states_io::UTF8_BOM) {
        Some(rest) if row == 1 => rest,
        _ => line,
    };
    if line.iter().all(u8::is_ascii_whitespace) {
        return (line, Line::Blank);
    }
    if !complete && serde_json::from_slice::<serde::de::IgnoredAny>(line).is_err() {
        return (line, Line::Torn);
    }
    let item = match parse_line(line, patterns) {
        Ok((r, shape)) => Line::Good(r, shape),
        Err(e) => Line::Bad(e),
    };
    (line, item)
}
