//! Receipts in Parquet, with the flattened columns of contracts section 3:
//!
//! `id`, `at`, `point`, `model`, `candidates` (list of strings), `result_kind` (`pick` /
//! `abstain`), `result_id`, `confidence`, `validation`, `fallback_used`, `fallback_to`,
//! `fallback_reason`, `outcome_status`, `outcome_duration_ms`, `outcome_retries`,
//! `shadow_reference`, and (added) `observed_outcome`, keel's free-text outcome.
//!
//! The reader needs `id`, `at`, `point`, `candidates`, `result_kind` and `validation`; the other
//! columns may be absent (all null). It accepts the string, large-string and string-view
//! encodings other writers use, a timestamp column for `at`, and 32-bit numbers. A bad row is
//! quarantined as one JSON object of its flattened values, as read.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, SecondsFormat};
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::{Map, Value, json};

use super::OutcomePatterns;
use super::dedup::{Seen, SeenIds, conflict_error};
use super::rules::{FieldError, Flat, PARQUET_NAMES};
use crate::atomic::AtomicFile;
use crate::states_io::{BadRow, guard_parquet};
use crate::{Receipt, ReceiptResult, Validation};

const COLUMNS: [&str; 17] = [
    "id",
    "at",
    "point",
    "model",
    "candidates",
    "result_kind",
    "result_id",
    "confidence",
    "validation",
    "fallback_used",
    "fallback_to",
    "fallback_reason",
    "outcome_status",
    "outcome_duration_ms",
    "outcome_retries",
    "shadow_reference",
    "observed_outcome",
];
const REQUIRED: [&str; 6] = [
    "id",
    "at",
    "point",
    "candidates",
    "result_kind",
    "validation",
];

/// Rows per record batch and per row group when writing.
const BATCH_ROWS: usize = 65_536;
const ROW_GROUP_ROWS: usize = 262_144;

/// The Arrow schema of a receipts file.
pub fn receipt_schema() -> SchemaRef {
    let s = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        s("id", false),
        s("at", false),
        s("point", false),
        s("model", true),
        Field::new(
            "candidates",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
        s("result_kind", false),
        s("result_id", true),
        Field::new("confidence", DataType::Float64, true),
        s("validation", false),
        Field::new("fallback_used", DataType::Boolean, true),
        s("fallback_to", true),
        s("fallback_reason", true),
        s("outcome_status", true),
        Field::new("outcome_duration_ms", DataType::Int64, true),
        Field::new("outcome_retries", DataType::Int64, true),
        s("shadow_reference", true),
        s("observed_outcome", true),
    ]))
}

struct Builders {
    id: StringBuilder,
    at: StringBuilder,
    point: StringBuilder,
    model: StringBuilder,
    candidates: ListBuilder<StringBuilder>,
    result_kind: StringBuilder,
    result_id: StringBuilder,
    confidence: Float64Builder,
    validation: StringBuilder,
    fallback_used: BooleanBuilder,
    fallback_to: StringBuilder,
    fallback_reason: StringBuilder,
    outcome_status: StringBuilder,
    outcome_duration_ms: Int64Builder,
    outcome_retries: Int64Builder,
    shadow_reference: StringBuilder,
    observed_outcome: StringBuilder,
    rows: usize,
}

impl Builders {
    fn new() -> Self {
        Self {
            id: StringBuilder::new(),
            at: StringBuilder::new(),
            point: StringBuilder::new(),
            model: StringBuilder::new(),
            candidates: ListBuilder::new(StringBuilder::new()),
            result_kind: StringBuilder::new(),
            result_id: StringBuilder::new(),
            confidence: Float64Builder::new(),
            validation: StringBuilder::new(),
            fallback_used: BooleanBuilder::new(),
            fallback_to: StringBuilder::new(),
            fallback_reason: StringBuilder::new(),
            outcome_status: StringBuilder::new(),
            outcome_duration_ms: Int64Builder::new(),
            outcome_retries: Int64Builder::new(),
            shadow_reference: StringBuilder::new(),
            observed_outcome: StringBuilder::new(),
            rows: 0,
        }
    }

