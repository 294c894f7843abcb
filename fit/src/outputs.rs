//! The files a fit writes (thresholds.json, its quarantine and errors file, the report), opened
//! before a receipt is read and published together at the end.
//!
//! Opening creates each file's temporary sibling, so a folder that cannot be written (missing
//! permissions, a path through a regular file, a full disk's inode table) stops the run before
//! the long read, not after thresholds.json was replaced. Nothing appears at a final path until
//! [`Outputs::publish`], which renames thresholds.json last: the harness never picks up new
//! thresholds whose report or quarantine failed to land. Dropped unpublished (any error), the
//! temporary files are removed, and so are the folders opening had to create.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use decision_data::Quarantine;
use decision_data::atomic::AtomicFile;

use crate::thresholds::Thresholds;

struct Files {
    thresholds: AtomicFile,
    quarantine: Quarantine,
    /// report.md, report.html
    report: Option<(AtomicFile, AtomicFile)>,
}

pub struct Outputs {
    files: Option<Files>,
    /// Folders that did not exist before [`Outputs::open`], deepest first.
    created: Vec<PathBuf>,
}

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

fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new(""))
}

impl Outputs {
    /// Open every output as a temporary file beside its final path.
    pub fn open(out: &Path, quarantine: &Path, report: Option<&Path>) -> Result<Outputs> {
        let mut created = missing_folders(parent(out));
        if let Some(d) = report {
            for f in missing_folders(d) {
                if !created.contains(&f) {
                    created.push(f);
                }
            }
        }
        // deepest first, whichever output needed it
        created.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        let report_files = report.map(|d| [d.join("report.md"), d.join("report.html")]);
        let errors = decision_data::quarantine::errors_path(quarantine);
        for f in [out, quarantine, &errors]
            .into_iter()
            .chain(report_files.iter().flatten().map(PathBuf::as_path))
        {
            if f.is_dir() {
                anyhow::bail!("{} is a folder; cannot write a file there", f.display());
            }
        }
        let mut o = Outputs {
            files: None,
            created,
        };
        let thresholds = AtomicFile::create(out)?;
        let quarantine = Quarantine::create(quarantine)?;
        let report = match report {
            None => None,
            Some(d) => Some((
                AtomicFile::create(d.join("report.md"))?,
                AtomicFile::create(d.join("report.html"))?,
            )),
        };
        o.files = Some(Files {
            thresholds,
            quarantine,
            report,
        });
        Ok(o)
    }

    pub fn quarantine(&mut self) -> &mut Quarantine {
        &mut self
            .files
            .as_mut()
            .expect("open until published")
            .quarantine
    }

    /// Write and publish everything: the quarantine and its errors file, the report (when asked
    /// for), and thresholds.json last.
    pub fn publish(mut self, t: &Thresholds, report: Option<(String, String)>) -> Result<()> {
        let files = self.files.take().expect("open until published");
        let mut json = serde_json::to_vec_pretty(t)?;
        json.push(b'\n');
        let mut thresholds = files.thresholds;
        thresholds.write_all(&json)?;
        let report = match (files.report, report) {
            (Some((mut md_file, mut html_file)), Some((md, html))) => {
                md_file.write_all(md.as_bytes())?;
                html_file.write_all(html.as_bytes())?;
                Some((md_file, html_file))
            }
            (None, None) => None,
            _ => anyhow::bail!("the report was asked for but not rendered, or the reverse"),
        };
        // From here on only renames remain (each after its file's fsync). Should one fail, the
        // folders opening made are removed only when empty, so nothing published is lost.
        files.quarantine.finish()?;
        if let Some((md_file, html_file)) = report {
            md_file.commit()?;
            html_file.commit()?;
        }
        thresholds.commit()?;
        self.created.clear();
        Ok(())
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        // temporary files first, then the folders they were in (only when empty)
        drop(self.files.take());
        for d in &self.created {
            let _ = std::fs::remove_dir(d);
        }
    }
}
