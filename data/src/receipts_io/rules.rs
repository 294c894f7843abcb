//! The receipt rules of the contract's record (section 3), applied once for every format: a JSON
//! Lines harness record and a Parquet row are each read into a [`Flat`] (their values, typed but
//! unchecked) and go through [`Flat::fill`], so the two formats cannot drift apart. keel's shape
//! has its own vocabulary (in `line.rs`) and shares the value rules below ([`probability`],
//! [`check_pick_offered`], [`observed`]).

use chrono::DateTime;

use super::OutcomePatterns;
pub(super) use crate::states_io::FieldError;
use crate::{Fallback, Outcome, OutcomeStatus, Receipt, ReceiptResult, Shadow, Validation};

/// How a format names the fields that are nested in JSON and flattened in Parquet.
pub(super) struct Names {
    pub result_kind: &'static str,
    pub result_id: &'static str,
    pub confidence: &'static str,
    pub outcome_status: &'static str,
    pub duration_ms: &'static str,
    pub retries: &'static str,
}

pub(super) const JSON_NAMES: Names = Names {
    result_kind: "result.kind",
    result_id: "result.id",
    confidence: "result.confidence",
    outcome_status: "outcome.status",
    duration_ms: "outcome.durationMs",
    retries: "outcome.retries",
};

pub(super) const PARQUET_NAMES: Names = Names {
    result_kind: "result_kind",
    result_id: "result_id",
    confidence: "confidence",
    outcome_status: "outcome_status",
    duration_ms: "outcome_duration_ms",
    retries: "outcome_retries",
};

/// One contract record's values as read, absent (`None`) where the format had none.
#[derive(Default)]
pub(super) struct Flat<'a> {
    pub id: Option<&'a str>,
    pub at: Option<&'a str>,
    /// `at` came from a timestamp column: valid by type.
    pub at_is_timestamp: bool,
    pub point: Option<&'a str>,
    pub model: Option<&'a str>,
    pub result_kind: Option<&'a str>,
    pub result_id: Option<&'a str>,
    pub confidence: Option<f64>,
    pub validation: Option<&'a str>,
    pub fallback_used: Option<bool>,
    pub fallback_to: Option<&'a str>,
    pub fallback_reason: Option<&'a str>,
    pub outcome_status: Option<&'a str>,
    pub duration_ms: Option<i128>,
    pub retries: Option<i128>,
    pub shadow_reference: Option<&'a str>,
    pub observed_outcome: Option<&'a str>,
}

pub(super) fn err<T>(field: &str, reason: impl Into<String>) -> Result<T, FieldError> {
    Err(FieldError::new(field, reason))
}

fn set(dst: &mut String, src: &str) {
    dst.clear();
    dst.push_str(src);
}

fn set_opt(dst: &mut Option<String>, src: Option<&str>) {
    match (dst.as_mut(), src) {
        (Some(d), Some(s)) => set(d, s),
        (None, Some(s)) => *dst = Some(s.to_string()),
        (_, None) => *dst = None,
    }
}

