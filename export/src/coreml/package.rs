//! The `.mlpackage` folder and its `Manifest.json`.
//!
//! ```text
//! model.mlpackage/
//!   Manifest.json                              fileFormatVersion 1.0.0, one item per entry below,
//!                                              rootModelIdentifier = the model.mlmodel item
//!   Data/com.apple.CoreML/model.mlmodel        the Model protobuf
//!   Data/com.apple.CoreML/weights/weight.bin   MIL blob storage (see [`super::blob`])
//! ```
//!
//! Item identifiers are UUID-shaped strings derived from the model file's SHA-256, so exporting the
//! same model twice gives byte-identical packages.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The package's folder name inside a bundle.
pub(crate) const PACKAGE_DIR: &str = "model.mlpackage";
pub(crate) const MANIFEST_FILE: &str = "Manifest.json";
/// Path of the model item, relative to `Data/`.
pub(crate) const MODEL_ITEM: &str = "com.apple.CoreML/model.mlmodel";
/// Path of the weights item (a folder), relative to `Data/`.
pub(crate) const WEIGHTS_ITEM: &str = "com.apple.CoreML/weights";
pub(crate) const WEIGHT_FILE: &str = "weight.bin";
pub(crate) const AUTHOR: &str = "com.apple.CoreML";

/// Where the files of a package at `root` live.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    pub fn manifest(&self) -> PathBuf {
        self.root.join(MANIFEST_FILE)
    }

    pub fn model(&self) -> PathBuf {
        self.root.join("Data").join(MODEL_ITEM)
    }

    pub(crate) fn weights_dir(&self) -> PathBuf {
        self.root.join("Data").join(WEIGHTS_ITEM)
    }

    pub fn weights(&self) -> PathBuf {
        self.weights_dir().join(WEIGHT_FILE)
    }
}

/// A UUID-shaped identifier (version 4 / RFC 4122 variant bits) from the first 16 bytes of
/// `SHA-256(salt ‖ data)`.
fn identifier(salt: &str, data: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(data);
    let mut b: [u8; 16] = h.finalize()[..16].try_into().expect("16 bytes");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let x = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// `Manifest.json` for a package whose model file holds `model_bytes`.
pub fn manifest(model_bytes: &[u8]) -> Value {
    let model_id = identifier(MODEL_ITEM, model_bytes);
    let weights_id = identifier(WEIGHTS_ITEM, model_bytes);
    json!({
        "fileFormatVersion": "1.0.0",
        "itemInfoEntries": {
            model_id.clone(): {
                "author": AUTHOR,
                "description": "CoreML Model Specification",
                "name": "model.mlmodel",
                "path": MODEL_ITEM,
            },
            weights_id: {
                "author": AUTHOR,
                "description": "CoreML Model Weights",
                "name": "weights",
                "path": WEIGHTS_ITEM,
            },
        },
        "rootModelIdentifier": model_id,
    })
}

/// Read `Manifest.json` and return the root model item's path (relative to `Data/`), checking the
/// fields Core ML relies on.
pub fn read_manifest(root: &Path) -> Result<String> {
    let path = root.join(MANIFEST_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", path.display()))?;
    let field = |k: &str| {
        v.get(k)
            .with_context(|| format!("{}: field `{k}` missing", path.display()))
    };
    if field("fileFormatVersion")?.as_str() != Some("1.0.0") {
        bail!(
            "{}: field `fileFormatVersion` is not \"1.0.0\"",
            path.display()
        );
    }
    let root_id = field("rootModelIdentifier")?.as_str().with_context(|| {
        format!(
            "{}: field `rootModelIdentifier` is not a string",
            path.display()
        )
    })?;
    let entries = field("itemInfoEntries")?.as_object().with_context(|| {
        format!(
            "{}: field `itemInfoEntries` is not an object",
            path.display()
        )
    })?;
    let item = entries.get(root_id).with_context(|| {
        format!(
            "{}: `rootModelIdentifier` {root_id} names no entry of `itemInfoEntries`",
            path.display()
        )
    })?;
    let item_path = item
        .get("path")
        .and_then(Value::as_str)
        .with_context(|| format!("{}: entry {root_id}: field `path` missing", path.display()))?;
    if !entries
        .values()
        .any(|e| e.get("path").and_then(Value::as_str) == Some(WEIGHTS_ITEM))
    {
        bail!(
            "{}: no `itemInfoEntries` entry for `{WEIGHTS_ITEM}`",
            path.display()
        );
    }
    Ok(item_path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_the_root_model_and_the_weights() {
        let m = manifest(b"model bytes");
        let root = m["rootModelIdentifier"].as_str().unwrap();
        assert_eq!(root.len(), 36);
        assert_eq!(&root[14..15], "4");
        let entries = m["itemInfoEntries"].as_object().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[root]["path"], MODEL_ITEM);
        assert_eq!(entries[root]["author"], AUTHOR);
        assert!(entries.values().any(|e| e["path"] == WEIGHTS_ITEM));
        assert_eq!(m, manifest(b"model bytes"));
        assert_ne!(
            m["rootModelIdentifier"],
            manifest(b"other")["rootModelIdentifier"]
        );

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MANIFEST_FILE), m.to_string()).unwrap();
        assert_eq!(read_manifest(dir.path()).unwrap(), MODEL_ITEM);
        let mut bad = m.clone();
        bad["rootModelIdentifier"] = json!("nope");
        std::fs::write(dir.path().join(MANIFEST_FILE), bad.to_string()).unwrap();
        let err = read_manifest(dir.path()).unwrap_err().to_string();
        assert!(err.contains("names no entry"), "{err}");
    }
}
