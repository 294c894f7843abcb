//! The files a fit writes (thresholds.json, its quarantine and errors file, the report), opened
//! before a receipt is read and published together at the end.
//!
//! Opening creates each file's temporary sibling ([`Staged`], shared with `eval` and `score`), so
//! a folder that cannot be written (missing permissions, a path through a regular file, a full
//! disk's inode table) stops the run before the long read, not after thresholds.json was
//! replaced. Nothing appears at a final path until [`Outputs::publish`], which renames
//! thresholds.json last: the harness never picks up new thresholds whose report or quarantine
//! failed to land. Dropped unpublished (any error), the temporary files are removed, and so are
//! the folders opening had to create.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use decision_data::Quarantine;
use decision_data::outputs::{Slot, Staged, parent};

use crate::thresholds::Thresholds;

/// `<out>.quarantine.jsonl` beside the output: `thresholds.json` → `thresholds.quarantine.jsonl`.
pub(crate) fn quarantine_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "thresholds".into());
    out.with_file_name(format!("{stem}.quarantine.jsonl"))
}

pub struct Outputs {
    // Field order is drop order: the quarantine's temporary files go before `staged` removes the
    // folders it made.
    quarantine: Option<Quarantine>,
    /// report.md and report.html (when asked for), then thresholds.json: the publishing order.
    staged: Staged,
    report: Option<(Slot, Slot)>,
    thresholds: Slot,
}

impl Outputs {
    /// Open every output as a temporary file beside its final path.
    pub fn open(out: &Path, quarantine: &Path, report: Option<&Path>) -> Result<Outputs> {
        let report_files = report.map(|d| [d.join("report.md"), d.join("report.html")]);
        let errors = decision_data::quarantine::errors_path(quarantine);
        for f in [quarantine, &errors] {
            if f.is_dir() {
                anyhow::bail!("{} is a folder; cannot write a file there", f.display());
            }
        }
        let mut staged = Staged::new();
        staged.will_create(parent(quarantine));
        let report = match &report_files {
            None => None,
            Some([md, html]) => {
                Some((staged.file("--report", md)?, staged.file("--report", html)?))
            }
        };
        let thresholds = staged.file("--out", out)?;
        let quarantine = Some(Quarantine::create(quarantine)?);
        Ok(Outputs {
            quarantine,
            staged,
            report,
            thresholds,
        })
    }

    pub fn quarantine(&mut self) -> &mut Quarantine {
        self.quarantine.as_mut().expect("open until published")
    }

    /// Write and publish everything: the quarantine and its errors file, the report (when asked
    /// for), and thresholds.json last.
    pub fn publish(mut self, t: &Thresholds, report: Option<(String, String)>) -> Result<()> {
        let mut json = serde_json::to_vec_pretty(t)?;
        json.push(b'\n');
        self.staged.get(self.thresholds).write_all(&json)?;
        match (self.report, report) {
            (Some((md_file, html_file)), Some((md, html))) => {
                self.staged.get(md_file).write_all(md.as_bytes())?;
                self.staged.get(html_file).write_all(html.as_bytes())?;
            }
            (None, None) => {}
            _ => anyhow::bail!("the report was asked for but not rendered, or the reverse"),
        }
        // From here on only renames remain (each after its file's fsync). Should one fail, the
        // folders opening made are removed only when empty, so nothing published is lost.
        self.quarantine
            .take()
            .expect("open until published")
            .finish()?;
        let staged = std::mem::take(&mut self.staged);
        staged.publish()
    }
}
