//! Decision-state files (contracts section 1): Parquet or JSON Lines, one file or a folder of
//! shards, read as a stream and written atomically.
//!
//! Reading never loads a file whole: JSON Lines are read line by line, Parquet batch by batch
//! (1024 rows), so memory stays flat however large the files are. Each row comes back as a
//! [`Row`] (the parsed state, its file and 1-based row number) or a [`BadRow`] (the same place,
//! every problem found with the field it concerns, and the row itself for quarantine). Rows are
//! numbered per file from 1; in JSON Lines the row number is the line number (blank lines are
//! skipped but still counted, so an editor's line number finds the row).
//!
//! The row as it was: for JSON Lines the line's exact bytes; for Parquet the row rendered as one
//! JSON object with every column of the file (non-finite floats written `NaN` / `Infinity` as
//! Python's `json` does, since JSON has no spelling for them).

mod arrow;
mod json;
mod parquet;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow_array::RecordBatch;

use crate::atomic::AtomicFile;
use crate::state::State;

pub use self::arrow::{STATES_SCHEMA_ID, state_schema, states_to_batch};
pub use self::json::state_from_json;
pub(crate) use self::parquet::guard as guard_parquet;
pub use self::parquet::{ROW_GROUP_BYTES, ROW_GROUP_ROWS};

/// The two formats a states file can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Parquet,
    /// JSON Lines: one JSON object per line (`.jsonl`, `.json`).
    Jsonl,
}

impl Format {
    /// The format named by the file's extension: `.parquet`, or `.jsonl` / `.json` (JSON Lines).
    pub fn from_path(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("parquet") => Ok(Format::Parquet),
            Some("jsonl") | Some("json") => Ok(Format::Jsonl),
            _ => bail!(
                "{}: unknown format; a states or receipts file ends in .parquet, .jsonl or .json \
                 (JSON Lines)",
                path.display()
            ),
        }
    }
}

/// One problem in one row: the field it concerns (`candidates[2].label`, `teacher[0]`; `(row)`
/// when the row as a whole is unreadable) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The row as it was in its file, kept so that a rejected row can be quarantined unchanged.
#[derive(Debug, Clone)]
enum Raw {
    /// A JSON Lines line, without its `\n`.
    Line(Vec<u8>),
    /// A Parquet row: the decoded batch it sits in and its index there (cheap: the batch is
    /// shared, not copied).
    Batch(RecordBatch, usize),
}

impl Raw {
    fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Raw::Line(line) => Cow::Borrowed(line),
            Raw::Batch(batch, i) => Cow::Owned(arrow::row_to_json(batch, *i).into_bytes()),
        }
    }
}

/// A row that parsed: the value, where it came from, and the row as it was.
#[derive(Debug, Clone)]
pub struct Row<T> {
    pub file: Arc<PathBuf>,
    /// 1-based row number within `file` (the line number for JSON Lines).
    pub row: u64,
    pub value: T,
    raw: Raw,
}

impl<T> Row<T> {
    /// A row read from a JSON Lines line (`line` without its `\n`).
    pub fn from_line(file: Arc<PathBuf>, row: u64, line: Vec<u8>, value: T) -> Self {
        Row {
            file,
            row,
            value,
            raw: Raw::Line(line),
        }
    }

