//! The run folder's lock: one `decision train` at a time per folder. Two runs into one folder
//! would both succeed and mix their checkpoints and metrics (issue 19).
//!
//! The lock is a file `.lock` in the run folder holding the owner's process id, created with
//! `create_new` (atomic on every file system we write to) and removed when the run ends, by
//! error or success. A lock whose process is gone (a killed run) is stale: it is replaced, with a
//! warning.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub const FILE: &str = ".lock";

/// Held for as long as the run writes into its folder; dropping it releases the folder.
#[derive(Debug)]
pub(crate) struct RunLock {
    path: PathBuf,
}

impl RunLock {
    /// Lock `run_dir` (which must exist), or say which process holds it.
    pub(crate) fn acquire(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(FILE);
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    write!(f, "{}", std::process::id())
                        .and_then(|()| f.sync_all())
                        .with_context(|| format!("writing {}", path.display()))?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    match text.trim().parse::<u32>() {
                        Ok(pid) if alive(pid) => bail!(
                            "{} is in use by another `decision train` (process {pid}); wait for \
                             it to finish, or choose another --out",
                            run_dir.display()
                        ),
                        _ => {
                            eprintln!(
                                "warning: {}: removing a stale lock (process {:?} is not running)",
                                path.display(),
                                text.trim()
                            );
                            std::fs::remove_file(&path)
                                .with_context(|| format!("removing {}", path.display()))?;
                        }
                    }
                }
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
        bail!("{}: another process keeps taking the lock", path.display())
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether process `pid` exists (Linux: /proc; other Unix: `kill -0`).
fn alive(pid: u32) -> bool {
    if Path::new("/proc/self").exists() {
        return Path::new(&format!("/proc/{pid}")).exists();
    }
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
