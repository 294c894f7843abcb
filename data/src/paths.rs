//! No command overwrites its own input. Every command lists what it reads and what it writes in an
//! [`IoCheck`] and calls [`IoCheck::check`] before doing any work; an output that is one of the
//! inputs, holds one, or lies inside an input folder is refused with both flags named.
//!
//! Paths are compared as the filesystem sees them: relative paths against the current folder,
//! symbolic links followed, `.` and `..` resolved. A path that does not exist yet (an output about
//! to be created) is resolved through its nearest existing ancestor, so `new/../states.jsonl`
//! is still `states.jsonl`. Existing files are also compared by device and inode, so two names
//! of one file (a case-insensitive filesystem, a hard link) count as the same file.

use std::path::{Component, Path, PathBuf};

use anyhow::{Result, bail};

/// How an output is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutKind {
    /// A file, replaced as a whole.
    File,
    /// A folder the command writes into or replaces.
    Folder,
}

#[derive(Debug, Clone)]
struct Entry {
    flag: String,
    given: PathBuf,
    resolved: PathBuf,
    /// (device, inode) of an existing path.
    id: Option<(u64, u64)>,
}

impl Entry {
    fn new(flag: &str, path: &Path) -> Self {
        Entry {
            flag: flag.to_string(),
            given: path.to_path_buf(),
            resolved: resolve(path),
            id: file_id(path),
        }
    }

    fn same(&self, other: &Entry) -> bool {
        self.resolved == other.resolved || (self.id.is_some() && self.id == other.id)
    }

    fn named(&self) -> String {
        format!("{} {}", self.flag, self.given.display())
    }
}

/// The paths a command reads and writes; [`IoCheck::check`] refuses any output that would
/// overwrite an input.
///
/// - an output may not be an input, and may not be a folder that holds an input;
/// - an output may not lie inside an input *folder* (a folder of shards, a model or run folder):
///   it would be replaced there, or read back as input the next time;
/// - two outputs may not be the same path (a file may be written inside an output folder).
#[derive(Debug, Default, Clone)]
pub struct IoCheck {
    files_in: Vec<Entry>,
    folders_in: Vec<Entry>,
    outputs: Vec<(Entry, OutKind)>,
}

impl IoCheck {
    pub fn new() -> Self {
        Self::default()
    }

    /// Something the command reads, given as `flag` (`--data`, `the input PATH`). A folder counts
    /// with everything inside it.
    pub fn input(&mut self, flag: &str, path: impl AsRef<Path>) -> &mut Self {
        let path = path.as_ref();
        let e = Entry::new(flag, path);
        if e.resolved.is_dir() {
            self.folders_in.push(e);
        } else {
            self.files_in.push(e);
        }
        self
    }

    /// Every path of `paths` as an input given as `flag`.
    pub fn inputs<P: AsRef<Path>>(
        &mut self,
        flag: &str,
        paths: impl IntoIterator<Item = P>,
    ) -> &mut Self {
        for p in paths {
            self.input(flag, p);
        }
        self
    }

    /// A file the command writes (replacing what is there).
    pub fn output_file(&mut self, flag: &str, path: impl AsRef<Path>) -> &mut Self {
        self.outputs
            .push((Entry::new(flag, path.as_ref()), OutKind::File));
        self
    }

    /// A folder the command writes into, or replaces.
    pub fn output_folder(&mut self, flag: &str, path: impl AsRef<Path>) -> &mut Self {
        self.outputs
            .push((Entry::new(flag, path.as_ref()), OutKind::Folder));
        self
    }

    /// The first output that would overwrite an input (or another output), as an error naming
    /// both flags; `Ok` when there is none.
    pub fn check(&self) -> Result<()> {
        let inputs = self.files_in.iter().chain(&self.folders_in);
        for (out, kind) in &self.outputs {
            for input in inputs.clone() {
                if out.same(input) {
                    bail!(
                        "{} is {}, an input of this command: refusing to overwrite it (both \
                         are {}); choose another path",
                        out.named(),
                        input.named(),
                        input.resolved.display()
                    );
                }
                if input.resolved.starts_with(&out.resolved) {
                    let what = match kind {
                        OutKind::File => "the output",
                        OutKind::Folder => "the output folder",
                    };
                    bail!(
                        "{} holds {}, an input of this command: refusing to write {what} there \
                         ({} is inside {}); choose another path",
                        out.named(),
                        input.named(),
                        input.resolved.display(),
                        out.resolved.display()
                    );
                }
            }
            for folder in &self.folders_in {
                if out.resolved.starts_with(&folder.resolved) {
                    bail!(
                        "{} is inside {}, an input folder of this command: writing there would \
                         change what it reads ({} is inside {}); choose a path outside it",
                        out.named(),
                        folder.named(),
                        out.resolved.display(),
                        folder.resolved.display()
                    );
                }
            }
        }
        for (i, (a, _)) in self.outputs.iter().enumerate() {
            for (b, _) in &self.outputs[i + 1..] {
                if a.same(b) {
                    bail!(
                        "{} and {} are the same path: give each output its own path",
                        a.named(),
                        b.named()
                    );
                }
            }
        }
        Ok(())
    }
}

