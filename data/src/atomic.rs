//! Every file this project writes goes through here: write to a temporary sibling, fsync, rename.
//! A reader sees the old file or the new one, never half of one. Folders (checkpoints, a run's
//! `final/`, bundles, Core ML packages) likewise: filled in a hidden sibling ([`StagedDir`]),
//! every file and folder synced ([`sync_tree`]), renamed into place ([`publish_dir`]).

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A file being written; it appears at its final path only on [`AtomicFile::commit`].
/// Dropped without commit, or when the commit fails at any step (write, sync, rename), the
/// temporary file is removed.
pub struct AtomicFile {
    target: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<File>>,
    /// Set once the rename has succeeded: from then on the temporary name no longer exists.
    renamed: bool,
}

impl AtomicFile {
    pub fn create(target: impl AsRef<Path>) -> Result<Self> {
        let target = target.as_ref().to_path_buf();
        let dir = parent_dir(&target);
        fs::create_dir_all(&dir).with_context(|| format!("creating folder {}", dir.display()))?;
        let name = target
            .file_name()
            .with_context(|| format!("{} has no file name", target.display()))?
            .to_string_lossy()
            .into_owned();
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            target,
            tmp,
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
            renamed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.target
    }

    /// Flush, fsync, rename into place and fsync the folder. On failure the temporary file is
    /// removed (when `self` drops) and the target is left as it was.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("writer present until commit");
        let file = writer
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", self.tmp.display()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", self.tmp.display()))?;
        drop(file);
        fs::rename(&self.tmp, &self.target).with_context(|| {
            format!(
                "renaming {} to {}",
                self.tmp.display(),
                self.target.display()
            )
        })?;
        self.renamed = true;
        sync_dir(&parent_dir(&self.target));
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer
            .as_mut()
            .expect("writer present until commit")
            .write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer
            .as_mut()
            .expect("writer present until commit")
            .flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // Close the file first (the writer is still here when not committed).
        drop(self.writer.take());
        if !self.renamed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Write a whole file atomically.
pub fn write_atomic(target: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(target)?;
    f.write_all(bytes)?;
    f.commit()
}

/// Write `value` as pretty JSON (with a trailing newline) atomically.
pub fn write_json_atomic<T: serde::Serialize>(target: impl AsRef<Path>, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    write_atomic(target, &bytes)
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Make a rename durable. Best effort: not every filesystem lets a folder be opened for sync.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Sync every file under `dir`, each folder below it and `dir` itself, calling `visit` with each
/// file's path below `dir` (`/`-separated) and the open file before it is synced (checkpoints hash
/// their files on the way).
pub fn sync_tree_with(dir: &Path, visit: &mut dyn FnMut(&str, &File) -> Result<()>) -> Result<()> {
    fn walk(
        dir: &Path,
        prefix: &str,
        visit: &mut dyn FnMut(&str, &File) -> Result<()>,
    ) -> Result<()> {
        let entries = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("reading {}", dir.display()))?;
            let p = e.path();
            let rel = format!("{prefix}{}", e.file_name().to_string_lossy());
            if p.is_dir() {
                walk(&p, &format!("{rel}/"), visit)?;
            } else {
                let file = File::open(&p).with_context(|| format!("opening {}", p.display()))?;
                visit(&rel, &file)?;
                file.sync_all()
                    .with_context(|| format!("syncing {}", p.display()))?;
            }
        }
        sync_dir(dir);
        Ok(())
    }
    walk(dir, "", visit)
}

/// Sync every file and folder under `dir` (and `dir`).
pub fn sync_tree(dir: &Path) -> Result<()> {
    sync_tree_with(dir, &mut |_, _| Ok(()))
}

/// Put the folder `staged` (written and synced in full) at `target`, its sibling. An existing
/// `target` is first renamed to `aside` and removed only once `staged` is in place, so at every
/// moment `target` is the old folder, absent, or the new one: never part of either. If the rename
/// fails the old folder is put back. The parent is synced so the rename survives a crash. A
/// leftover `aside` (from a crash) is removed first; failing to remove the old folder once the
/// new one is in place is only a warning.
pub fn publish_dir(staged: &Path, target: &Path, aside: &Path) -> Result<()> {
    if fs::symlink_metadata(aside).is_ok() {
        fs::remove_dir_all(aside).with_context(|| format!("removing {}", aside.display()))?;
    }
    let replacing = fs::symlink_metadata(target).is_ok();
    if replacing {
        fs::rename(target, aside).with_context(|| format!("moving {} aside", target.display()))?;
    }
    if let Err(e) = fs::rename(staged, target) {
        let what = format!("renaming {} to {}", staged.display(), target.display());
        if !replacing {
            return Err(e).context(what);
        }
        return Err(e).with_context(|| match fs::rename(aside, target) {
            Ok(()) => format!("{what} (the old folder was put back)"),
            Err(b) => format!(
                "{what}; putting the old folder back from {} failed too ({b})",
                aside.display()
            ),
        });
    }
    sync_dir(&parent_dir(target));
    if replacing && let Err(e) = fs::remove_dir_all(aside) {
        eprintln!(
            "warning: {} is published, but the old one could not be removed from {}: {e}",
            target.display(),
            aside.display()
        );
    }
    Ok(())
}

