//! The receipt rules evaluated column-wise over one Arrow batch (the parallel read of
//! `decision fit`). Each dictionary column's few values are mapped once per batch (a point's
//! name checked, an enum parsed, a free-text outcome classified, a picked id found among the
//! candidates' values), so that a row is a handful of key lookups into those tables; a row that
//! passes becomes a point and its [`Facts`] without ever being copied into a [`Receipt`].
//!
//! A row that does not plainly pass (any rule failed, or a case the fast check leaves to the
//! full rules, such as an `at` only chrono's parser accepts) is a *suspect*: it goes through the
//! row-wise rules of [`super::parquet_io`] (`Flat::fill`, the ones every other read uses), which
//! decide it and, for a bad row, name the first bad field exactly as before. So the fast path
//! only ever has to be right about the rows it accepts: those are the rows the row-wise rules
//! accept, with the same facts (`tests.rs` and the `receipts-parquet` fuzz target compare the
//! two reads).
//!
//! [`Receipt`]: crate::Receipt

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use arrow_array::RecordBatch;

use super::OutcomePatterns;
use super::columns::{AtCol, BoolCol, F64Col, IntCol, ListCol};
use super::rules::{plainly_rfc3339, valid_point};
use super::scan::Facts;
use crate::receipt::{HOST_BACKEND, says_selector_abstained};
use crate::string_column::{Coded, StrCol};
use crate::{OutcomeStatus, Validation};

/// No entry in a table (a value that is not a valid name, not among the candidates, …).
const NONE: u32 = u32::MAX;

/// What a `result_kind` value means.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Pick,
    Abstain,
    Unknown,
}

/// One batch's columns and, per dictionary value, what the rules make of it.
pub(super) struct BatchRules<'a> {
    id: StrCol<'a>,
    at: AtCol<'a>,
    /// Per row, whether a timestamp `at` is a time (only for a timestamp column).
    at_ok: Vec<bool>,
    point: Coded<'a>,
    /// Per `point` value, its index in [`BatchRules::points`], or [`NONE`] for a bad name.
    point_slot: Vec<u32>,
    /// The valid point names of this batch.
    pub points: Vec<&'a str>,
    candidates: ListCol<'a>,
    /// The candidates' item values, coded.
    items: Coded<'a>,
    /// Per item value, the index of the first value with the same text.
    item_canon: Vec<u32>,
    kind: Coded<'a>,
    kind_of: Vec<Kind>,
    result_id: Coded<'a>,
    /// Per `result_id` value: the canonical index of the same text among the items, or NONE.
    pick_item: Vec<u32>,
    /// Per `result_id` value, the index of the first value with the same text.
    pick_canon: Vec<u32>,
    confidence: F64Col<'a>,
    validation: Coded<'a>,
    validation_of: Vec<Option<Validation>>,
    fallback_used: BoolCol<'a>,
    model: Coded<'a>,
    /// Per `model` value, whether it names the host (as [`crate::Receipt::host_scored`] reads it).
    model_is_host: Vec<bool>,
    fallback_reason: Coded<'a>,
    /// Per `fallback_reason` value, whether it says the selector abstained.
    reason_is_abstention: Vec<bool>,
    status: Coded<'a>,
    /// Per `outcome_status` value; `None` for an unknown one.
    status_of: Vec<Option<OutcomeStatus>>,
    duration_ms: IntCol<'a>,
    retries: IntCol<'a>,
    shadow: Coded<'a>,
    /// Per `shadow_reference` value: the canonical `result_id` index of the same text, or NONE.
    shadow_pick: Vec<u32>,
    observed: Coded<'a>,
    /// Per `observed_outcome` value, what the configured patterns make of it.
    observed_of: Vec<Option<OutcomeStatus>>,
}

