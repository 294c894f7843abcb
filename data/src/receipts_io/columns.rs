//! A receipts batch's columns as the readers see them: each column typed once per batch
//! (the string, large-string, string-view and dictionary encodings, a string or timestamp `at`,
//! 32- or 64-bit numbers), read per row by the row-wise rules ([`fill`]) and per dictionary value
//! by the column-wise ones (`batch_rules.rs`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use chrono::{DateTime, SecondsFormat};
use serde_json::{Map, Value, json};

use super::OutcomePatterns;
use super::rules::{FieldError, Flat, PARQUET_NAMES};
use crate::string_column::StrCol;
use crate::{Receipt, ReceiptResult, Validation};

/// `at` may be a string or a timestamp.
pub(super) enum AtCol<'a> {
    Str(StrCol<'a>),
    Ts { array: &'a ArrayRef, unit: TimeUnit },
}

impl<'a> AtCol<'a> {
    pub fn new(a: Option<&'a ArrayRef>, file: &Path) -> Result<Self> {
        match a.map(|a| a.data_type()) {
            Some(DataType::Timestamp(unit, _)) => Ok(AtCol::Ts {
                array: a.expect("checked"),
                unit: *unit,
            }),
            _ => Ok(AtCol::Str(StrCol::new(a, "at", file)?)),
        }
    }

    /// The RFC 3339 text, and whether it came from a timestamp (then it is valid by type).
    pub fn get(&self, i: usize, buf: &mut String) -> Option<bool> {
        match self {
            AtCol::Str(s) => {
                buf.clear();
                buf.push_str(s.get(i)?);
                Some(false)
            }
            AtCol::Ts { array, unit } => {
                if array.is_null(i) {
                    return None;
                }
                let (secs, nanos) = match unit {
                    TimeUnit::Second => (array.as_primitive::<TimestampSecondType>().value(i), 0),
                    TimeUnit::Millisecond => {
                        let v = array.as_primitive::<TimestampMillisecondType>().value(i);
                        (v.div_euclid(1000), v.rem_euclid(1000) * 1_000_000)
                    }
                    TimeUnit::Microsecond => {
                        let v = array.as_primitive::<TimestampMicrosecondType>().value(i);
                        (v.div_euclid(1_000_000), v.rem_euclid(1_000_000) * 1000)
                    }
                    TimeUnit::Nanosecond => {
                        let v = array.as_primitive::<TimestampNanosecondType>().value(i);
                        (v.div_euclid(1_000_000_000), v.rem_euclid(1_000_000_000))
                    }
                };
                let t = DateTime::from_timestamp(secs, nanos as u32)?;
                buf.clear();
                buf.push_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true));
                Some(true)
            }
        }
    }
}

pub(super) enum F64Col<'a> {
    F64(&'a arrow_array::Float64Array),
    F32(&'a arrow_array::Float32Array),
    Missing,
}

impl<'a> F64Col<'a> {
    pub fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
        let Some(a) = a else {
            return Ok(F64Col::Missing);
        };
        Ok(match a.data_type() {
            DataType::Float64 => F64Col::F64(a.as_primitive::<Float64Type>()),
            DataType::Float32 => F64Col::F32(a.as_primitive::<Float32Type>()),
            DataType::Null => F64Col::Missing,
            t => bail!(
                "{}: column `{name}` has type {t}, expected a float column",
                file.display()
            ),
        })
    }

    pub fn get(&self, i: usize) -> Option<f64> {
        match self {
            F64Col::F64(a) => a.is_valid(i).then(|| a.value(i)),
            F64Col::F32(a) => a.is_valid(i).then(|| f64::from(a.value(i))),
            F64Col::Missing => None,
        }
    }
}

