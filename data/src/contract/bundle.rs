//! The export bundle (contracts section 5): its file names and schema, and the manifest walk that
//! `bundle verify` and the worker both run before they trust a file: every listed path inside the
//! bundle, every file's size and SHA-256 as listed, no file unlisted, and no symbolic link
//! anywhere (a bundle is copied to the app as it is, and a link would carry a file from outside
//! it, or none at all, past the hashes).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::tree::hash_file;

pub const SCHEMA: &str = "decision-bundle/1";
pub const MANIFEST: &str = "manifest.json";
pub const DECISION: &str = "decision.json";
pub const TOKENIZER: &str = "tokenizer.json";
pub const THRESHOLDS: &str = super::thresholds::FILE;
pub const ADAPTER_DIR: &str = "adapter";

/// One file of the bundle: path relative to the bundle (`/`-separated), size, SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The temperature the model files apply (manifest.json's `model.temperature`) against
/// decision.json's: a bundle is whole only when they are one positive number (within 1e-9,
/// relative). The problem, when there is one, for `bundle verify` and decision-worker alike.
pub fn temperature_problem(manifest: f64, decision: f64) -> Option<String> {
    if !(manifest.is_finite() && manifest > 0.0) {
        return Some(format!(
            "manifest.json: model.temperature {manifest} is not a positive number"
        ));
    }
    ((manifest - decision).abs() > 1e-9 * manifest.max(1.0)).then(|| {
        format!(
            "decision.json's temperature is {decision}, manifest.json's model.temperature (the \
             one the model files apply) is {manifest}"
        )
    })
}

/// Whether a manifest path names a file inside the bundle (relative, `/`-separated, no `.` or
/// `..` parts).
pub fn inside(rel: &str) -> bool {
    !rel.starts_with('/')
        && !rel.contains('\\')
        && rel
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
}

/// Every file under `dir` except the manifest, as bundle-relative `/`-separated paths, sorted.
pub fn list_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = crate::tree::relative_files(dir)?;
    out.retain(|p| p != MANIFEST);
    Ok(out)
}

/// Every symbolic link under `dir`, as a problem.
pub fn links(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let entries = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                out.push(format!("{}: cannot list ({e})", dir.display()));
                return;
            }
        };
        let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            match entry.file_type() {
                Ok(t) if t.is_symlink() => {
                    let to = std::fs::read_link(&path)
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|_| "?".into());
                    out.push(format!(
                        "{rel}: a symbolic link (to {to}); a bundle holds only regular files and \
                         folders"
                    ));
                }
                Ok(t) if t.is_dir() => walk(root, &path, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

/// What the manifest walk found.
#[derive(Debug, Default)]
pub struct Walk {
    /// Everything wrong, each naming its file.
    pub problems: Vec<String>,
    /// Files whose size and hash were compared.
    pub files_checked: usize,
    /// Files in the folder that the manifest does not list: `bundle verify` refuses them; the
    /// worker reads none of them and says so.
    pub unlisted: Vec<String>,
}

/// Check the folder `dir` against the manifest's `files`: no symbolic links, each listed path
/// inside the bundle with the listed size and SHA-256, and each of `required` listed; files
/// present but unlisted are collected in [`Walk::unlisted`].
pub fn walk(dir: &Path, files: &[FileEntry], required: &[&str]) -> Walk {
    let mut w = Walk {
        problems: links(dir),
        ..Walk::default()
    };
    if !w.problems.is_empty() {
        // A link could make the hashing below read a file outside the bundle.
        return w;
    }
    for f in files {
        if !inside(&f.path) {
            w.problems.push(format!(
                "manifest.json lists {:?}, which is not a path inside the bundle",
                f.path
            ));
            continue;
        }
        match hash_file(&dir.join(&f.path)) {
            Err(e) => w.problems.push(format!("{}: {e:#}", f.path)),
            Ok((bytes, sha)) => {
                w.files_checked += 1;
                if bytes != f.bytes {
                    w.problems.push(format!(
                        "{}: {bytes} bytes, the manifest says {}",
                        f.path, f.bytes
                    ));
                } else if sha != f.sha256 {
                    w.problems.push(format!(
                        "{}: sha256 {sha}, the manifest says {}",
                        f.path, f.sha256
                    ));
                }
            }
        }
    }
    let listed: BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    match list_files(dir) {
        Ok(present) => {
            w.unlisted = present
                .into_iter()
                .filter(|p| !listed.contains(p.as_str()))
                .collect();
        }
        Err(e) => w.problems.push(format!("{}: {e:#}", dir.display())),
    }
    for r in required {
        if !listed.contains(r) {
            w.problems.push(format!(
                "{r}: not listed in manifest.json, so it cannot be trusted"
            ));
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dir: &Path, path: &str) -> FileEntry {
        let (bytes, sha256) = hash_file(&dir.join(path)).unwrap();
        FileEntry {
            path: path.into(),
            bytes,
            sha256,
        }
    }

    #[test]
    fn paths_must_stay_inside() {
        assert!(inside("model.onnx") && inside("adapter/x.json"));
        for bad in ["/etc/passwd", "../x", "a/../b", "a//b", "", "a\\b", "./a"] {
            assert!(!inside(bad), "{bad}");
        }
    }

    #[test]
    fn the_walk_finds_changed_unlisted_missing_outside_and_linked_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(DECISION), "{}").unwrap();
        std::fs::create_dir(d.join(ADAPTER_DIR)).unwrap();
        std::fs::write(d.join("adapter/a.bin"), "weights").unwrap();
        std::fs::write(d.join(MANIFEST), "not read here").unwrap();
        let files = vec![entry(d, DECISION), entry(d, "adapter/a.bin")];
        let ok = walk(d, &files, &[DECISION]);
        assert!(ok.problems.is_empty(), "{:?}", ok.problems);
        assert_eq!(ok.files_checked, 2);

        std::fs::write(d.join("adapter/a.bin"), "weightz").unwrap();
        std::fs::write(d.join("extra.txt"), "x").unwrap();
        let mut listed = files.clone();
        listed.push(FileEntry {
            path: "../outside".into(),
            bytes: 1,
            sha256: "0".into(),
        });
        let w = walk(d, &listed, &[DECISION, TOKENIZER]);
        let all = w.problems.join("\n");
        for want in [
            "adapter/a.bin: sha256",
            "\"../outside\", which is not a path inside",
            "tokenizer.json: not listed",
        ] {
            assert!(all.contains(want), "{want}: {all}");
        }
        assert_eq!(w.unlisted, ["extra.txt"]);

        #[cfg(unix)]
        {
            std::fs::remove_file(d.join("extra.txt")).unwrap();
            let outside = tempfile::NamedTempFile::new().unwrap();
            std::os::unix::fs::symlink(outside.path(), d.join("adapter/link")).unwrap();
            let w = walk(d, &files, &[]);
            assert_eq!(w.problems.len(), 1, "{:?}", w.problems);
            assert!(
                w.problems[0].starts_with("adapter/link: a symbolic link"),
                "{:?}",
                w.problems
            );
            assert_eq!(w.files_checked, 0, "nothing is hashed through a link");
        }
    }
}
