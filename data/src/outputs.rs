//! The files a command writes, opened before its long work and published together at its end
//! (`fit`, `eval`, `score`).
//!
//! Opening creates each file's temporary sibling ([`AtomicFile`]), so a location that cannot be
//! written (missing permissions, a path through a regular file, a full disk) stops the command
//! before it reads or scores anything, not after some of its outputs were replaced. Nothing
//! appears at a final path until [`Staged::publish`], which renames the files in the order they
//! were opened: open the one a reader acts on last. Dropped unpublished (any error), the
//! temporary files are removed, and so are the folders opening had to create (only when empty).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::atomic::AtomicFile;

/// Output files opened as temporary siblings of their final paths; see the module docs.
#[derive(Default)]
pub struct Staged {
    files: Vec<AtomicFile>,
    /// Folders that did not exist before they were needed, deepest first.
    created: Vec<PathBuf>,
}

/// A file of a [`Staged`] set, as [`Staged::file`] returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

/// The folders of `dir` and its ancestors that do not exist yet, deepest first.
fn missing_folders(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d {
        if p.as_os_str().is_empty() || p.exists() {
            break;
        }
        out.push(p.to_path_buf());
        d = p.parent();
    }
    out
}

/// The folder a file at `path` lands in (`""` for a bare file name: the current folder).
pub fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

impl Staged {
    pub fn new() -> Self {
        Self::default()
    }

    /// Remember the folders `dir` needs that do not exist yet, so that they are removed again
    /// when nothing is published. Call it before something else (a [`crate::Quarantine`])
    /// creates them.
    pub fn will_create(&mut self, dir: &Path) {
        for f in missing_folders(dir) {
            if !self.created.contains(&f) {
                self.created.push(f);
            }
        }
        self.created
            .sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    }

    /// Open `path` (given as `flag`, for messages) as a temporary file beside it, creating its
    /// folder when needed. An error names the flag and the path.
    pub fn file(&mut self, flag: &str, path: &Path) -> Result<Slot> {
        if path.is_dir() {
            bail!(
                "{flag} {} is a folder; cannot write a file there",
                path.display()
            );
        }
        self.will_create(parent(path));
        let f = AtomicFile::create(path)
            .with_context(|| format!("{flag} {}: cannot write there", path.display()))?;
        self.files.push(f);
        Ok(Slot(self.files.len() - 1))
    }

    /// The open file of `slot`, to write into.
    pub fn get(&mut self, slot: Slot) -> &mut AtomicFile {
        &mut self.files[slot.0]
    }

    /// Rename every file into place, in the order they were opened (each after its fsync). Should
    /// one fail, the rest are discarded, and the folders made for them are removed only when
    /// empty, so nothing published is lost.
    pub fn publish(mut self) -> Result<()> {
        for f in std::mem::take(&mut self.files) {
            f.commit()?;
        }
        self.created.clear();
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // temporary files first, then the folders they were in (only when empty)
        self.files.clear();
        for d in &self.created {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn listing(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
        out
    }

    #[test]
    fn nothing_lands_unless_published_and_made_folders_go_again() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("old.json"), b"old").unwrap();
        let before = listing(d.path());
        {
            let mut s = Staged::new();
            let a = s
                .file("--receipts", &d.path().join("new/deep/r.jsonl"))
                .unwrap();
            let b = s.file("--report", &d.path().join("old.json")).unwrap();
            s.get(a).write_all(b"r").unwrap();
            s.get(b).write_all(b"new").unwrap();
            // dropped: an error in the long work
        }
        assert_eq!(listing(d.path()), before);
        assert_eq!(std::fs::read(d.path().join("old.json")).unwrap(), b"old");

        let mut s = Staged::new();
        let a = s
            .file("--receipts", &d.path().join("new/deep/r.jsonl"))
            .unwrap();
        let b = s.file("--report", &d.path().join("old.json")).unwrap();
        s.get(a).write_all(b"r").unwrap();
        s.get(b).write_all(b"new").unwrap();
        s.publish().unwrap();
        assert_eq!(
            std::fs::read(d.path().join("new/deep/r.jsonl")).unwrap(),
            b"r"
        );
        assert_eq!(std::fs::read(d.path().join("old.json")).unwrap(), b"new");
        assert!(!listing(d.path()).iter().any(|n| n.contains(".tmp-")));
    }

    #[test]
    fn an_unwritable_location_is_refused_at_open_naming_the_flag() {
        let d = tempfile::tempdir().unwrap();
        let blocker = d.path().join("blocker");
        std::fs::write(&blocker, b"a file, not a folder").unwrap();
        let before = listing(d.path());
        let mut s = Staged::new();
        s.file("--receipts", &d.path().join("made/r.jsonl"))
            .unwrap();
        let e = format!(
            "{:#}",
            s.file("--report", &blocker.join("report.json"))
                .unwrap_err()
        );
        assert!(e.contains("--report") && e.contains("blocker"), "{e}");
        drop(s);
        assert_eq!(listing(d.path()), before, "the made folder is removed");
        let e = format!("{:#}", Staged::new().file("--out", d.path()).err().unwrap());
        assert!(e.contains("--out") && e.contains("is a folder"), "{e}");
    }
}