    /// The row as it was: the line's bytes (JSON Lines) or the row as JSON (Parquet).
    pub fn raw(&self) -> Cow<'_, [u8]> {
        self.raw.bytes()
    }

    /// This row turned bad: the same place and raw bytes, with `errors`.
    pub fn into_bad(self, errors: Vec<FieldError>) -> BadRow {
        BadRow {
            file: self.file,
            row: self.row,
            errors,
            raw: self.raw,
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Row<U> {
        Row {
            file: self.file,
            row: self.row,
            value: f(self.value),
            raw: self.raw,
        }
    }
}

/// A row that is unreadable or breaks a rule: where it is, everything wrong with it (at least
/// one entry), and the row as it was.
#[derive(Debug, Clone)]
pub struct BadRow {
    pub file: Arc<PathBuf>,
    /// 1-based row number within `file` (the line number for JSON Lines).
    pub row: u64,
    pub errors: Vec<FieldError>,
    raw: Raw,
}

impl BadRow {
    /// A bad JSON Lines line (`line` without its `\n`).
    pub fn from_line(file: Arc<PathBuf>, row: u64, line: Vec<u8>, errors: Vec<FieldError>) -> Self {
        BadRow {
            file,
            row,
            errors,
            raw: Raw::Line(line),
        }
    }

    /// The row as it was: the line's bytes (JSON Lines) or the row as JSON (Parquet).
    pub fn raw(&self) -> Cow<'_, [u8]> {
        self.raw.bytes()
    }

    /// One line per error: `FILE row N: FIELD: REASON`.
    pub fn lines(&self) -> impl Iterator<Item = String> + '_ {
        self.errors.iter().map(|e| {
            format!(
                "{} row {}: {}: {}",
                self.file.display(),
                self.row,
                e.field,
                e.reason
            )
        })
    }
}

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, line) in self.lines().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            f.write_str(&line)?;
        }
        Ok(())
    }
}

/// What a reader yields per row: the outer error is fatal (a file that cannot be opened or is
/// not Parquet at all, an I/O error), the inner one is a bad row and reading goes on.
pub type ReadItem = Result<Result<Row<State>, BadRow>>;

/// The files behind `paths`: files as given, folders replaced by their shards (`.parquet`,
/// `.jsonl`, `.json` files inside it or any subfolder, sorted by path so the order is the same
/// everywhere). Hidden files and folders are skipped, and folders whose name starts with `_`
/// (Spark's and Hive's `_temporary`, `_staging`). A partition folder (`name=value`) is read like
/// any other, its value not: one that names a column the reader reads (`is_column`, such as
/// `split=train`) is an error, since its rows would be read without it. Fails on a missing path,
/// an unknown extension or a folder with no shard.
pub fn expand_paths(paths: &[PathBuf], is_column: &dyn Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let meta =
            fs::metadata(path).with_context(|| format!("{}: cannot read", path.display()))?;
        if meta.is_dir() {
            let mut shards = Vec::new();
            shards_under(path, is_column, &mut shards)?;
            if shards.is_empty() {
                bail!(
                    "{}: folder holds no .parquet, .jsonl or .json shard",
                    path.display()
                );
            }
            shards.sort();
            files.extend(shards);
        } else {
            Format::from_path(path)?;
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// The shards in `dir` and its subfolders, in no order.
fn shards_under(
    dir: &Path,
    is_column: &dyn Fn(&str) -> bool,
    shards: &mut Vec<PathBuf>,
) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let (p, name) = (entry.path(), entry.file_name());
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            if name.starts_with('_') {
                continue;
            }
            if let Some((column, _)) = name.split_once('=')
                && is_column(column)
            {
                bail!(
                    "{}: a partition folder: `{column}` is read from the files' rows, not from \
                     folder names, so its rows would be read without it; write `{column}` into \
                     the files themselves",
                    p.display()
                );
            }
            shards_under(&p, is_column, shards)?;
        } else if p.is_file() && Format::from_path(&p).is_ok() {
            shards.push(p);
        }
    }
    Ok(())
}

/// Streams the states of one or more files / folders of shards, in order. Each file is opened
/// when reading reaches it.
pub struct StateReader {
    pending: VecDeque<PathBuf>,
    current: Option<Source>,
    files: Vec<PathBuf>,
}

enum Source {
    Jsonl(JsonlLines),
    Parquet(parquet::ParquetRows),
}