    fn push(&mut self, r: &Receipt) {
        self.id.append_value(&r.id);
        self.at.append_value(&r.at);
        self.point.append_value(&r.point);
        self.model.append_option(r.model.as_deref());
        for c in &r.candidates {
            self.candidates.values().append_value(c);
        }
        self.candidates.append(true);
        match &r.result {
            ReceiptResult::Pick { id, confidence } => {
                self.result_kind.append_value("pick");
                self.result_id.append_value(id);
                self.confidence.append_value(*confidence);
            }
            ReceiptResult::Abstain => {
                self.result_kind.append_value("abstain");
                self.result_id.append_null();
                self.confidence.append_null();
            }
        }
        self.validation.append_value(r.validation.as_str());
        let f = r.fallback.as_ref();
        self.fallback_used.append_option(f.map(|f| f.used));
        self.fallback_to
            .append_option(f.and_then(|f| f.to.as_deref()));
        self.fallback_reason
            .append_option(f.and_then(|f| f.reason.as_deref()));
        let o = r.outcome.as_ref();
        self.outcome_status
            .append_option(o.map(|o| o.status.as_str()));
        self.outcome_duration_ms
            .append_option(o.and_then(|o| o.duration_ms).map(|d| d as i64));
        self.outcome_retries
            .append_option(o.and_then(|o| o.retries).map(i64::from));
        self.shadow_reference
            .append_option(r.shadow.as_ref().map(|s| s.reference.as_str()));
        self.observed_outcome
            .append_option(r.observed_outcome.as_deref());
        self.rows += 1;
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch> {
        self.rows = 0;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.id.finish()),
            Arc::new(self.at.finish()),
            Arc::new(self.point.finish()),
            Arc::new(self.model.finish()),
            Arc::new(self.candidates.finish()),
            Arc::new(self.result_kind.finish()),
            Arc::new(self.result_id.finish()),
            Arc::new(self.confidence.finish()),
            Arc::new(self.validation.finish()),
            Arc::new(self.fallback_used.finish()),
            Arc::new(self.fallback_to.finish()),
            Arc::new(self.fallback_reason.finish()),
            Arc::new(self.outcome_status.finish()),
            Arc::new(self.outcome_duration_ms.finish()),
            Arc::new(self.outcome_retries.finish()),
            Arc::new(self.shadow_reference.finish()),
            Arc::new(self.observed_outcome.finish()),
        ];
        Ok(RecordBatch::try_new(schema.clone(), cols)?)
    }
}

/// Streams receipts into a zstd-compressed Parquet file, published atomically on [`finish`].
///
/// [`finish`]: ReceiptParquetWriter::finish
pub struct ReceiptParquetWriter {
    writer: ArrowWriter<AtomicFile>,
    builders: Builders,
    schema: SchemaRef,
    rows: u64,
}

impl ReceiptParquetWriter {
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let schema = receipt_schema();
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        let file = AtomicFile::create(path)?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
        Ok(Self {
            writer,
            builders: Builders::new(),
            schema,
            rows: 0,
        })
    }

    pub fn write(&mut self, r: &Receipt) -> Result<()> {
        self.builders.push(r);
        self.rows += 1;
        if self.builders.rows >= BATCH_ROWS {
            let batch = self.builders.finish(&self.schema)?;
            self.writer.write(&batch)?;
        }
        Ok(())
    }

    /// Flush, close and publish the file; returns the number of rows written.
    pub fn finish(mut self) -> Result<u64> {
        if self.builders.rows > 0 {
            let batch = self.builders.finish(&self.schema)?;
            self.writer.write(&batch)?;
        }
        let file = self.writer.into_inner()?;
        file.commit()?;
        Ok(self.rows)
    }
}

/// Write receipts to a Parquet file atomically.
pub fn write_receipts_parquet<'a>(
    path: impl AsRef<Path>,
    receipts: impl IntoIterator<Item = &'a Receipt>,
) -> Result<u64> {
    let mut w = ReceiptParquetWriter::create(path)?;
    for r in receipts {
        w.write(r)?;
    }
    w.finish()
}

// ---------------------------------------------------------------- reading

