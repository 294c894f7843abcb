//! Rejected rows, kept as they were. The quarantine file holds one row per line: a JSON Lines
//! row's exact bytes, or a Parquet row as a JSON object (see [`crate::states_io`]). Beside it,
//! `NAME.errors.jsonl` says for each quarantined line where it came from and what is wrong with
//! it: `{"line": 1, "file": "...", "row": 7, "field": "answer", "reason": "..."}` (one line per
//! error). Both files are written atomically, and always: a clean run leaves them empty, so a
//! stale quarantine from an earlier run never lingers.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::atomic::AtomicFile;
use crate::states_io::BadRow;

pub struct Quarantine {
    rows: AtomicFile,
    errors: AtomicFile,
    count: u64,
}

impl Quarantine {
    pub fn create(path: impl AsRef<Path>) -> Result<Quarantine> {
        let path = path.as_ref();
        Ok(Quarantine {
            rows: AtomicFile::create(path)?,
            errors: AtomicFile::create(errors_path(path))?,
            count: 0,
        })
    }

    /// Appends the row unchanged, and its errors to the side file.
    pub fn add(&mut self, bad: &BadRow) -> Result<()> {
        self.rows.write_all(&bad.raw())?;
        self.rows.write_all(b"\n")?;
        self.count += 1;
        for e in &bad.errors {
            let record = serde_json::json!({
                "line": self.count,
                "file": bad.file.display().to_string(),
                "row": bad.row,
                "field": e.field,
                "reason": e.reason,
            });
            serde_json::to_writer(&mut self.errors, &record)?;
            self.errors.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Rows quarantined so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn path(&self) -> &Path {
        self.rows.path()
    }

    /// Moves both files into place; returns the number of rows.
    pub fn finish(self) -> Result<u64> {
        self.rows.commit()?;
        self.errors.commit()?;
        Ok(self.count)
    }
}

/// `q.jsonl` -> `q.errors.jsonl` (beside it).
pub fn errors_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.errors.jsonl"))
}