/// A folder being written: filled at [`StagedDir::path`], a hidden sibling of its target, and put
/// at the target whole by [`StagedDir::publish`]. Dropped unpublished, the staging folder is
/// removed and the target left as it was.
#[derive(Debug)]
pub struct StagedDir {
    target: PathBuf,
    tmp: PathBuf,
    published: bool,
}

impl StagedDir {
    /// Start writing `target` (removing the leftovers of an interrupted write).
    pub fn create(target: impl AsRef<Path>) -> Result<Self> {
        let target = target.as_ref().to_path_buf();
        let tmp = sibling(&target, "tmp")?;
        if fs::symlink_metadata(&tmp).is_ok() {
            fs::remove_dir_all(&tmp)
                .with_context(|| format!("removing stale {}", tmp.display()))?;
        }
        fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            target,
            tmp,
            published: false,
        })
    }

    /// The folder being filled.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Sync everything below the staging folder and rename it into place ([`publish_dir`]).
    pub fn publish(mut self) -> Result<PathBuf> {
        sync_tree(&self.tmp)?;
        publish_dir(&self.tmp, &self.target, &sibling(&self.target, "old")?)?;
        self.published = true;
        Ok(self.target.clone())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// `.NAME.KIND-PID` beside `target`.
fn sibling(target: &Path, kind: &str) -> Result<PathBuf> {
    let name = target
        .file_name()
        .with_context(|| format!("{} has no folder name", target.display()))?
        .to_string_lossy()
        .into_owned();
    Ok(parent_dir(target).join(format!(".{name}.{kind}-{}", std::process::id())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_publishes_and_drop_discards() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.json");
        {
            let mut f = AtomicFile::create(&target).unwrap();
            f.write_all(b"half").unwrap();
            // dropped without commit
        }
        assert!(!target.exists());
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "temporary file left behind"
        );
        write_atomic(&target, b"whole").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"whole");
        write_atomic(&target, b"again").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"again");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn failed_rename_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty folder at the target: renaming a file onto it fails.
        let target = dir.path().join("out.json");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let mut f = AtomicFile::create(&target).unwrap();
        f.write_all(b"data").unwrap();
        let e = f.commit().expect_err("rename onto a non-empty folder");
        assert!(format!("{e:#}").contains("renaming"), "{e:#}");
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            left,
            vec!["out.json".to_string()],
            "temporary file left behind"
        );
        assert_eq!(fs::read(target.join("keep")).unwrap(), b"x");
        assert!(write_atomic(&target, b"y").is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A staged folder replaces an existing one whole (no old file survives), leaves neither
    /// the staging folder nor the old one behind, also publishes where nothing stood, and a
    /// staged folder dropped unpublished leaves the target as it was.
    #[test]
    fn a_staged_folder_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("final");
        fs::create_dir_all(target.join("adapter")).unwrap();
        fs::write(target.join("adapter/a.bin"), b"old").unwrap();
        fs::write(target.join("model.bin"), b"old").unwrap();

        let staged = StagedDir::create(&target).unwrap();
        fs::write(staged.path().join("model.bin"), b"half").unwrap();
        drop(staged);
        assert_eq!(fs::read(target.join("model.bin")).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "staging left");

        let staged = StagedDir::create(&target).unwrap();
        fs::create_dir_all(staged.path().join("sub")).unwrap();
        fs::write(staged.path().join("sub/model.bin"), b"new").unwrap();
        assert_eq!(staged.publish().unwrap(), target);
        assert_eq!(fs::read(target.join("sub/model.bin")).unwrap(), b"new");
        assert!(!target.join("adapter").exists(), "an old file survived");
        assert!(!target.join("model.bin").exists(), "an old file survived");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "staging or old left"
        );

        let fresh = dir.path().join("fresh");
        let staged = StagedDir::create(&fresh).unwrap();
        fs::write(staged.path().join("x"), b"1").unwrap();
        staged.publish().unwrap();
        assert_eq!(fs::read(fresh.join("x")).unwrap(), b"1");
    }

    /// A failed rename puts the old folder back: here the staged folder is missing.
    #[test]
    fn a_failed_publish_puts_the_old_folder_back() {
        let dir = tempfile::tempdir().unwrap();
        let (target, aside) = (dir.path().join("out"), dir.path().join(".out.old"));
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let e = publish_dir(&dir.path().join("missing"), &target, &aside).unwrap_err();
        assert!(
            format!("{e:#}").contains("the old folder was put back"),
            "{e:#}"
        );
        assert_eq!(fs::read(target.join("keep")).unwrap(), b"x");
        assert!(!aside.exists());
    }

    /// Every file below the folder is visited, by its `/`-separated path.
    #[test]
    fn sync_tree_visits_every_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/b")).unwrap();
        fs::write(dir.path().join("a/b/c"), b"1").unwrap();
        fs::write(dir.path().join("d"), b"2").unwrap();
        let mut seen = Vec::new();
        sync_tree_with(dir.path(), &mut |rel, _| {
            seen.push(rel.to_string());
            Ok(())
        })
        .unwrap();
        seen.sort();
        assert_eq!(seen, ["a/b/c", "d"]);
    }
}