/// `path` as the filesystem will see it: absolute, links followed, `.` and `..` resolved. The
/// part that does not exist yet is resolved through its nearest existing ancestor (what will be
/// created there are real folders, so `..` after them is lexical).
pub fn resolve(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    if let Ok(c) = absolute.canonicalize() {
        return c;
    }
    // Walk up to an ancestor that exists; keep the rest to append.
    let mut rest: Vec<Component> = Vec::new();
    let mut base = absolute.as_path();
    let resolved_base = loop {
        match base.parent() {
            Some(parent) => {
                rest.push(
                    base.components()
                        .next_back()
                        .expect("a path with a parent has a last component"),
                );
                base = parent;
                if let Ok(c) = base.canonicalize() {
                    break c;
                }
            }
            None => break base.to_path_buf(),
        }
    };
    let mut out = resolved_base;
    for c in rest.into_iter().rev() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(unix)]
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(_: &Path) -> Option<(u64, u64)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(c: &IoCheck) -> String {
        format!("{:#}", c.check().expect_err("should be refused"))
    }

    #[test]
    fn output_that_is_an_input_is_refused_by_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let states = dir.path().join("states.jsonl");
        std::fs::write(&states, b"{}\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let link = dir.path().join("link.jsonl");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&states, &link).unwrap();
        #[cfg(not(unix))]
        std::fs::copy(&states, &link).unwrap();
        let names = [
            states.clone(),
            dir.path().join("sub/../states.jsonl"),
            dir.path().join("./states.jsonl"),
            // a folder that does not exist yet, then back out of it
            dir.path().join("new/../states.jsonl"),
        ];
        for name in names.iter().chain(cfg!(unix).then_some(&link)) {
            let mut c = IoCheck::new();
            c.input("--data", &states).output_file("--out", name);
            let e = err(&c);
            assert!(e.contains("--out") && e.contains("--data"), "{e}");
            assert!(e.contains("refusing to overwrite"), "{e}");
        }
        // A relative spelling, resolved against the current folder.
        let cwd = std::env::current_dir().unwrap();
        let rel = pathdiff(&states, &cwd);
        let mut c = IoCheck::new();
        c.input("--data", &rel).output_file("--out", &states);
        assert!(c.check().is_err(), "{}", rel.display());

        // Another file beside it is fine.
        let mut c = IoCheck::new();
        c.input("--data", &states)
            .output_file("--out", dir.path().join("scores.jsonl"));
        c.check().unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_hard_link_is_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.jsonl");
        std::fs::write(&a, b"{}\n").unwrap();
        let b = dir.path().join("b.jsonl");
        std::fs::hard_link(&a, &b).unwrap();
        let mut c = IoCheck::new();
        c.input("--data", &a).output_file("--receipts", &b);
        assert!(err(&c).contains("--receipts"));
    }

    #[test]
    fn output_folder_holding_an_input_and_output_inside_an_input_folder() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir_all(run.join("final")).unwrap();
        std::fs::write(run.join("run.toml"), b"").unwrap();
        let data = dir.path().join("states");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("a.jsonl"), b"").unwrap();

        // The folder itself, and a folder above an input.
        let mut c = IoCheck::new();
        c.input("--run", &run).output_folder("--out", &run);
        assert!(err(&c).contains("--run"));
        let mut c = IoCheck::new();
        c.input("--receipts", data.join("a.jsonl"))
            .output_folder("--report", dir.path());
        let e = err(&c);
        assert!(e.contains("--report") && e.contains("holds"), "{e}");

        // Inside an input folder (a new shard of the states it reads).
        let mut c = IoCheck::new();
        c.input("--data", &data)
            .output_file("--out", data.join("scores.jsonl"));
        let e = err(&c);
        assert!(e.contains("inside --data"), "{e}");

        // Beside them: fine.
        let mut c = IoCheck::new();
        c.input("--run", run.join("run.toml"))
            .input("--run", run.join("final"))
            .input("--data", &data)
            .output_file("--receipts", run.join("receipts.jsonl"))
            .output_folder("--out", dir.path().join("bundle"));
        c.check().unwrap();
    }

    #[test]
    fn two_outputs_on_one_path_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = IoCheck::new();
        c.output_file("--receipts", dir.path().join("x.json"))
            .output_file("--report", dir.path().join("x.json"));
        let e = err(&c);
        assert!(e.contains("--receipts") && e.contains("--report"), "{e}");
        // A file inside an output folder is fine (fit's --out beside its --report).
        let mut c = IoCheck::new();
        c.output_file("--out", dir.path().join("fit/thresholds.json"))
            .output_folder("--report", dir.path().join("fit"));
        c.check().unwrap();
    }

    #[test]
    fn resolve_goes_through_missing_folders() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        assert_eq!(
            resolve(&dir.path().join("a/b/../c.json")),
            base.join("a/c.json")
        );
        assert_eq!(
            resolve(&dir.path().join("a/./c.json")),
            base.join("a/c.json")
        );
    }

    /// `path` relative to `base` (both absolute), with `..` as needed.
    fn pathdiff(path: &Path, base: &Path) -> PathBuf {
        let p: Vec<_> = path.components().collect();
        let b: Vec<_> = base.components().collect();
        let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let mut out = PathBuf::new();
        for _ in common..b.len() {
            out.push("..");
        }
        for c in &p[common..] {
            out.push(c.as_os_str());
        }
        out
    }
}