/// Per value, the index of the first value with the same text (values repeat only where a
/// writer's dictionary did), and the map from text to that index.
fn canonical<'a>(values: &[Option<&'a str>]) -> (Vec<u32>, HashMap<&'a str, u32>) {
    let mut first: HashMap<&str, u32> = HashMap::with_capacity(values.len());
    let canon = values
        .iter()
        .enumerate()
        .map(|(k, v)| match v {
            Some(s) => *first.entry(s).or_insert(k as u32),
            None => NONE,
        })
        .collect();
    (canon, first)
}

impl<'a> BatchRules<'a> {
    pub fn new(batch: &'a RecordBatch, file: &Path, patterns: &OutcomePatterns) -> Result<Self> {
        let c = |n: &str| batch.column_by_name(n);
        let coded = |n: &str| -> Result<Coded<'a>> {
            Ok(StrCol::new(batch.column_by_name(n), n, file)?.coded(batch.num_rows()))
        };
        let at = AtCol::new(c("at"), file)?;
        let at_ok = match &at {
            AtCol::Ts { .. } => {
                let mut buf = String::new();
                (0..batch.num_rows())
                    .map(|i| at.get(i, &mut buf).is_some())
                    .collect()
            }
            AtCol::Str(_) => Vec::new(),
        };

        let point = coded("point")?;
        let mut slots: HashMap<&str, u32> = HashMap::new();
        let mut points = Vec::new();
        let point_slot = point
            .values
            .iter()
            .map(|v| match v {
                Some(name) if valid_point(name) => *slots.entry(name).or_insert_with(|| {
                    points.push(*name);
                    points.len() as u32 - 1
                }),
                _ => NONE,
            })
            .collect();

        let mut candidates = ListCol::new(
            c("candidates").ok_or_else(|| anyhow::anyhow!("candidates column checked"))?,
            file,
        )?;
        let items = std::mem::replace(&mut candidates.values, StrCol::Missing)
            .coded(candidates.item_count());
        let (item_canon, item_first) = canonical(&items.values);
        let result_id = coded("result_id")?;
        let (pick_canon, pick_first) = canonical(&result_id.values);
        let pick_item = result_id
            .values
            .iter()
            .map(|v| v.and_then(|s| item_first.get(s).copied()).unwrap_or(NONE))
            .collect();
        let shadow = coded("shadow_reference")?;
        let shadow_pick = shadow
            .values
            .iter()
            .map(|v| v.and_then(|s| pick_first.get(s).copied()).unwrap_or(NONE))
            .collect();

        let kind = coded("result_kind")?;
        let kind_of = kind
            .values
            .iter()
            .map(|v| match v {
                Some("pick") => Kind::Pick,
                Some("abstain") => Kind::Abstain,
                _ => Kind::Unknown,
            })
            .collect();
        let validation = coded("validation")?;
        let validation_of = validation
            .values
            .iter()
            .map(|v| v.and_then(Validation::parse))
            .collect();
        let model = coded("model")?;
        let model_is_host = model
            .values
            .iter()
            .map(|&v| v == Some(HOST_BACKEND))
            .collect();
        let fallback_reason = coded("fallback_reason")?;
        let reason_is_abstention = fallback_reason
            .values
            .iter()
            .map(|&v| v.is_some_and(says_selector_abstained))
            .collect();
        let status = coded("outcome_status")?;
        let status_of = status
            .values
            .iter()
            .map(|v| v.and_then(OutcomeStatus::parse))
            .collect();
        let observed = coded("observed_outcome")?;
        let observed_of = observed
            .values
            .iter()
            .map(|v| v.and_then(|s| patterns.classify(s)))
            .collect();