impl StateReader {
    /// Checks that every path exists and has a known format; opens nothing yet.
    pub fn open(paths: &[PathBuf]) -> Result<StateReader> {
        // the contract's columns, as the schema we write names them
        let schema = self::arrow::state_schema();
        let files = expand_paths(paths, &|c| schema.column_with_name(c).is_some())?;
        Ok(StateReader {
            pending: files.iter().cloned().collect(),
            current: None,
            files,
        })
    }

    /// The files that will be read, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Total rows when every file is Parquet (known from the footers without reading data);
    /// `None` when a JSON Lines file is among them. For progress bars.
    pub fn row_count_hint(&self) -> Option<u64> {
        let mut total = 0;
        for f in &self.files {
            if Format::from_path(f).ok()? != Format::Parquet {
                return None;
            }
            total += parquet::row_count(f).ok()?;
        }
        Some(total)
    }

    /// The same stream with every rule of [`crate::validate`] applied: rows breaking one come
    /// back as [`BadRow`]s.
    pub fn validated(
        self,
        opts: crate::validate::ValidateOptions,
    ) -> crate::validate::Validated<Self> {
        crate::validate::Validated::new(self, opts)
    }

    fn open_next(&mut self) -> Option<Result<()>> {
        let path = self.pending.pop_front()?;
        let file = Arc::new(path);
        let source = match Format::from_path(&file) {
            Ok(Format::Jsonl) => JsonlLines::open(file).map(Source::Jsonl),
            Ok(Format::Parquet) => parquet::ParquetRows::open(file).map(Source::Parquet),
            Err(e) => Err(e),
        };
        Some(source.map(|s| self.current = Some(s)))
    }
}

impl Iterator for StateReader {
    type Item = ReadItem;

