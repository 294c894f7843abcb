//! The bundle folder (contracts section 5) and its `manifest.json`.
//!
//! ```text
//! BUNDLE/
//!   manifest.json        schema decision-bundle/1, written last (see [`Manifest`])
//!   decision.json        prompt template, labels and their token ids, max_options, max_tokens,
//!                        `temperature` (the one the model files apply) and per-point
//!                        `temperatures`, decision points (schema decision-config/1)
//!   tokenizer.json       the tokenizer the model was trained with, byte for byte
//!   thresholds.json      when given (decision-thresholds/1)
//!   model.onnx           + model.onnx.data when the weights are external
//!   model.mlpackage/     Core ML (when built; a bundle holds this or model.onnx, or both)
//!   adapter/             PEFT layout: adapter_config.json, adapter_model.safetensors
//!   coreml_config.json   always (keel accepts a model folder only when it holds this file):
//!                        model.mlpackage's inputs, outputs and shapes, or `package: null`
//!                        when there is none (schema decision-coreml-config/1, coreml::config)
//!   probes.jsonl         with model.onnx: the probe states as tokens with the reference's
//!                        answers, which `bundle verify` runs model.onnx on again
//!                        (decision-probes/1, onnx::probes)
//! ```
//!
//! A bundle is assembled in a hidden sibling folder ([`Staging`]) and renamed into place once
//! complete, so a reader never sees half a bundle.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use decision_data::atomic::StagedDir;
pub use decision_data::tree::hash_file;
use serde::{Deserialize, Serialize};

// The bundle's names, schema and file entries are the contract's (decision_data::contract).
pub use decision_data::contract::bundle::{
    ADAPTER_DIR, DECISION, FileEntry, MANIFEST, SCHEMA, THRESHOLDS, TOKENIZER, list_files,
};

/// The PEFT adapter merged into the model files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterFacts {
    /// Where it came from (a run's `final/adapter`, or `--adapter`).
    pub source: String,
    pub r: usize,
    pub alpha: f64,
    pub target_modules: Vec<String>,
    /// In the bundle as `adapter/` (PEFT layout) when the `peft` format was asked for.
    pub included: bool,
}

/// Facts about the model (contracts: architecture, base, adapter, parameter count, dtype).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFacts {
    pub architecture: String,
    /// The base checkpoint (Hub id or path) — for a LoRA model, what the adapter applies to.
    pub base: String,
    pub adapter: Option<AdapterFacts>,
    /// Weight parameters in the model files (tied tables counted once).
    pub parameters: u64,
    /// Storage type of the weights in the model files (`f32`, `f16`; norms are always f32).
    pub dtype: String,
    /// The temperature the model files divide the option logits by (`decision.json`'s
    /// `temperature`). For a point with its own entry in `temperatures`, use
    /// `softmax(option_logits · temperature / temperatures[point])`.
    pub temperature: f64,
    /// The Hugging Face `config.json` of the model.
    pub config: serde_json::Value,
}

/// `model.onnx` details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxFacts {
    pub file: String,
    /// `model.onnx.data` when the weights are stored beside the graph.
    pub external_data: Option<String>,
    pub opset: i64,
}

/// Which model formats the bundle holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Formats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onnx: Option<OnnxFacts>,
    /// `model.mlpackage` details (its weights may be stored as f16 while model.onnx's are f32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coreml: Option<crate::coreml::CoremlFacts>,
    /// The PEFT adapter folder, when included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peft: Option<String>,
}

/// `manifest.json`. Fields may be added; none is renamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// `decision-export <version>`.
    pub producer: String,
    pub model: ModelFacts,
    /// The decision points the model was trained for (sorted).
    pub points: Vec<String>,
    pub formats: Formats,
    /// Every file of the bundle except the manifest itself.
    pub files: Vec<FileEntry>,
    /// The checks that ran before the manifest was written. Each entry has at least `check`
    /// (`parity`, or `structure` for model.mlpackage), `file` and `passed`; parity entries also say
    /// what ran the file, what it was compared with, on how many samples, the largest |Δp| and the
    /// tolerance. A check that could not run (the coremltools check without Python) is listed with
    /// `ran: false` and its `reason`.
    pub verified_with: Vec<serde_json::Value>,
}

