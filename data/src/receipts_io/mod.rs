//! Reading and writing receipts (contracts section 3).
//!
//! Inputs are JSON Lines (`.jsonl`, `.json`; each line either the contract's harness
//! record or keel's `DecisionEvent`, detected per line), Parquet (`.parquet`, flattened columns),
//! or a folder holding such files (its shards, read in name order; hidden files are skipped).
//! Reading streams: one line or one record batch at a time, whatever the file size.
//!
//! A record that cannot be read (unparsable JSON, a missing field, a confidence outside
//! [0, 1], an unknown enum value, a pick whose id was not offered) does not stop the read: it
//! reaches the caller as a [`BadRow`] (the same type the states reader uses) naming file,
//! 1-based row, field and reason, with the record's bytes for [`crate::Quarantine`]: a JSON
//! Lines line exactly as read, a Parquet row as one JSON object of its flattened values. Only I/O failures and files that are not receipts at all
//! (a Parquet file without the required columns) are errors.

mod batch_rules;
mod columns;
mod dedup;
mod line;
mod outcome;
mod parquet_io;
mod rules;
mod scan;

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

pub use dedup::{Seen, SeenIds};
pub use line::{keel_stage_to_point, keel_validation};
pub use outcome::OutcomePatterns;
pub use parquet_io::{ReceiptParquetWriter, receipt_schema, write_receipts_parquet};
pub use scan::{Facts, Input, Tally, scan_unique_receipts};

use crate::Receipt;
use crate::atomic::AtomicFile;
use crate::states_io::{BadRow, Format, expand_paths};

/// Which shape a record had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The contract's harness record (JSON Lines).
    Contract,
    /// keel's `DecisionEvent` (JSON Lines).
    Keel,
    /// Flattened Parquet columns.
    Parquet,
}

#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// How free-text outcomes map to success / failure.
    pub outcome: OutcomePatterns,
    /// Show a progress bar on stderr when it is a terminal.
    pub progress: bool,
}

/// What a read saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadSummary {
    /// The files read, in order (folders expanded).
    pub files: Vec<PathBuf>,
    /// SHA-256 of the files' bytes concatenated in that order (`cat FILES | sha256sum`).
    pub sha256: String,
    /// Records read, good and bad (blank lines are not records), duplicates included.
    pub records: u64,
    pub bad: u64,
    /// Records dropped because a record with the same id and body came first (only
    /// [`for_each_unique_receipt`] looks; a same id with another body is bad instead).
    pub duplicates: u64,
    /// Torn last lines skipped (a file's last line with no newline that is not JSON).
    pub torn: u64,
    /// Good records by shape.
    pub contract: u64,
    pub keel: u64,
    pub parquet: u64,
}

impl ReadSummary {
    /// The count of good records of this shape.
    fn good_mut(&mut self, shape: Shape) -> &mut u64 {
        match shape {
            Shape::Contract => &mut self.contract,
            Shape::Keel => &mut self.keel,
            Shape::Parquet => &mut self.parquet,
        }
    }
}

/// The files behind `paths`: folders become their shards (`.parquet`, `.jsonl`, `.json`, in
/// subfolders too, path order, hidden files skipped; a partition folder naming a receipt column
/// is refused); an unknown extension is an error. (The states reader's rule, see
/// [`expand_paths`].)
pub fn receipt_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    // the Parquet shape's columns, as the schema we write names them, and the JSON shape's objects
    let schema = receipt_schema();
    expand_paths(paths, &|c| {
        schema.column_with_name(c).is_some()
            || ["result", "fallback", "outcome", "shadow"].contains(&c)
    })
}

/// Feeds every byte read into a hash.
struct Hashing<'h, R> {
    inner: R,
    hash: &'h mut Sha256,
    read: u64,
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// Read every record of every file in order, calling `f` with each good receipt or bad record.
/// An error returned by `f` stops the read and is returned.
pub fn for_each_receipt(
    paths: &[PathBuf],
    opts: &ReadOptions,
    f: impl FnMut(std::result::Result<&Receipt, &BadRow>) -> Result<()>,
) -> Result<ReadSummary> {
    read_all(paths, opts, None, f)
}

