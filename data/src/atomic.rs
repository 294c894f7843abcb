//! Every file this project writes goes through here: write to a temporary sibling, fsync, rename.
//! A reader sees the old file or the new one, never half of one.

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
}