/// Size and hash of every file in the bundle folder.
pub(crate) fn file_entries(dir: &Path) -> Result<Vec<FileEntry>> {
    let bar = decision_data::progress::task(0, "hashing bundle files");
    let entries = list_files(dir)?
        .into_iter()
        .map(|path| {
            let (bytes, sha256) = hash_file(&dir.join(&path))?;
            bar.inc(1);
            Ok(FileEntry {
                path,
                bytes,
                sha256,
            })
        })
        .collect();
    bar.finish_and_clear();
    entries
}

/// A bundle being assembled in a hidden sibling of its final path. Dropped without
/// [`Staging::publish`], the folder is removed (with any parent folders it had to create) and
/// nothing appears at the final path.
#[derive(Debug)]
pub(crate) struct Staging {
    out: PathBuf,
    /// The staging folder, until it is published.
    staged: Option<StagedDir>,
    replace: bool,
    published: bool,
    /// The topmost parent folder [`Staging::new`] created, removed again if nothing is published.
    created: Option<PathBuf>,
}

/// What `out` holds when it is not something `--force` may replace, in words; `None` when it may
/// be replaced: an empty folder, or a folder holding a bundle manifest (`manifest.json` with
/// schema `decision-bundle/...`).
pub(crate) fn not_replaceable(out: &Path) -> Option<String> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot be read ({e})")),
    };
    if meta.file_type().is_symlink() {
        return Some("is a symbolic link, not a bundle folder".into());
    }
    if !meta.is_dir() {
        return Some("is a file, not a bundle folder".into());
    }
    let mut names: Vec<String> = match std::fs::read_dir(out) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| {
                let dir = e.file_type().is_ok_and(|t| t.is_dir());
                format!(
                    "{}{}",
                    e.file_name().to_string_lossy(),
                    if dir { "/" } else { "" }
                )
            })
            .collect(),
        Err(e) => return Some(format!("cannot be listed ({e})")),
    };
    if names.is_empty() {
        return None;
    }
    let manifest = out.join(MANIFEST);
    let schema = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|j| j.get("schema")?.as_str().map(str::to_string));
    match schema {
        Some(s) if s.starts_with("decision-bundle/") => None,
        _ => {
            names.sort();
            let shown = names.len().min(8);
            let more = if names.len() > shown {
                format!(", … ({} entries in all)", names.len())
            } else {
                String::new()
            };
            Some(format!(
                "holds {}{more}, and no bundle manifest ({MANIFEST} with schema {SCHEMA})",
                names[..shown].join(", ")
            ))
        }
    }
}

