//! `decision bundle verify BUNDLE`: what the desktop app (or a release script) runs before it
//! trusts a bundle. Every problem found is reported; any problem fails the check.
//!
//! - `manifest.json`: schema `decision-bundle/1`, the fields [`crate::bundle::Manifest`] needs;
//! - files: each listed file exists with its size and SHA-256; no file is unlisted;
//! - a model file: the manifest's `formats` name `model.onnx` or `model.mlpackage` (or both);
//! - `decision.json`: decision-config/1 as decision-train reads it, its label token ids are
//!   what `tokenizer.json` encodes the labels as, and its `temperature` is the manifest's
//!   `model.temperature` (decision-worker refuses a bundle where they differ);
//! - `coreml_config.json` (every bundle: keel accepts a model folder only when it holds one):
//!   schema `decision-coreml-config/1`, describing the manifest's `model.mlpackage` or none;
//! - `thresholds.json` (when present): decision-thresholds/1 (contracts section 4);
//! - `adapter/`: a PEFT LoRA adapter whose keys fit the model's config;
//! - `model.onnx`: decodes, has the contract interface, the opset the manifest says, external data
//!   that stays inside the bundle and within its file, and the manifest's parameter count;
//! - `probes.jsonl` (every bundle with `model.onnx`): the probe states, as tokens, with the
//!   export's reference answers; `model.onnx` runs on each again, in tract as the export's parity
//!   gate ran it, and must reproduce them within the gate's tolerance (so rewritten weights fail
//!   even when the manifest's hashes and claims were rewritten to match). The probes must include
//!   a decision as wide as decision.json's `max_options`. This runs last, on a bundle that passed
//!   every other check;
//! - `model.mlpackage`: its structure (manifest, spec version, ML Program, opset, weight records)
//!   and the manifest's facts about it;
//! - `verified_with`: every model file has a parity check that passed (for model.mlpackage, one
//!   recorded as not run, for want of coremltools, is a note when its structure check passed).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::Qwen3Config;
use crate::bundle::{self, Manifest};
use crate::{coreml, onnx};