/// [`for_each_receipt`], counting each receipt id once (see [`SeenIds`]): a later record
/// with an id already read is dropped when its body is the same (counted in
/// [`ReadSummary::duplicates`]) and reaches `f` as a bad record (field `id`) when it is not.
pub fn for_each_unique_receipt(
    paths: &[PathBuf],
    opts: &ReadOptions,
    f: impl FnMut(std::result::Result<&Receipt, &BadRow>) -> Result<()>,
) -> Result<ReadSummary> {
    let mut seen = SeenIds::new();
    read_all(paths, opts, Some(&mut seen), f)
}

fn read_all(
    paths: &[PathBuf],
    opts: &ReadOptions,
    mut seen: Option<&mut SeenIds>,
    mut f: impl FnMut(std::result::Result<&Receipt, &BadRow>) -> Result<()>,
) -> Result<ReadSummary> {
    let files = receipt_files(paths)?;
    let total: u64 = files
        .iter()
        .map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let pb = if opts.progress {
        crate::progress::bar(Some(total), "bytes")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut hash = Sha256::new();
    let mut s = ReadSummary {
        files: files.clone(),
        ..ReadSummary::default()
    };
    for path in &files {
        let shared = Arc::new(path.clone());
        match Format::from_path(path)? {
            Format::Jsonl => {
                let file =
                    File::open(path).with_context(|| format!("opening {}", path.display()))?;
                let mut rd = BufReader::with_capacity(
                    1 << 20,
                    Hashing {
                        inner: file,
                        hash: &mut hash,
                        read: 0,
                    },
                );
                let mut buf = Vec::with_capacity(4096);
                let mut row = 0u64;
                let mut last_pos = 0u64;
                loop {
                    buf.clear();
                    let n = rd
                        .read_until(b'\n', &mut buf)
                        .with_context(|| format!("reading {}", path.display()))?;
                    if n == 0 {
                        break;
                    }
                    row += 1;
                    let complete = buf.last() == Some(&b'\n');
                    if complete {
                        buf.pop();
                    }
                    let (raw, item) = line::eval_line(&buf, row, complete, &opts.outcome);
                    match item {
                        line::Line::Blank => {}
                        line::Line::Torn => {
                            s.torn += 1;
                            line::warn_torn(path, row, raw.len());
                        }
                        line::Line::Good(r, shape) => {
                            s.records += 1;
                            match seen.as_deref_mut().map_or(Seen::New, |d| d.check(&r)) {
                                Seen::New => {
                                    *s.good_mut(shape) += 1;
                                    f(Ok(&r))?;
                                }
                                Seen::Duplicate => s.duplicates += 1,
                                Seen::Conflict => {
                                    s.bad += 1;
                                    let b = BadRow::from_line(
                                        shared.clone(),
                                        row,
                                        raw.to_vec(),
                                        vec![dedup::conflict_error(&r)],
                                    );
                                    f(Err(&b))?;
                                }
                            }
                        }
                        line::Line::Bad(e) => {
                            s.records += 1;
                            s.bad += 1;
                            f(Err(&line::bad(&shared, row, e, raw)))?;
                        }
                    }
                    if row.is_multiple_of(4096) {
                        let pos = rd.get_ref().read;
                        pb.inc(pos - last_pos);
                        last_pos = pos;
                    }
                }
                pb.inc(rd.get_ref().read - last_pos);
            }
            Format::Parquet => {
                let size = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                let plan = parquet_io::ParquetPlan::open(path)?;
                let nrows = plan.claimed_rows();
                let mut done = 0u64;
                let mut tick = |k: u64| {
                    let before = size * done / nrows.max(1);
                    done += k;
                    pb.inc(size * done / nrows.max(1) - before);
                };
                let mut good = 0u64;
                let read = parquet_io::read_parquet(
                    path,
                    &plan,
                    &opts.outcome,
                    seen.as_deref_mut(),
                    &mut tick,
                    &mut |item| {
                        if item.is_ok() {
                            good += 1;
                        }
                        f(item)
                    },
                )?;
                s.records += read.rows;
                s.bad += read.bad;
                s.duplicates += read.duplicates;
                s.parquet += good;
                let mut file =
                    File::open(path).with_context(|| format!("opening {}", path.display()))?;
                std::io::copy(&mut file, &mut hash)
                    .with_context(|| format!("hashing {}", path.display()))?;
            }
        }
    }
    pb.finish_and_clear();
    s.sha256 = hex_lower(&hash.finalize());
    Ok(s)
}

/// SHA-256 of the files' bytes concatenated in order.
pub fn sha256_of_files(files: &[PathBuf]) -> Result<String> {
    let mut hash = Sha256::new();
    for p in files {
        let mut file = File::open(p).with_context(|| format!("opening {}", p.display()))?;
        std::io::copy(&mut file, &mut hash).with_context(|| format!("hashing {}", p.display()))?;
    }
    Ok(hex_lower(&hash.finalize()))
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Read everything into memory (tests and small files).
pub fn read_receipts(
    paths: &[PathBuf],
    opts: &ReadOptions,
) -> Result<(Vec<Receipt>, Vec<BadRow>, ReadSummary)> {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    let summary = for_each_receipt(paths, opts, |item| {
        match item {
            Ok(r) => good.push(r.clone()),
            Err(b) => bad.push(b.clone()),
        }
        Ok(())
    })?;
    Ok((good, bad, summary))
}

/// Streams receipts as contract-shape JSON Lines, published atomically on `finish`.
pub struct ReceiptJsonlWriter {
    file: AtomicFile,
    rows: u64,
}

impl ReceiptJsonlWriter {
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self {
            file: AtomicFile::create(path)?,
            rows: 0,
        })
    }

    pub fn write(&mut self, r: &Receipt) -> Result<()> {
        serde_json::to_writer(&mut self.file, r)?;
        self.file.write_all(b"\n")?;
        self.rows += 1;
        Ok(())
    }

    pub fn finish(self) -> Result<u64> {
        self.file.commit()?;
        Ok(self.rows)
    }
}