impl Staging {
    /// Prepare to write `out`, creating the staging folder now (so an unwritable location fails
    /// before any work). An existing `out` is an error unless `replace`, and even then unless it
    /// is an empty folder or a bundle (see [`not_replaceable`]): `--force` replaces a bundle,
    /// never another folder.
    pub fn new(out: &Path, replace: bool) -> Result<Self> {
        if std::fs::symlink_metadata(out).is_ok() {
            if !replace {
                bail!(
                    "{} already exists; pass --force to replace it",
                    out.display()
                );
            }
            if let Some(what) = not_replaceable(out) {
                bail!(
                    "--out {} {what}; --force replaces only an earlier bundle or an empty \
                     folder, so it was left as it is: choose another --out",
                    out.display()
                );
            }
        }
        if out.file_name().is_none() {
            bail!("{}: not a folder name", out.display());
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let created = parent
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .last()
            .map(Path::to_path_buf);
        // Built before any folder is made, so that Drop removes what was made on any error.
        let mut staging = Self {
            out: out.to_path_buf(),
            staged: None,
            replace,
            published: false,
            created,
        };
        std::fs::create_dir_all(&parent).with_context(|| {
            format!(
                "--out {}: cannot create its parent folder {}",
                out.display(),
                parent.display()
            )
        })?;
        staging.staged = Some(StagedDir::create(out).with_context(|| {
            format!(
                "--out {}: cannot write in {}",
                out.display(),
                parent.display()
            )
        })?);
        Ok(staging)
    }

    /// The folder being filled.
    pub fn path(&self) -> &Path {
        self.staged.as_ref().expect("staged until published").path()
    }

    /// Sync the finished folder and rename it into place (replacing the old bundle when allowed;
    /// [`decision_data::atomic::publish_dir`]). If the rename fails, the old bundle is put back
    /// and the staging folder removed.
    pub fn publish(mut self) -> Result<PathBuf> {
        if std::fs::symlink_metadata(&self.out).is_ok() {
            if !self.replace {
                bail!(
                    "{} appeared while the bundle was being written",
                    self.out.display()
                );
            }
            if let Some(what) = not_replaceable(&self.out) {
                bail!(
                    "--out {} {what} (it changed while the bundle was being written); it was \
                     left as it is",
                    self.out.display()
                );
            }
        }
        let staged = self.staged.take().expect("staged until published");
        let out = staged
            .publish()
            .with_context(|| format!("publishing {}", self.out.display()))?;
        self.published = true;
        Ok(out)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            drop(self.staged.take()); // removes the staging folder
            // Parent folders made for this bundle, innermost first; stops at one not empty.
            if let Some(top) = &self.created {
                let mut dir = self.out.parent();
                while let Some(d) = dir {
                    if std::fs::remove_dir(d).is_err() || d == top.as_path() {
                        break;
                    }
                    dir = d.parent();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_publishes_whole_or_not_at_all() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("bundle");
        {
            let s = Staging::new(&out, false).unwrap();
            std::fs::write(s.path().join("a.txt"), b"half").unwrap();
            // dropped: nothing published, nothing left behind
        }
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        let s = Staging::new(&out, false).unwrap();
        std::fs::create_dir(s.path().join("adapter")).unwrap();
        std::fs::write(s.path().join("adapter/x.json"), b"{}").unwrap();
        std::fs::write(
            s.path().join(MANIFEST),
            br#"{"schema": "decision-bundle/1"}"#,
        )
        .unwrap();
        s.publish().unwrap();
        assert_eq!(
            list_files(&out).unwrap(),
            vec!["adapter/x.json".to_string()]
        );
        assert!(
            Staging::new(&out, false)
                .unwrap_err()
                .to_string()
                .contains("--force")
        );
        let s = Staging::new(&out, true).unwrap();
        std::fs::write(s.path().join("b.txt"), b"new").unwrap();
        s.publish().unwrap();
        assert_eq!(list_files(&out).unwrap(), vec!["b.txt".to_string()]);
        let (n, h) = hash_file(&out.join("b.txt")).unwrap();
        assert_eq!(n, 3);
        // sha256("new")
        assert_eq!(
            h,
            "11507a0e2f5e69d5dfa40a62a1bd7b6ee57e6bcd85c67c9b8431b36fff21c437"
        );
    }

    #[test]
    fn force_replaces_only_a_bundle_or_an_empty_folder() {
        let root = tempfile::tempdir().unwrap();
        // A training run: not a bundle, so --force leaves it.
        let run = root.path().join("run");
        std::fs::create_dir_all(run.join("final")).unwrap();
        std::fs::write(run.join("run.toml"), b"name = 'r'").unwrap();
        let e = format!("{:#}", Staging::new(&run, true).unwrap_err());
        assert!(
            e.contains("final/") && e.contains("run.toml") && e.contains("no bundle manifest"),
            "{e}"
        );
        assert!(run.join("run.toml").is_file() && run.join("final").is_dir());
        // A manifest of something else is not a bundle manifest either.
        std::fs::write(run.join(MANIFEST), br#"{"schema": "other/1"}"#).unwrap();
        assert!(Staging::new(&run, true).is_err());
        // A file is never replaced.
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = format!("{:#}", Staging::new(&file, true).unwrap_err());
        assert!(e.contains("is a file"), "{e}");
        // An empty folder, and a bundle, are.
        let empty = root.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let s = Staging::new(&empty, true).unwrap();
        std::fs::write(
            s.path().join(MANIFEST),
            br#"{"schema": "decision-bundle/1"}"#,
        )
        .unwrap();
        s.publish().unwrap();
        let s = Staging::new(&empty, true).unwrap();
        std::fs::write(s.path().join("new.txt"), b"y").unwrap();
        s.publish().unwrap();
        assert_eq!(list_files(&empty).unwrap(), vec!["new.txt".to_string()]);
        // Nothing else was left beside them.
        let mut names: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["empty", "file", "run"]);
    }

    #[test]
    fn an_unpublished_bundle_leaves_no_folders_it_made() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("a/b/bundle");
        {
            let s = Staging::new(&out, false).unwrap();
            assert!(s.path().starts_with(root.path().join("a/b")));
        }
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        // A parent that is a file: the error says --out, and nothing is made.
        std::fs::write(root.path().join("f"), b"").unwrap();
        let e = format!(
            "{:#}",
            Staging::new(&root.path().join("f/x/bundle"), false).unwrap_err()
        );
        assert!(e.contains("--out"), "{e}");
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
    }
}