/// The outcome: files checked and problems found (empty = the bundle is sound).
#[derive(Debug, Default)]
pub struct Verdict {
    pub files_checked: usize,
    pub problems: Vec<String>,
    /// Facts worth saying that are not problems (a check that could not run at export).
    pub notes: Vec<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

/// Check a bundle folder.
pub fn verify(dir: &Path) -> Verdict {
    let mut v = Verdict::default();
    let manifest_path = dir.join(bundle::MANIFEST);
    let manifest = match read_json(&manifest_path).and_then(|j| {
        match j.get("schema").and_then(Value::as_str) {
            Some(bundle::SCHEMA) => {}
            other => anyhow::bail!("schema is {other:?}, this build reads {:?}", bundle::SCHEMA),
        }
        serde_json::from_value::<Manifest>(j).context("not a decision bundle manifest")
    }) {
        Ok(m) => m,
        Err(e) => {
            v.problems
                .extend(decision_data::contract::bundle::links(dir));
            v.problems
                .push(format!("{}: {e:#}", manifest_path.display()));
            return v;
        }
    };
    // Contracts section 5: a bundle holds a model file the harness can run.
    if manifest.formats.onnx.is_none() && manifest.formats.coreml.is_none() {
        v.problems.push(
            "manifest.json: formats names no model file (neither model.onnx nor \
             model.mlpackage), so the harness has nothing to run; export again with --formats \
             onnx (or coreml)"
                .into(),
        );
    }
    // The manifest walk the worker runs too; here an unlisted file is a problem as well.
    // coreml_config.json is required: keel accepts a model folder only when it holds one.
    let mut required = vec![bundle::DECISION, bundle::TOKENIZER, coreml::config::FILE];
    if let Some(o) = &manifest.formats.onnx {
        required.push(o.file.as_str());
    }
    let walk = decision_data::contract::bundle::walk(dir, &manifest.files, &required);
    v.files_checked = walk.files_checked;
    v.problems.extend(walk.problems);
    for p in walk.unlisted {
        v.problems
            .push(format!("{p}: in the bundle but not in manifest.json"));
    }
    let listed: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    check_decision(dir, &manifest, &mut v);
    if listed.contains(coreml::config::FILE) {
        check_coreml_config(dir, &manifest, &mut v);
    }
    if listed.contains(bundle::THRESHOLDS)
        && let Err(e) = check_thresholds(&dir.join(bundle::THRESHOLDS))
    {
        // The error names the file.
        v.problems.push(format!("{e:#}"));
    }
    let config = Qwen3Config::from_json(&manifest.model.config);
    if let Err(e) = &config {
        v.problems
            .push(format!("manifest.json: model.config: {e:#}"));
    }
    if let (Some(peft), Ok(cfg)) = (&manifest.formats.peft, &config)
        && let Err(e) = decision_train::model::peft::PeftAdapter::load(&dir.join(peft), cfg)
    {
        v.problems.push(format!("{peft}/: {e:#}"));
    }
    if let Some(o) = &manifest.formats.onnx
        && let Err(e) = onnx::verify::check(dir, o, &manifest)
    {
        v.problems.push(format!("{}: {e:#}", o.file));
    }
    if let Some(c) = &manifest.formats.coreml
        && let Err(e) = coreml::verify::check(dir, c)
    {
        v.problems.push(format!("{}: {e:#}", c.file));
    }
    check_verifications(&manifest, &mut v);
    // Last, and only on a bundle sound in every other respect (running the model is the slow
    // part): the model on the probe states again.
    if v.problems.is_empty()
        && let Some(o) = &manifest.formats.onnx
        && let Err(e) = onnx::verify::rerun_probes(dir, o, &manifest)
    {
        v.problems
            .push(format!("{}: {e:#}", onnx::probes::PROBES_FILE));
    }
    v
}

fn check_decision(dir: &Path, manifest: &Manifest, v: &mut Verdict) {
    let path = dir.join(bundle::DECISION);
    let spec = match decision_prompt::DecisionSpec::from_file(&path) {
        Ok(s) => s,
        Err(e) => {
            v.problems.push(format!("{}: {e:#}", bundle::DECISION));
            return;
        }
    };
    // The temperature the model files apply, twice: decision-worker refuses a bundle whose two
    // differ, by the same rule.
    v.problems
        .extend(decision_data::contract::bundle::temperature_problem(
            manifest.model.temperature,
            spec.temperature,
        ));
    let tok = match decision_prompt::tokenizer::load(&dir.join(bundle::TOKENIZER)) {
        Ok(t) => t,
        Err(e) => {
            v.problems.push(format!("{}: {e:#}", bundle::TOKENIZER));
            return;
        }
    };
    match decision_prompt::tokenizer::label_token_ids(&tok, &spec.labels, spec.max_options) {
        Err(e) => v.problems.push(format!("{}: {e:#}", bundle::TOKENIZER)),
        Ok(ids) if ids != spec.label_token_ids => v.problems.push(format!(
            "decision.json lists label token ids {:?}, tokenizer.json encodes the labels as {ids:?}",
            spec.label_token_ids
        )),
        Ok(_) => {}
    }
}

/// `coreml_config.json` read as the exporter wrote it ([`coreml::config::read`]), describing the
/// bundle's `model.mlpackage`, or saying there is none, as the manifest does.
fn check_coreml_config(dir: &Path, manifest: &Manifest, v: &mut Verdict) {
    let file = coreml::config::FILE;
    let config = match coreml::config::read(&dir.join(file)) {
        Ok(c) => c,
        Err(e) => {
            v.problems.push(format!("{file}: {e:#}"));
            return;
        }
    };
    let package = manifest.formats.coreml.as_ref().map(|c| c.file.as_str());
    if config.package.as_deref() != package {
        let say = |p: Option<&str>| p.map_or("none".to_string(), |p| format!("{p:?}"));
        v.problems.push(format!(
            "{file}: describes package {}, manifest.json's formats.coreml names {}",
            say(config.package.as_deref()),
            say(package)
        ));
    }
}

/// `thresholds.json` against contracts section 4 (its one reader, `decision_data::contract`).
pub(crate) fn check_thresholds(path: &Path) -> Result<()> {
    decision_data::contract::thresholds::ThresholdsFile::read(path).map(|_| ())
}

fn check_verifications(m: &Manifest, v: &mut Verdict) {
    let mut model_files = Vec::new();
    if let Some(o) = &m.formats.onnx {
        model_files.push(o.file.clone());
    }
    let passed = |check: &str, f: &str| {
        m.verified_with.iter().any(|e| {
            e.get("check").and_then(Value::as_str) == Some(check)
                && e.get("file").and_then(Value::as_str) == Some(f)
                && e.get("passed").and_then(Value::as_bool) == Some(true)
        })
    };
    for entry in &m.verified_with {
        let skipped = entry.get("ran").and_then(Value::as_bool) == Some(false);
        if !skipped && entry.get("passed").and_then(Value::as_bool) != Some(true) {
            v.problems.push(format!(
                "manifest.json: verified_with holds a check that did not pass: {entry}"
            ));
        }
    }
    for f in model_files {
        if !passed("parity", &f) {
            v.problems.push(format!(
                "{f}: no passed parity check in manifest.json's verified_with"
            ));
        }
    }
    // Core ML runs only on Apple platforms; its parity check needs coremltools. Without it the
    // exporter records the check as not run, and the package's structure check must have passed.
    if let Some(c) = &m.formats.coreml
        && !passed("parity", &c.file)
    {
        let skipped = m.verified_with.iter().find(|e| {
            e.get("file").and_then(Value::as_str) == Some(c.file.as_str())
                && e.get("ran").and_then(Value::as_bool) == Some(false)
        });
        match skipped {
            Some(e) if passed("structure", &c.file) => v.notes.push(format!(
                "{}: its coremltools parity check did not run at export ({}); only its structure \
                 was checked",
                c.file,
                e.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
            )),
            _ => v.problems.push(format!(
                "{}: no passed parity check in manifest.json's verified_with",
                c.file
            )),
        }
    }
}