    fn next(&mut self) -> Option<ReadItem> {
        loop {
            match self.current.as_mut() {
                Some(Source::Jsonl(lines)) => match lines.next() {
                    Some(Ok((row, line))) => {
                        return Some(Ok(json::parse_line(&lines.file, row, line)));
                    }
                    Some(Err(e)) => {
                        self.current = None;
                        return Some(Err(e));
                    }
                    None => self.current = None,
                },
                Some(Source::Parquet(rows)) => match rows.next() {
                    Some(item) => {
                        if item.is_err() {
                            self.current = None;
                        }
                        return Some(item);
                    }
                    None => self.current = None,
                },
                None => {
                    if let Err(e) = self.open_next()? {
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}

/// The non-blank lines of a JSON Lines file, numbered from 1 by line, without their `\n`.
/// Shared by every JSON Lines reader of the project (states, receipts).
pub struct JsonlLines {
    pub file: Arc<PathBuf>,
    reader: BufReader<File>,
    line_no: u64,
}

impl JsonlLines {
    pub fn open(file: Arc<PathBuf>) -> Result<JsonlLines> {
        let f =
            File::open(file.as_path()).with_context(|| format!("opening {}", file.display()))?;
        Ok(JsonlLines {
            file,
            reader: BufReader::with_capacity(1 << 20, f),
            line_no: 0,
        })
    }
}

impl Iterator for JsonlLines {
    type Item = Result<(u64, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let mut line = Vec::new();
            match self.reader.read_until(b'\n', &mut line) {
                Ok(0) => return None,
                Ok(_) => {
                    self.line_no += 1;
                    if line.last() == Some(&b'\n') {
                        line.pop();
                    }
                    if self.line_no == 1 {
                        strip_bom(&mut line);
                    }
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Some(Ok((self.line_no, line)));
                }
                Err(e) => {
                    return Some(Err(anyhow::Error::new(e).context(format!(
                        "reading {} after line {}",
                        self.file.display(),
                        self.line_no
                    ))));
                }
            }
        }
    }
}

/// The UTF-8 byte-order mark some editors (Notepad, Excel's "CSV UTF-8") put at the start of a
/// text file.
pub const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Drop a UTF-8 byte-order mark from the start of `line` (a JSON Lines file's first line): it is
/// not part of the JSON, and serde_json would report it as "expected value at line 1 column 1".
pub fn strip_bom(line: &mut Vec<u8>) {
    if line.starts_with(UTF8_BOM) {
        line.drain(..UTF8_BOM.len());
    }
}

/// Writes states to a `.parquet` or `.jsonl` / `.json` file (format by extension), atomically:
/// nothing appears at the path until [`StateWriter::finish`]. Parquet: zstd, row groups of at
/// most 65 536 rows or about 128 MB, whichever comes first.
pub struct StateWriter {
    inner: WriterInner,
    rows: u64,
}

enum WriterInner {
    Jsonl(AtomicFile),
    /// Boxed: the Arrow writer is large next to a file handle.
    Parquet(Box<parquet::ParquetStateWriter>),
}

impl StateWriter {
    pub fn create(path: impl AsRef<Path>) -> Result<StateWriter> {
        Self::create_with_row_group_rows(path, parquet::ROW_GROUP_ROWS)
    }

    /// As [`StateWriter::create`], with Parquet row groups of at most `rows` rows (ignored for
    /// JSON Lines).
    pub fn create_with_row_group_rows(path: impl AsRef<Path>, rows: usize) -> Result<StateWriter> {
        let path = path.as_ref();
        let inner = match Format::from_path(path)? {
            Format::Jsonl => WriterInner::Jsonl(AtomicFile::create(path)?),
            Format::Parquet => WriterInner::Parquet(Box::new(parquet::ParquetStateWriter::create(
                path,
                rows.max(1),
            )?)),
        };
        Ok(StateWriter { inner, rows: 0 })
    }

    pub fn write(&mut self, state: &State) -> Result<()> {
        match &mut self.inner {
            WriterInner::Jsonl(f) => {
                serde_json::to_writer(&mut *f, state)?;
                f.write_all(b"\n")?;
            }
            WriterInner::Parquet(w) => w.write(state)?,
        }
        self.rows += 1;
        Ok(())
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Completes the file and moves it into place; returns the number of rows.
    pub fn finish(self) -> Result<u64> {
        match self.inner {
            WriterInner::Jsonl(f) => f.commit()?,
            WriterInner::Parquet(w) => w.finish()?,
        }
        Ok(self.rows)
    }
}

/// Writes `states` to `path` (format by extension), atomically.
pub fn write_states<'a>(
    path: impl AsRef<Path>,
    states: impl IntoIterator<Item = &'a State>,
) -> Result<u64> {
    let mut w = StateWriter::create(path)?;
    for s in states {
        w.write(s)?;
    }
    w.finish()
}

/// Reads every state of `paths` into memory, checked against every rule of
/// [`crate::validate`]; fails listing the bad rows (up to 20) when there is any. For small
/// datasets and tests; large ones should stream through [`StateReader`].
pub fn read_states(
    paths: &[PathBuf],
    opts: crate::validate::ValidateOptions,
) -> Result<Vec<State>> {
    let mut states = Vec::new();
    let mut bad = Vec::new();
    let mut bad_rows = 0usize;
    for item in StateReader::open(paths)?.validated(opts) {
        match item? {
            Ok(row) => states.push(row.value),
            Err(b) => {
                bad_rows += 1;
                if bad.len() < 20 {
                    bad.extend(b.lines());
                }
            }
        }
    }
    if bad_rows > 0 {
        return Err(BadRows {
            rows: bad_rows,
            files: display_paths(paths),
            listed: bad,
        }
        .into());
    }
    Ok(states)
}

/// [`read_states`]' error when rows break the contract: how many, in which files, and the first
/// ones' errors (file, row, field, reason). A caller can tell it from an unreadable file.
#[derive(Debug)]
pub struct BadRows {
    pub rows: usize,
    pub files: String,
    pub listed: Vec<String>,
}

impl std::fmt::Display for BadRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bad row(s) in {}:\n{}",
            self.rows,
            self.files,
            self.listed.join("\n")
        )
    }
}

impl std::error::Error for BadRows {}

pub(crate) fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