enum StrCol<'a> {
    Utf8(&'a arrow_array::StringArray),
    Large(&'a arrow_array::LargeStringArray),
    View(&'a arrow_array::StringViewArray),
    /// Dictionary-encoded strings (how the low-cardinality columns are decoded, see
    /// [`ParquetPlan::open`], and how pandas' categoricals arrive): the row's key into `values`.
    Dict {
        nulls: Option<arrow_buffer::NullBuffer>,
        keys: Vec<usize>,
        /// Each dictionary value, looked up once per batch.
        values: Vec<Option<&'a str>>,
    },
    Missing,
}

impl<'a> StrCol<'a> {
    fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
        let Some(a) = a else {
            return Ok(StrCol::Missing);
        };
        Ok(match a.data_type() {
            DataType::Utf8 => StrCol::Utf8(a.as_string::<i32>()),
            DataType::LargeUtf8 => StrCol::Large(a.as_string::<i64>()),
            DataType::Utf8View => StrCol::View(a.as_string_view()),
            DataType::Dictionary(_, v)
                if matches!(
                    **v,
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) =>
            {
                let d = a.as_any_dictionary();
                if d.values().is_empty() {
                    // no values: every key is null
                    StrCol::Missing
                } else {
                    let values = StrCol::new(Some(d.values()), name, file)?;
                    StrCol::Dict {
                        nulls: a.logical_nulls(),
                        keys: d.normalized_keys(),
                        values: (0..d.values().len()).map(|k| values.get(k)).collect(),
                    }
                }
            }
            DataType::Null => StrCol::Missing,
            t => bail!(
                "{}: column `{name}` has type {t}, expected a string column",
                file.display()
            ),
        })
    }

    fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            StrCol::Utf8(a) => a.is_valid(i).then(|| a.value(i)),
            StrCol::Large(a) => a.is_valid(i).then(|| a.value(i)),
            StrCol::View(a) => a.is_valid(i).then(|| a.value(i)),
            StrCol::Dict {
                nulls,
                keys,
                values,
            } => match nulls {
                Some(n) if n.is_null(i) => None,
                _ => values[keys[i]],
            },
            StrCol::Missing => None,
        }
    }
}