        Ok(BatchRules {
            id: StrCol::new(c("id"), "id", file)?,
            at,
            at_ok,
            point,
            point_slot,
            points,
            candidates,
            items,
            item_canon,
            kind,
            kind_of,
            result_id,
            pick_item,
            pick_canon,
            confidence: F64Col::new(c("confidence"), "confidence", file)?,
            validation,
            validation_of,
            fallback_used: BoolCol::new(c("fallback_used"), "fallback_used", file)?,
            model,
            model_is_host,
            fallback_reason,
            reason_is_abstention,
            status,
            status_of,
            duration_ms: IntCol::new(c("outcome_duration_ms"), "outcome_duration_ms", file)?,
            retries: IntCol::new(c("outcome_retries"), "outcome_retries", file)?,
            shadow,
            shadow_pick,
            observed,
            observed_of,
        })
    }

    /// Row `i`'s id (`None` when null).
    #[inline]
    pub fn id(&self, i: usize) -> Option<&'a str> {
        self.id.get(i)
    }

    /// Row `i`'s point (an index into [`BatchRules::points`]) and facts when it plainly passes
    /// every rule; `None` when the row-wise rules must decide it.
    #[inline]
    pub fn eval(&self, i: usize) -> Option<(u32, Facts)> {
        if self.id.get(i)?.is_empty() {
            return None;
        }
        match &self.at {
            AtCol::Str(s) => {
                if !plainly_rfc3339(s.get(i)?) {
                    return None;
                }
            }
            AtCol::Ts { .. } => {
                if !self.at_ok[i] {
                    return None;
                }
            }
        }
        let slot = self.point_slot[self.point.key(i)?];
        if slot == NONE {
            return None;
        }
        let items = self.candidates.range(i)?;
        if self.items.any_null_row(items.clone()) {
            return None;
        }
        let validation = self.validation_of[self.validation.key(i)?]?;
        let pick = match self.kind_of[self.kind.key(i)?] {
            Kind::Pick => {
                let rk = self.result_id.key(i)?;
                let c = self.confidence.get(i)?;
                if !(c.is_finite() && (0.0..=1.0).contains(&c)) {
                    return None;
                }
                Some((rk, c))
            }
            Kind::Abstain => None,
            Kind::Unknown => return None,
        };
        // the pick must be among the candidates unless rejected as out of set (NONE matches no
        // item), and no item may be null (a null value, or a key past the values)
        let want = match pick {
            Some((rk, _)) if validation != Validation::RejectedOutOfSet => Some(self.pick_item[rk]),
            _ => None,
        };
        let mut offered = false;
        for &k in self.items.keys.get(items)? {
            let text = self.item_canon.get(k as usize).copied().unwrap_or(NONE);
            if text == NONE {
                return None;
            }
            offered |= Some(text) == want;
        }
        if want.is_some() && !offered {
            return None;
        }

        let outcome = match self.status.key(i) {
            None => {
                if self.duration_ms.is_set(i) || self.retries.is_set(i) {
                    return None;
                }
                None
            }
            Some(k) => {
                let s = self.status_of[k]?;
                if self.duration_ms.get(i).is_some_and(|d| d < 0)
                    || self
                        .retries
                        .get(i)
                        .is_some_and(|r| !(0..=i128::from(u32::MAX)).contains(&r))
                {
                    return None;
                }
                Some(s)
            }
        };
        let observed = self.observed.key(i);
        let shadow_match = self
            .shadow
            .key(i)
            .map(|sk| pick.is_some_and(|(rk, _)| self.pick_canon[rk] == self.shadow_pick[sk]));
        // as `Receipt::host_scored`: a pick by the host's model, or whose fallback (read only
        // where `fallback_used` is set, as the row-wise rules build it) says the selector abstained
        let host_scored = pick.is_some()
            && (self.model.key(i).is_some_and(|k| self.model_is_host[k])
                || (self.fallback_used.get(i).is_some()
                    && self
                        .fallback_reason
                        .key(i)
                        .is_some_and(|k| self.reason_is_abstention[k])));
        Some((
            slot,
            Facts {
                confidence: pick.map(|(_, c)| c),
                validation,
                fallback_used: self.fallback_used.get(i) == Some(true),
                host_scored,
                shadow_match,
                outcome: outcome.or_else(|| observed.and_then(|k| self.observed_of[k])),
                observed: observed.is_some(),
            },
        ))
    }
}