impl Flat<'_> {
    /// Check every rule and fill `r` (reusing its allocations). `candidates` fills
    /// `r.candidates` (the formats hold them differently) at its place in the field order, so
    /// the first bad field is the one reported.
    pub fn fill(
        &self,
        names: &Names,
        r: &mut Receipt,
        candidates: impl FnOnce(&mut Vec<String>) -> Result<(), FieldError>,
        patterns: &OutcomePatterns,
    ) -> Result<(), FieldError> {
        let id = self.id.ok_or_else(|| FieldError::new("id", "missing"))?;
        if id.is_empty() {
            return err("id", "empty");
        }
        set(&mut r.id, id);
        let at = self.at.ok_or_else(|| FieldError::new("at", "missing"))?;
        if !self.at_is_timestamp
            && !plainly_rfc3339(at)
            && DateTime::parse_from_rfc3339(at).is_err()
        {
            return err("at", format!("{at:?} is not an RFC 3339 time"));
        }
        set(&mut r.at, at);
        let point = self
            .point
            .ok_or_else(|| FieldError::new("point", "missing"))?;
        if !valid_point(point) {
            return err("point", format!("{point:?} does not match [a-z][a-z0-9_]*"));
        }
        set(&mut r.point, point);
        set_opt(&mut r.model, self.model);
        candidates(&mut r.candidates)?;

        let kind = self
            .result_kind
            .ok_or_else(|| FieldError::new(names.result_kind, "missing"))?;
        match kind {
            "pick" => {
                let pid = self
                    .result_id
                    .ok_or_else(|| FieldError::new(names.result_id, "missing"))?;
                let c = self
                    .confidence
                    .ok_or_else(|| FieldError::new(names.confidence, "missing"))?;
                probability(c, names.confidence)?;
                match &mut r.result {
                    ReceiptResult::Pick { id, confidence } => {
                        set(id, pid);
                        *confidence = c;
                    }
                    ReceiptResult::Abstain => {
                        r.result = ReceiptResult::Pick {
                            id: pid.to_string(),
                            confidence: c,
                        }
                    }
                }
            }
            "abstain" => r.result = ReceiptResult::Abstain,
            other => {
                return err(
                    names.result_kind,
                    format!("unknown value {other:?} (expected pick or abstain)"),
                );
            }
        }

        let v = self
            .validation
            .ok_or_else(|| FieldError::new("validation", "missing"))?;
        r.validation = Validation::parse(v)
            .ok_or_else(|| FieldError::new("validation", format!("unknown value {v:?}")))?;

        r.fallback = self.fallback_used.map(|used| Fallback {
            used,
            to: self.fallback_to.map(str::to_string),
            reason: self.fallback_reason.map(str::to_string),
        });

        r.outcome = match self.outcome_status {
            None if self.duration_ms.is_some() || self.retries.is_some() => {
                return err(
                    names.outcome_status,
                    format!(
                        "missing while {} / {} are set",
                        names.duration_ms, names.retries
                    ),
                );
            }
            None => None,
            Some(s) => Some(Outcome {
                status: OutcomeStatus::parse(s).ok_or_else(|| {
                    FieldError::new(
                        names.outcome_status,
                        format!("unknown value {s:?} (expected success, failure or abandoned)"),
                    )
                })?,
                duration_ms: self
                    .duration_ms
                    .map(|d| {
                        u64::try_from(d).map_err(|_| {
                            FieldError::new(names.duration_ms, format!("{d} is negative"))
                        })
                    })
                    .transpose()?,
                retries: self
                    .retries
                    .map(|d| {
                        u32::try_from(d).map_err(|_| {
                            FieldError::new(names.retries, format!("{d} is out of range"))
                        })
                    })
                    .transpose()?,
            }),
        };
        match (r.shadow.as_mut(), self.shadow_reference) {
            (Some(s), Some(v)) => set(&mut s.reference, v),
            (None, Some(v)) => {
                r.shadow = Some(Shadow {
                    reference: v.to_string(),
                })
            }
            (_, None) => r.shadow = None,
        }
        set_opt(&mut r.observed_outcome, self.observed_outcome);
        if r.outcome.is_none() {
            r.outcome = observed(r.observed_outcome.as_deref(), patterns);
        }
        check_pick_offered(r, names.result_id)
    }
}