/// Write receipts as contract-shape JSON Lines atomically.
pub fn write_receipts_jsonl<'a>(
    path: impl AsRef<Path>,
    receipts: impl IntoIterator<Item = &'a Receipt>,
) -> Result<u64> {
    let mut w = ReceiptJsonlWriter::create(path)?;
    for r in receipts {
        w.write(r)?;
    }
    w.finish()
}

/// Write receipts by extension (`.parquet` or JSON Lines).
pub fn write_receipts<'a>(
    path: impl AsRef<Path>,
    receipts: impl IntoIterator<Item = &'a Receipt>,
) -> Result<u64> {
    let mut w = ReceiptWriter::create(path)?;
    for r in receipts {
        w.write(r)?;
    }
    w.finish()
}

/// A receipts file of either format (by extension), written to a temporary file beside `path`
/// and put in place by [`ReceiptWriter::finish`]; dropped unfinished, nothing lands. Opening it
/// before long work finds an unwritable path before the work is done.
pub enum ReceiptWriter {
    Jsonl(ReceiptJsonlWriter),
    Parquet(Box<ReceiptParquetWriter>),
}

impl ReceiptWriter {
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Ok(match Format::from_path(path)? {
            Format::Parquet => {
                ReceiptWriter::Parquet(Box::new(ReceiptParquetWriter::create(path)?))
            }
            Format::Jsonl => ReceiptWriter::Jsonl(ReceiptJsonlWriter::create(path)?),
        })
    }

    pub fn write(&mut self, r: &Receipt) -> Result<()> {
        match self {
            ReceiptWriter::Jsonl(w) => w.write(r),
            ReceiptWriter::Parquet(w) => w.write(r),
        }
    }

    /// Put the file in place; the number of receipts written.
    pub fn finish(self) -> Result<u64> {
        match self {
            ReceiptWriter::Jsonl(w) => w.finish(),
            ReceiptWriter::Parquet(w) => w.finish(),
        }
    }
}

#[cfg(test)]
mod batch_rules_tests;
#[cfg(test)]
mod tests;