pub(super) enum IntCol<'a> {
    I64(&'a arrow_array::Int64Array),
    I32(&'a arrow_array::Int32Array),
    U64(&'a arrow_array::UInt64Array),
    U32(&'a arrow_array::UInt32Array),
    Missing,
}

impl<'a> IntCol<'a> {
    pub fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
        let Some(a) = a else {
            return Ok(IntCol::Missing);
        };
        Ok(match a.data_type() {
            DataType::Int64 => IntCol::I64(a.as_primitive::<Int64Type>()),
            DataType::Int32 => IntCol::I32(a.as_primitive::<Int32Type>()),
            DataType::UInt64 => IntCol::U64(a.as_primitive::<UInt64Type>()),
            DataType::UInt32 => IntCol::U32(a.as_primitive::<UInt32Type>()),
            DataType::Null => IntCol::Missing,
            t => bail!(
                "{}: column `{name}` has type {t}, expected an integer column",
                file.display()
            ),
        })
    }

    /// Row `i` holds a number.
    #[inline]
    pub fn is_set(&self, i: usize) -> bool {
        match self {
            IntCol::I64(a) => a.is_valid(i),
            IntCol::I32(a) => a.is_valid(i),
            IntCol::U64(a) => a.is_valid(i),
            IntCol::U32(a) => a.is_valid(i),
            IntCol::Missing => false,
        }
    }

    pub fn get(&self, i: usize) -> Option<i128> {
        match self {
            IntCol::I64(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::I32(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::U64(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::U32(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::Missing => None,
        }
    }
}

pub(super) enum BoolCol<'a> {
    B(&'a BooleanArray),
    Missing,
}

impl<'a> BoolCol<'a> {
    pub fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
        let Some(a) = a else {
            return Ok(BoolCol::Missing);
        };
        Ok(match a.data_type() {
            DataType::Boolean => BoolCol::B(a.as_boolean()),
            DataType::Null => BoolCol::Missing,
            t => bail!(
                "{}: column `{name}` has type {t}, expected a boolean column",
                file.display()
            ),
        })
    }

    pub fn get(&self, i: usize) -> Option<bool> {
        match self {
            BoolCol::B(a) => a.is_valid(i).then(|| a.value(i)),
            BoolCol::Missing => None,
        }
    }
}

/// A list of strings (`candidates`).
pub(super) struct ListCol<'a> {
    offsets: Vec<usize>,
    valid: &'a dyn Array,
    pub values: StrCol<'a>,
}

impl<'a> ListCol<'a> {
    pub fn new(a: &'a ArrayRef, file: &Path) -> Result<Self> {
        let (offsets, values): (Vec<usize>, &ArrayRef) = match a.data_type() {
            DataType::List(_) => {
                let l = a.as_list::<i32>();
                (
                    l.value_offsets().iter().map(|&o| o as usize).collect(),
                    l.values(),
                )
            }
            DataType::LargeList(_) => {
                let l = a.as_list::<i64>();
                (
                    l.value_offsets().iter().map(|&o| o as usize).collect(),
                    l.values(),
                )
            }
            t => bail!(
                "{}: column `candidates` has type {t}, expected a list of strings",
                file.display()
            ),
        };
        Ok(Self {
            offsets,
            valid: a.as_ref(),
            values: StrCol::new(Some(values), "candidates", file)?,
        })
    }

    /// Row `i`'s items' indices in `values`; `None` when the list is null.
    #[inline]
    pub fn range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        self.valid
            .is_valid(i)
            .then(|| self.offsets[i]..self.offsets[i + 1])
    }

    /// The items of all rows.
    pub fn item_count(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    pub fn len(&self, i: usize) -> Option<usize> {
        self.valid
            .is_valid(i)
            .then(|| self.offsets[i + 1] - self.offsets[i])
    }

    pub fn item(&self, i: usize, k: usize) -> Option<&'a str> {
        self.values.get(self.offsets[i] + k)
    }
}

pub(super) struct Cols<'a> {
    id: StrCol<'a>,
    at: AtCol<'a>,
    point: StrCol<'a>,
    model: StrCol<'a>,
    candidates: ListCol<'a>,
    result_kind: StrCol<'a>,
    result_id: StrCol<'a>,
    confidence: F64Col<'a>,
    validation: StrCol<'a>,
    fallback_used: BoolCol<'a>,
    fallback_to: StrCol<'a>,
    fallback_reason: StrCol<'a>,
    outcome_status: StrCol<'a>,
    outcome_duration_ms: IntCol<'a>,
    outcome_retries: IntCol<'a>,
    shadow_reference: StrCol<'a>,
    observed_outcome: StrCol<'a>,
}

impl<'a> Cols<'a> {
    pub fn new(batch: &'a RecordBatch, file: &Path) -> Result<Self> {
        let c = |n: &str| batch.column_by_name(n);
        Ok(Self {
            id: StrCol::new(c("id"), "id", file)?,
            at: AtCol::new(c("at"), file)?,
            point: StrCol::new(c("point"), "point", file)?,
            model: StrCol::new(c("model"), "model", file)?,
            candidates: ListCol::new(c("candidates").context("candidates column checked")?, file)?,
            result_kind: StrCol::new(c("result_kind"), "result_kind", file)?,
            result_id: StrCol::new(c("result_id"), "result_id", file)?,
            confidence: F64Col::new(c("confidence"), "confidence", file)?,
            validation: StrCol::new(c("validation"), "validation", file)?,
            fallback_used: BoolCol::new(c("fallback_used"), "fallback_used", file)?,
            fallback_to: StrCol::new(c("fallback_to"), "fallback_to", file)?,
            fallback_reason: StrCol::new(c("fallback_reason"), "fallback_reason", file)?,
            outcome_status: StrCol::new(c("outcome_status"), "outcome_status", file)?,
            outcome_duration_ms: IntCol::new(
                c("outcome_duration_ms"),
                "outcome_duration_ms",
                file,
            )?,
            outcome_retries: IntCol::new(c("outcome_retries"), "outcome_retries", file)?,
            shadow_reference: StrCol::new(c("shadow_reference"), "shadow_reference", file)?,
            observed_outcome: StrCol::new(c("observed_outcome"), "observed_outcome", file)?,
        })
    }

    /// The row as a JSON object of its flattened values (for the quarantine).
    pub fn raw_row(&self, i: usize) -> Vec<u8> {
        let mut m = Map::new();
        let s = |v: Option<&str>| v.map_or(Value::Null, |s| Value::String(s.to_string()));
        m.insert("id".into(), s(self.id.get(i)));
        let mut at = String::new();
        m.insert("at".into(), s(self.at.get(i, &mut at).map(|_| at.as_str())));
        m.insert("point".into(), s(self.point.get(i)));
        m.insert("model".into(), s(self.model.get(i)));
        m.insert(
            "candidates".into(),
            match self.candidates.len(i) {
                None => Value::Null,
                Some(n) => Value::Array((0..n).map(|k| s(self.candidates.item(i, k))).collect()),
            },
        );
        m.insert("result_kind".into(), s(self.result_kind.get(i)));
        m.insert("result_id".into(), s(self.result_id.get(i)));
        m.insert(
            "confidence".into(),
            match self.confidence.get(i) {
                None => Value::Null,
                Some(c) => serde_json::Number::from_f64(c)
                    .map_or_else(|| json!(c.to_string()), Value::Number),
            },
        );
        m.insert("validation".into(), s(self.validation.get(i)));
        m.insert(
            "fallback_used".into(),
            self.fallback_used.get(i).map_or(Value::Null, Value::Bool),
        );
        m.insert("fallback_to".into(), s(self.fallback_to.get(i)));
        m.insert("fallback_reason".into(), s(self.fallback_reason.get(i)));
        m.insert("outcome_status".into(), s(self.outcome_status.get(i)));
        let int = |v: Option<i128>| match v {
            None => Value::Null,
            Some(v) => i64::try_from(v).map_or_else(|_| json!(v.to_string()), |v| json!(v)),
        };
        m.insert(
            "outcome_duration_ms".into(),
            int(self.outcome_duration_ms.get(i)),
        );
        m.insert("outcome_retries".into(), int(self.outcome_retries.get(i)));
        m.insert("shadow_reference".into(), s(self.shadow_reference.get(i)));
        m.insert("observed_outcome".into(), s(self.observed_outcome.get(i)));
        serde_json::to_vec(&Value::Object(m)).expect("a JSON object serialises")
    }
}

/// Fill `r` (reusing its allocations) from row `i`, through the one rule set
/// ([`Flat::fill`]) JSON Lines records go through too; `at_buf` holds a timestamp's text.
pub(super) fn fill(
    cols: &Cols<'_>,
    i: usize,
    r: &mut Receipt,
    at_buf: &mut String,
    patterns: &OutcomePatterns,
) -> Result<(), FieldError> {
    let at_is_timestamp = cols.at.get(i, at_buf);
    let flat = Flat {
        id: cols.id.get(i),
        at: at_is_timestamp.map(|_| at_buf.as_str()),
        at_is_timestamp: at_is_timestamp == Some(true),
        point: cols.point.get(i),
        model: cols.model.get(i),
        result_kind: cols.result_kind.get(i),
        result_id: cols.result_id.get(i),
        confidence: cols.confidence.get(i),
        validation: cols.validation.get(i),
        fallback_used: cols.fallback_used.get(i),
        fallback_to: cols.fallback_to.get(i),
        fallback_reason: cols.fallback_reason.get(i),
        outcome_status: cols.outcome_status.get(i),
        duration_ms: cols.outcome_duration_ms.get(i),
        retries: cols.outcome_retries.get(i),
        shadow_reference: cols.shadow_reference.get(i),
        observed_outcome: cols.observed_outcome.get(i),
    };
    let candidates = |out: &mut Vec<String>| {
        let n = cols
            .candidates
            .len(i)
            .ok_or_else(|| FieldError::new("candidates", "missing"))?;
        out.truncate(n);
        for k in 0..n {
            let c = cols
                .candidates
                .item(i, k)
                .ok_or_else(|| FieldError::new("candidates", format!("item {} is null", k + 1)))?;
            match out.get_mut(k) {
                Some(d) => {
                    d.clear();
                    d.push_str(c);
                }
                None => out.push(c.to_string()),
            }
        }
        Ok(())
    };
    flat.fill(&PARQUET_NAMES, r, candidates, patterns)
}

pub(super) fn empty_receipt() -> Receipt {
    Receipt {
        id: String::new(),
        at: String::new(),
        point: String::new(),
        model: None,
        candidates: Vec::new(),
        result: ReceiptResult::Abstain,
        validation: Validation::Accepted,
        fallback: None,
        outcome: None,
        shadow: None,
        observed_outcome: None,
    }
}