/// `at` may be a string or a timestamp.
enum AtCol<'a> {
    Str(StrCol<'a>),
    Ts { array: &'a ArrayRef, unit: TimeUnit },
}

impl<'a> AtCol<'a> {
    fn new(a: Option<&'a ArrayRef>, file: &Path) -> Result<Self> {
        match a.map(|a| a.data_type()) {
            Some(DataType::Timestamp(unit, _)) => Ok(AtCol::Ts {
                array: a.expect("checked"),
                unit: *unit,
            }),
            _ => Ok(AtCol::Str(StrCol::new(a, "at", file)?)),
        }
    }

    /// The RFC 3339 text, and whether it came from a timestamp (then it is valid by type).
    fn get(&self, i: usize, buf: &mut String) -> Option<bool> {
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

enum F64Col<'a> {
    F64(&'a arrow_array::Float64Array),
    F32(&'a arrow_array::Float32Array),
    Missing,
}

impl<'a> F64Col<'a> {
    fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
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

    fn get(&self, i: usize) -> Option<f64> {
        match self {
            F64Col::F64(a) => a.is_valid(i).then(|| a.value(i)),
            F64Col::F32(a) => a.is_valid(i).then(|| f64::from(a.value(i))),
            F64Col::Missing => None,
        }
    }
}

enum IntCol<'a> {
    I64(&'a arrow_array::Int64Array),
    I32(&'a arrow_array::Int32Array),
    U64(&'a arrow_array::UInt64Array),
    U32(&'a arrow_array::UInt32Array),
    Missing,
}

impl<'a> IntCol<'a> {
    fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
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

    fn get(&self, i: usize) -> Option<i128> {
        match self {
            IntCol::I64(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::I32(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::U64(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::U32(a) => a.is_valid(i).then(|| i128::from(a.value(i))),
            IntCol::Missing => None,
        }
    }
}

enum BoolCol<'a> {
    B(&'a BooleanArray),
    Missing,
}

impl<'a> BoolCol<'a> {
    fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
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

    fn get(&self, i: usize) -> Option<bool> {
        match self {
            BoolCol::B(a) => a.is_valid(i).then(|| a.value(i)),
            BoolCol::Missing => None,
        }
    }
}

/// A list of strings (`candidates`).
struct ListCol<'a> {
    offsets: Vec<usize>,
    valid: &'a dyn Array,
    values: StrCol<'a>,
}

impl<'a> ListCol<'a> {
    fn new(a: &'a ArrayRef, file: &Path) -> Result<Self> {
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

    fn len(&self, i: usize) -> Option<usize> {
        self.valid
            .is_valid(i)
            .then(|| self.offsets[i + 1] - self.offsets[i])
    }

    fn item(&self, i: usize, k: usize) -> Option<&'a str> {
        self.values.get(self.offsets[i] + k)
    }
}

struct Cols<'a> {
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
    fn new(batch: &'a RecordBatch, file: &Path) -> Result<Self> {
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
    fn raw_row(&self, i: usize) -> Vec<u8> {
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
fn fill(
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

/// Called per row by [`ParquetPlan::visit_row_group`]: the row's 1-based number, its receipt or
/// first bad field, and a way to get its bytes as the quarantine keeps them.
pub(super) type RowVisitor<'a> =
    dyn FnMut(u64, Result<&Receipt, FieldError>, &dyn Fn() -> Vec<u8>) -> Result<()> + 'a;

/// Columns whose values repeat (names, enums, candidate ids), read as dictionaries.
const DICTIONARY: [&str; 11] = [
    "point",
    "model",
    "candidates",
    "result_kind",
    "result_id",
    "validation",
    "fallback_to",
    "fallback_reason",
    "outcome_status",
    "shadow_reference",
    "observed_outcome",
];

/// The file's schema with [`DICTIONARY`]'s plain string columns (and lists of them) as
/// dictionaries; `None` when there is none to change.
fn dictionary_hint(schema: &SchemaRef) -> Option<SchemaRef> {
    let dict = || DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let mut changed = false;
    let fields: Vec<Arc<Field>> = schema
        .fields()
        .iter()
        .map(|f| {
            if !DICTIONARY.contains(&f.name().as_str()) {
                return f.clone();
            }
            let t = match f.data_type() {
                DataType::Utf8 => dict(),
                DataType::List(item) if item.data_type() == &DataType::Utf8 => {
                    DataType::List(Arc::new(item.as_ref().clone().with_data_type(dict())))
                }
                _ => return f.clone(),
            };
            changed = true;
            Arc::new(f.as_ref().clone().with_data_type(t))
        })
        .collect();
    changed.then(|| Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())))
}

/// A receipts Parquet file checked and opened for reading one row group at a time (from any
/// thread): its footer, the projection of the receipt columns, and where each row group starts.
pub(super) struct ParquetPlan {
    metadata: ArrowReaderMetadata,
    mask: ProjectionMask,
    /// Per row group: the 0-based index of its first row in the file, its rows, its compressed
    /// bytes.
    pub row_groups: Vec<(u64, u64, u64)>,
}

impl ParquetPlan {
    /// Check the footer, the required columns and every page header (see `parquet_pages`).
    pub fn open(path: &Path) -> Result<ParquetPlan> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let metadata = guard_parquet(|| ArrowReaderMetadata::load(&file, Default::default()))
            .and_then(|r| Ok(r?))
            .with_context(|| format!("reading {} as Parquet", path.display()))?;
        // The low-cardinality string columns are decoded as dictionaries: each row is then a key
        // into the column chunk's few values, instead of a copy of its string.
        let metadata = match dictionary_hint(metadata.schema()) {
            Some(hint) => ArrowReaderMetadata::try_new(
                metadata.metadata().clone(),
                ArrowReaderOptions::new().with_schema(hint),
            )
            .unwrap_or(metadata),
            None => metadata,
        };
        let arrow_schema = metadata.schema().clone();
        for name in REQUIRED {
            if arrow_schema.field_with_name(name).is_err() {
                bail!(
                    "{}: column `{name}` is missing (a receipts file needs {})",
                    path.display(),
                    REQUIRED.join(", ")
                );
            }
        }
        let roots: Vec<usize> = arrow_schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| COLUMNS.contains(&f.name().as_str()))
            .map(|(i, _)| i)
            .collect();
        let mask = ProjectionMask::roots(metadata.parquet_schema(), roots);
        let md = metadata.metadata();
        crate::parquet_pages::check_pages(&file, md, None)
            .with_context(|| format!("reading {} as Parquet", path.display()))?;
        let mut first = 0u64;
        let row_groups = md
            .row_groups()
            .iter()
            .map(|g| {
                let rows = g.num_rows().max(0) as u64;
                let at = first;
                first += rows;
                (at, rows, g.compressed_size().max(0) as u64)
            })
            .collect();
        Ok(ParquetPlan {
            metadata,
            mask,
            row_groups,
        })
    }

    /// The rows the footer claims (a claim: a corrupt footer may say anything).
    pub fn claimed_rows(&self) -> u64 {
        self.metadata.metadata().file_metadata().num_rows().max(0) as u64
    }

    /// Read row group `rg` of `path`, whose rows follow `before` others, calling `f` for each
    /// row in order with its 1-based row number in the file, the receipt (through the one rule set, [`Flat::fill`]) or the first
    /// bad field, and a way to get the row's bytes as the quarantine keeps them.
    pub fn visit_row_group(
        &self,
        path: &Path,
        rg: usize,
        before: u64,
        patterns: &OutcomePatterns,
        f: &mut RowVisitor<'_>,
    ) -> Result<()> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                .with_projection(self.mask.clone())
                .with_row_groups(vec![rg])
                .with_batch_size(BATCH_ROWS);
        let mut reader = guard_parquet(|| builder.build())
            .and_then(|r| Ok(r?))
            .with_context(|| format!("reading {}", path.display()))?;
        let mut row = before;
        let mut r = empty_receipt();
        let mut at_buf = String::new();
        while let Some(batch) = guard_parquet(|| reader.next())
            .with_context(|| format!("reading {}", path.display()))?
        {
            let batch = batch.with_context(|| format!("reading {}", path.display()))?;
            let cols = Cols::new(&batch, path)?;
            for i in 0..batch.num_rows() {
                row += 1;
                let raw = || cols.raw_row(i);
                match fill(&cols, i, &mut r, &mut at_buf, patterns) {
                    Ok(()) => f(row, Ok(&r), &raw)?,
                    Err(e) => {
                        f(row, Err(e), &raw)?;
                        r = empty_receipt();
                    }
                }
            }
        }
        Ok(())
    }
}

/// What [`read_parquet`] counted.
pub(super) struct ParquetRead {
    /// Rows read, duplicates included.
    pub rows: u64,
    /// Bad rows, conflicting duplicates included.
    pub bad: u64,
    /// Rows dropped as exact duplicates of an earlier record.
    pub duplicates: u64,
}

/// Read a Parquet receipts file, calling `f` for every row in order (row numbers 1-based). With `seen`, a row
/// whose id was read before is dropped (same body) or bad (another body), see [`SeenIds`].
pub(super) fn read_parquet(
    path: &Path,
    plan: &ParquetPlan,
    patterns: &OutcomePatterns,
    mut seen: Option<&mut SeenIds>,
    progress: &mut dyn FnMut(u64),
    f: &mut dyn FnMut(Result<&Receipt, &BadRow>) -> Result<()>,
) -> Result<ParquetRead> {
    let shared_path = Arc::new(path.to_path_buf());
    let file_len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    // The footer's row count is the file's claim, not a fact: a corrupt one claiming 2^40 rows
    // asked for a 37 TB table (found with `decision-fuzz receipts-parquet`). No more than one id
    // per byte of the file is reserved up front; the table grows past that if it must.
    if let Some(s) = seen.as_deref_mut() {
        s.reserve_first(plan.claimed_rows().min(file_len) as usize);
    }
    let mut n = ParquetRead {
        rows: 0,
        bad: 0,
        duplicates: 0,
    };
    for rg in 0..plan.row_groups.len() {
        let before = n.rows;
        plan.visit_row_group(path, rg, before, patterns, &mut |row, item, raw| {
            n.rows += 1;
            match item {
                Ok(r) => match seen.as_deref_mut().map_or(Seen::New, |s| s.check(r)) {
                    Seen::New => f(Ok(r))?,
                    Seen::Duplicate => n.duplicates += 1,
                    Seen::Conflict => {
                        n.bad += 1;
                        let b = BadRow::from_line(
                            shared_path.clone(),
                            row,
                            raw(),
                            vec![conflict_error(r)],
                        );
                        f(Err(&b))?;
                    }
                },
                Err(e) => {
                    n.bad += 1;
                    let b = BadRow::from_line(shared_path.clone(), row, raw(), vec![e]);
                    f(Err(&b))?;
                }
            }
            Ok(())
        })?;
        progress(n.rows - before);
    }
    Ok(n)
}
