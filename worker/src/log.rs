//! `DECISION_WORKER_LOG=DIR`: one JSON Lines file of contract receipts per day (UTC),
//! `DIR/receipts-YYYY-MM-DD.jsonl`, which `decision fit` reads like any receipts, and the
//! worker's own lines in `DIR/worker-YYYY-MM-DD.log` (a folder read by `fit` skips them: not a
//! receipt extension).
//!
//! Appending is safe against a killed worker and a second worker on the same folder: each
//! record is one `write` of a whole line to a file opened for appending, under an exclusive
//! lock on that file. A worker killed in the middle of a write can leave one torn last line;
//! the next worker to open the file cuts it off (under the lock, saying so in its log) before
//! it appends, so a torn line is only ever the last one, which readers skip with a warning.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Where the worker writes. Without a folder, notes go to stderr only and receipts nowhere.
pub struct Log {
    dir: Option<PathBuf>,
    receipts: Option<(String, File)>,
    text: Option<(String, File)>,
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

/// The path of the receipts file for `day`.
pub fn receipts_path(dir: &Path, day: &str) -> PathBuf {
    dir.join(format!("receipts-{day}.jsonl"))
}

pub fn text_path(dir: &Path, day: &str) -> PathBuf {
    dir.join(format!("worker-{day}.log"))
}

/// Open `path` for appending; when its last line is torn (no newline at the end), cut it off.
/// Returns the file and how many torn bytes were dropped.
pub fn open_append(path: &Path) -> Result<(File, u64)> {
    let mut f = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {} for appending", path.display()))?;
    f.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    let dropped = heal(&mut f).with_context(|| format!("checking the end of {}", path.display()));
    let _ = f.unlock();
    Ok((f, dropped?))
}

fn heal(f: &mut File) -> Result<u64> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    // Find the last newline, reading backwards in blocks.
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = true;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if first && buf[n - 1] == b'\n' {
            return Ok(0);
        }
        first = false;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            let keep = start + i as u64 + 1;
            f.set_len(keep)?;
            return Ok(len - keep);
        }
        end = start;
    }
    f.set_len(0)?;
    Ok(len)
}

/// Append one line (a newline is added) as a single write under the file's lock.
fn append_line(f: &mut File, line: &str) -> Result<()> {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    f.lock()?;
    let r = f.write_all(&bytes);
    let _ = f.unlock();
    r?;
    Ok(())
}

impl Log {
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            receipts: None,
            text: None,
        }
    }

    /// From `DECISION_WORKER_LOG` (unset or empty: no folder). The folder is created.
    pub fn from_env() -> Self {
        let dir = std::env::var_os("DECISION_WORKER_LOG")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let mut log = Self::new(dir.clone());
        if let Some(d) = &dir
            && let Err(e) = std::fs::create_dir_all(d)
        {
            log.dir = None;
            log.note(&format!(
                "DECISION_WORKER_LOG={}: cannot create it ({e}); writing no log",
                d.display()
            ));
        }
        log
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// A line for people: stderr (which keel discards) and the day's worker log.
    pub fn note(&mut self, msg: &str) {
        let line = format!(
            "{} decision-worker[{}]: {msg}",
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            std::process::id()
        );
        eprintln!("{line}");
        if let Err(e) = self.write(false, &line) {
            eprintln!("decision-worker: cannot write the log: {e:#}");
        }
    }

    /// One receipt (a JSON object) into the day's receipts file.
    pub fn receipt(&mut self, value: &serde_json::Value) {
        if self.dir.is_none() {
            return;
        }
        let line = value.to_string();
        if let Err(e) = self.write(true, &line) {
            self.note(&format!("cannot write a receipt: {e:#}"));
        }
    }

    fn write(&mut self, receipt: bool, line: &str) -> Result<()> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        let day = today();
        let slot = if receipt {
            &mut self.receipts
        } else {
            &mut self.text
        };
        let mut healed = None;
        if slot.as_ref().is_none_or(|(d, _)| *d != day) {
            let path = if receipt {
                receipts_path(&dir, &day)
            } else {
                text_path(&dir, &day)
            };
            let (f, dropped) = open_append(&path)?;
            if dropped > 0 {
                healed = Some((path, dropped));
            }
            *slot = Some((day, f));
        }
        let (_, f) = slot.as_mut().expect("opened");
        append_line(f, line)?;
        if let Some((path, n)) = healed {
            self.note(&format!(
                "{}: cut off a torn last line of {n} bytes (a worker was killed while writing)",
                path.display()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut_before_appending() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        std::fs::write(&p, b"{\"a\":1}\n{\"b\":").unwrap();
        let (mut f, dropped) = open_append(&p).unwrap();
        assert_eq!(dropped, 5);
        append_line(&mut f, "{\"c\":3}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"a\":1}\n{\"c\":3}\n");
        // A clean file is left alone; a file that is all torn is emptied.
        let (_, dropped) = open_append(&p).unwrap();
        assert_eq!(dropped, 0);
        std::fs::write(&p, vec![b'x'; 100_000]).unwrap();
        let (_, dropped) = open_append(&p).unwrap();
        assert_eq!(dropped, 100_000);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
    }

    #[test]
    fn receipts_and_notes_go_to_daily_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::new(Some(dir.path().to_path_buf()));
        log.receipt(&serde_json::json!({"id": "r1"}));
        log.receipt(&serde_json::json!({"id": "r2"}));
        log.note("hello");
        let day = today();
        let r = std::fs::read_to_string(receipts_path(dir.path(), &day)).unwrap();
        assert_eq!(r, "{\"id\":\"r1\"}\n{\"id\":\"r2\"}\n");
        let t = std::fs::read_to_string(text_path(dir.path(), &day)).unwrap();
        assert!(
            t.ends_with("hello\n") && t.contains("decision-worker["),
            "{t}"
        );
    }
}
