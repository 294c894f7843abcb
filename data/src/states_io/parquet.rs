//! Parquet states files: read batch by batch (memory bounded by one batch and one page per
//! column, whatever the file's size), written with zstd in bounded row groups.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

use super::arrow::{STATES_SCHEMA_ID, batch_to_states, state_schema, states_to_batch};
use super::{BadRow, FieldError, Raw, ReadItem, Row};
use crate::atomic::AtomicFile;
use crate::state::State;

/// Rows decoded at a time when reading.
pub(super) const READ_BATCH_ROWS: usize = 1024;
/// Rows buffered before they are encoded when writing.
const WRITE_BATCH_ROWS: usize = 4096;
/// A row group closes at this many rows...
pub const ROW_GROUP_ROWS: usize = 64 * 1024;
/// ... or at about this many encoded bytes, whichever comes first (long contexts).
pub const ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;

/// Run a parquet-rs call on a file's bytes, turning a panic into an error (callers add the file).
/// parquet-rs 60 panics on some corrupt files instead of returning an error (found by
/// `decision-fuzz states-parquet`: a column chunk whose offset or length is negative in the
/// footer, definition levels that run past their page); a user's bad file must get a message
/// and an exit code, not an abort. Whatever the reader had decoded is dropped with it.
pub(crate) fn guard<T>(f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let why = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        anyhow::anyhow!("corrupt Parquet data (the Parquet decoder failed: {why})")
    })
}

pub(super) struct ParquetRows {
    file: Arc<PathBuf>,
    batches: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    parsed: VecDeque<Result<State, Vec<FieldError>>>,
    /// Index within `batch` of the next row in `parsed`.
    index: usize,
    /// Rows of the file before `batch`.
    before: u64,
}

impl ParquetRows {
    pub(super) fn open(file: Arc<PathBuf>) -> Result<ParquetRows> {
        let f =
            File::open(file.as_path()).with_context(|| format!("opening {}", file.display()))?;
        let unreadable = || format!("{}: not a readable Parquet file", file.display());
        let builder = guard(|| ParquetRecordBatchReaderBuilder::try_new(f))
            .and_then(|r| Ok(r?))
            .with_context(unreadable)?;
        let pages =
            File::open(file.as_path()).with_context(|| format!("opening {}", file.display()))?;
        crate::parquet_pages::check_pages(&pages, builder.metadata(), None)
            .with_context(unreadable)?;
        let batches = guard(|| builder.with_batch_size(READ_BATCH_ROWS).build())
            .and_then(|r| Ok(r?))
            .with_context(unreadable)?;
        Ok(ParquetRows {
            file,
            batches,
            batch: None,
            parsed: VecDeque::new(),
            index: 0,
            before: 0,
        })
    }
}

impl Iterator for ParquetRows {
    type Item = ReadItem;

    fn next(&mut self) -> Option<ReadItem> {
        while self.parsed.is_empty() {
            if let Some(b) = self.batch.take() {
                self.before += b.num_rows() as u64;
            }
            // After a panic the reader's state is unknown: the caller stops at the error.
            let next = match guard(|| self.batches.next()) {
                Ok(next) => next?,
                Err(e) => {
                    return Some(Err(e.context(format!(
                        "{}: reading rows after row {}",
                        self.file.display(),
                        self.before
                    ))));
                }
            };
            match next {
                Ok(batch) => {
                    self.parsed = batch_to_states(&batch).into();
                    self.index = 0;
                    self.batch = Some(batch);
                }
                Err(e) => {
                    return Some(Err(anyhow::Error::new(e).context(format!(
                        "{}: reading rows after row {}",
                        self.file.display(),
                        self.before
                    ))));
                }
            }
        }
        let parsed = self.parsed.pop_front()?;
        let batch = self
            .batch
            .clone()
            .expect("a batch is loaded while rows remain");
        let i = self.index;
        self.index += 1;
        let row = self.before + i as u64 + 1;
        let raw = Raw::Batch(batch, i);
        Some(Ok(match parsed {
            Ok(state) => Ok(Row {
                file: self.file.clone(),
                row,
                value: state,
                raw,
            }),
            Err(errors) => Err(BadRow {
                file: self.file.clone(),
                row,
                errors,
                raw,
            }),
        }))
    }
}

/// Rows in a Parquet file, from its footer.
pub(super) fn row_count(path: &Path) -> Result<u64> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = guard(|| SerializedFileReader::new(f))
        .and_then(|r| Ok(r?))
        .with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
    Ok(reader.metadata().file_metadata().num_rows().max(0) as u64)
}

pub(super) struct ParquetStateWriter {
    writer: ArrowWriter<AtomicFile>,
    buffer: Vec<State>,
}

impl ParquetStateWriter {
    pub(super) fn create(path: &Path, row_group_rows: usize) -> Result<ParquetStateWriter> {
        let file = AtomicFile::create(path)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_max_row_group_row_count(Some(row_group_rows))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .set_key_value_metadata(Some(vec![KeyValue::new(
                "schema".into(),
                STATES_SCHEMA_ID.to_string(),
            )]))
            .build();
        let writer = ArrowWriter::try_new(file, state_schema(), Some(props))
            .with_context(|| format!("starting Parquet file {}", path.display()))?;
        Ok(ParquetStateWriter {
            writer,
            buffer: Vec::with_capacity(WRITE_BATCH_ROWS),
        })
    }

    pub(super) fn write(&mut self, state: &State) -> Result<()> {
        self.buffer.push(state.clone());
        if self.buffer.len() >= WRITE_BATCH_ROWS {
            self.flush_buffer()?;
        }
        Ok(())
    }

    fn flush_buffer(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let batch = states_to_batch(&self.buffer)?;
        self.writer.write(&batch)?;
        self.buffer.clear();
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<()> {
        self.flush_buffer()?;
        let file = self.writer.into_inner().context("finishing Parquet file")?;
        file.commit()
    }
}