/// Whether `at` is an RFC 3339 time in the plain form harnesses write
/// (`2026-11-30T12:00:00Z`, `…:00.123+01:00`), checked in a few nanoseconds. Only ever true for
/// a time chrono's parser accepts too: anything else (a leap second, a lowercase `t`, a space,
/// ten fraction digits) is left to it.
pub(super) fn plainly_rfc3339(at: &str) -> bool {
    let bytes = at.as_bytes();
    let Some((head, tail)) = bytes.split_first_chunk::<19>() else {
        return false;
    };
    // each byte's digit value; a non-digit wraps to 10 or more
    let d = head.map(|c| c.wrapping_sub(b'0'));
    let digits = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18];
    if digits.iter().any(|&i| d[i] > 9)
        || head[4] != b'-'
        || head[7] != b'-'
        || head[10] != b'T'
        || head[13] != b':'
        || head[16] != b':'
        || !matches!(head[0], b'1' | b'2')
    {
        return false;
    }
    let two = |i: usize| d[i] * 10 + d[i + 1];
    let (month, day, hour, minute, second) = (two(5), two(8), two(11), two(14), two(17));
    let year = u32::from(two(0)) * 100 + u32::from(two(2));
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=12).contains(&month)
        || !(1..=days).contains(&day)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return false;
    }
    let mut zone = tail;
    if let [b'.', rest @ ..] = zone {
        let n = rest.iter().take_while(|c| c.is_ascii_digit()).count();
        if !(1..=9).contains(&n) {
            return false;
        }
        zone = &rest[n..];
    }
    match zone {
        [b'Z'] => true,
        [sign, h1, h2, b':', m1, m2]
            if matches!(sign, b'+' | b'-')
                && [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()) =>
        {
            (h1 - b'0') * 10 + (h2 - b'0') <= 23 && (m1 - b'0') * 10 + (m2 - b'0') <= 59
        }
        _ => false,
    }
}

/// A confidence must be a number in [0, 1].
pub(super) fn probability(c: f64, field: &str) -> Result<(), FieldError> {
    if c.is_finite() && (0.0..=1.0).contains(&c) {
        Ok(())
    } else {
        err(field, format!("{c} is outside [0, 1]"))
    }
}

/// The outcome a free-text observed outcome stands for, by the configured patterns.
pub(super) fn observed(text: Option<&str>, patterns: &OutcomePatterns) -> Option<Outcome> {
    Some(Outcome {
        status: patterns.classify(text?)?,
        duration_ms: None,
        retries: None,
    })
}

/// `[a-z][a-z0-9_]*`, as contracts section 1 names decision points.
pub(super) fn valid_point(p: &str) -> bool {
    let mut b = p.bytes();
    matches!(b.next(), Some(b'a'..=b'z'))
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

/// A pick must name an offered candidate unless the host rejected it as out of set.
pub(super) fn check_pick_offered(r: &Receipt, field: &str) -> Result<(), FieldError> {
    if let ReceiptResult::Pick { id, .. } = &r.result
        && r.validation != Validation::RejectedOutOfSet
        && !r.candidates.iter().any(|c| c == id)
    {
        return err(
            field,
            format!(
                "picked {id:?}, which was not offered, yet validation is {}",
                r.validation.as_str()
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The fast check never accepts what chrono refuses, and accepts the plain forms.
    #[test]
    fn the_plain_rfc3339_check_agrees_with_chrono() {
        for ok in [
            "2026-11-30T12:00:00Z",
            "2026-11-28T23:59:59.123456789+01:00",
            "1999-01-01T00:00:00.5-12:30",
            "2024-02-29T00:00:00Z",
            "2026-12-31T00:00:00Z",
        ] {
            assert!(plainly_rfc3339(ok), "{ok}");
            assert!(DateTime::parse_from_rfc3339(ok).is_ok(), "{ok}");
        }
        for no in [
            "2026-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
        ] {
            assert!(!plainly_rfc3339(no), "{no}");
        }
        let base = b"2024-02-29T23:59:59.123+05:30";
        let alphabet = b"0123456789-:T tZz+.";
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut accepted = 0;
        for _ in 0..300_000 {
            let mut s = base.to_vec();
            for _ in 0..rng.random_range(1..=3) {
                let i = rng.random_range(0..s.len());
                match rng.random_range(0..3) {
                    0 => s[i] = alphabet[rng.random_range(0..alphabet.len())],
                    1 => {
                        s.remove(i);
                    }
                    _ => s.insert(i, alphabet[rng.random_range(0..alphabet.len())]),
                }
            }
            let Ok(t) = std::str::from_utf8(&s) else {
                continue;
            };
            if plainly_rfc3339(t) {
                accepted += 1;
                assert!(
                    DateTime::parse_from_rfc3339(t).is_ok(),
                    "{t:?} passed the fast check only"
                );
            }
        }
        assert!(accepted > 10_000, "{accepted} variants accepted");
    }
}
