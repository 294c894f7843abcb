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

use bytes::{Buf, Bytes};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::ChunkReader;

use super::OutcomePatterns;
use super::columns::{Cols, empty_receipt, fill};
use super::dedup::{Seen, SeenIds, conflict_error};
use super::rules::FieldError;
use crate::atomic::AtomicFile;
use crate::states_io::{BadRow, guard_parquet};
use crate::{Receipt, ReceiptResult};

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

    /// Where the column chunks the read decodes of row group `rg` lie in the file:
    /// `start..end` (empty when the footer names none; a corrupt footer may name any range,
    /// which reading then refuses).
    pub fn span(&self, rg: usize) -> (u64, u64) {
        let g = self.metadata.metadata().row_group(rg);
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for (k, c) in g.columns().iter().enumerate() {
            if !self.mask.leaf_included(k) {
                continue;
            }
            let (at, len) = c.byte_range();
            lo = lo.min(at);
            hi = hi.max(at.saturating_add(len));
        }
        if lo > hi { (0, 0) } else { (lo, hi) }
    }

    /// The record batches of row group `rg`, read from `source` (the file, or the row group's
    /// bytes already in memory).
    pub fn batches<R: ChunkReader + 'static>(
        &self,
        source: R,
        rg: usize,
        path: &Path,
    ) -> Result<Batches> {
        let builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(source, self.metadata.clone())
                .with_projection(self.mask.clone())
                .with_row_groups(vec![rg])
                .with_batch_size(BATCH_ROWS);
        let reader = guard_parquet(|| builder.build())
            .and_then(|r| Ok(r?))
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(Batches {
            reader,
            path: path.to_path_buf(),
        })
    }

    /// Read row group `rg` of `path`, whose rows follow `before` others, calling `f` for each
    /// row in order with its 1-based row number in the file, the receipt (through the one rule
    /// set, [`Flat::fill`]) or the first bad field, and a way to get the row's bytes as the
    /// quarantine keeps them.
    ///
    /// [`Flat::fill`]: super::rules::Flat::fill
    pub fn visit_row_group(
        &self,
        path: &Path,
        rg: usize,
        before: u64,
        patterns: &OutcomePatterns,
        f: &mut RowVisitor<'_>,
    ) -> Result<()> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut row = before;
        let mut r = empty_receipt();
        let mut at_buf = String::new();
        for batch in self.batches(file, rg, path)? {
            let batch = batch?;
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

/// The record batches of one row group, each read with parquet-rs's panics turned into errors.
pub(super) struct Batches {
    reader: ParquetRecordBatchReader,
    path: std::path::PathBuf,
}

impl Iterator for Batches {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        let path = &self.path;
        match guard_parquet(|| self.reader.next()) {
            Err(e) => Some(Err(e.context(format!("reading {}", path.display())))),
            Ok(None) => None,
            Ok(Some(b)) => Some(b.with_context(|| format!("reading {}", path.display()))),
        }
    }
}

/// One row group's bytes, read ahead (and hashed) in file order: parquet-rs reads its column
/// chunks from memory by their offsets in the file.
pub(super) struct RowGroupBytes {
    /// The file offset of `data[0]`.
    pub start: u64,
    pub data: Bytes,
    /// The file's length.
    pub file_len: u64,
}

impl RowGroupBytes {
    fn slice(&self, at: u64, len: u64) -> parquet::errors::Result<Bytes> {
        let lo = at.checked_sub(self.start);
        match lo {
            Some(lo) if lo.saturating_add(len) <= self.data.len() as u64 => {
                Ok(self.data.slice(lo as usize..(lo + len) as usize))
            }
            _ => Err(parquet::errors::ParquetError::EOF(format!(
                "{len} bytes at offset {at} lie outside the row group's {} bytes at {}",
                self.data.len(),
                self.start
            ))),
        }
    }
}

impl parquet::file::reader::Length for RowGroupBytes {
    fn len(&self) -> u64 {
        self.file_len
    }
}

impl ChunkReader for RowGroupBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let rest = (self.start + self.data.len() as u64).saturating_sub(start);
        Ok(self.slice(start, rest)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length as u64)
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
