//! `decision bundle verify BUNDLE`: what the desktop app (or a release script) runs before it
//! trusts a bundle. Every problem found is reported; any problem fails the check.
//!
//! - `manifest.json`: schema `decision-bundle/1`, the fields [`crate::bundle::Manifest`] needs;
//! - files: each listed file exists with its size and SHA-256; no file is unlisted;
//! - `decision.json`: decision-config/1 as decision-train reads it, and its label token ids are
//!   what `tokenizer.json` encodes the labels as;
//! - `thresholds.json` (when present): decision-thresholds/1 (contracts section 4);
//! - `adapter/`: a PEFT LoRA adapter whose keys fit the model's config;
//! - `model.onnx`: decodes, has the contract interface, the opset the manifest says, external data
//!   that stays inside the bundle and within its file, and the manifest's parameter count;
//! - `probes.json` (every bundle with `model.onnx`): the probe states, as tokens, with the
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
use crate::graph::DType;
use crate::onnx;
use crate::parity::{self, Batch, Scorer, Scores, TractModel};
use crate::samples::{self, ProbeFile};

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
    // The manifest walk the worker runs too; here an unlisted file is a problem as well.
    let walk = decision_data::contract::bundle::walk(
        dir,
        &manifest.files,
        &[bundle::DECISION, bundle::TOKENIZER],
    );
    v.files_checked = walk.files_checked;
    v.problems.extend(walk.problems);
    for p in walk.unlisted {
        v.problems
            .push(format!("{p}: in the bundle but not in manifest.json"));
    }
    let listed: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    check_decision(dir, &mut v);
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
        && let Err(e) = crate::lora::LoraAdapter::load(&dir.join(peft), cfg)
    {
        v.problems.push(format!("{peft}/: {e:#}"));
    }
    if let Some(o) = &manifest.formats.onnx
        && let Err(e) = check_onnx(dir, o, &manifest)
    {
        v.problems.push(format!("{}: {e:#}", o.file));
    }
    if let Some(c) = &manifest.formats.coreml
        && let Err(e) = check_coreml(dir, c)
    {
        v.problems.push(format!("{}: {e:#}", c.file));
    }
    check_verifications(&manifest, &mut v);
    // Last, and only on a bundle sound in every other respect (running the model is the slow
    // part): the model on the probe states again.
    if v.problems.is_empty()
        && let Some(o) = &manifest.formats.onnx
        && let Err(e) = rerun_probes(dir, o, &manifest)
    {
        v.problems.push(format!("{}: {e:#}", samples::PROBES_FILE));
    }
    v
}

fn check_decision(dir: &Path, v: &mut Verdict) {
    let path = dir.join(bundle::DECISION);
    let spec = match decision_train::DecisionSpec::from_file(&path) {
        Ok(s) => s,
        Err(e) => {
            v.problems.push(format!("{}: {e:#}", bundle::DECISION));
            return;
        }
    };
    let tok = match decision_train::tokenizer::load(&dir.join(bundle::TOKENIZER)) {
        Ok(t) => t,
        Err(e) => {
            v.problems.push(format!("{}: {e:#}", bundle::TOKENIZER));
            return;
        }
    };
    match decision_train::tokenizer::label_token_ids(&tok, &spec.labels, spec.max_options) {
        Err(e) => v.problems.push(format!("{}: {e:#}", bundle::TOKENIZER)),
        Ok(ids) if ids != spec.label_token_ids => v.problems.push(format!(
            "decision.json lists label token ids {:?}, tokenizer.json encodes the labels as {ids:?}",
            spec.label_token_ids
        )),
        Ok(_) => {}
    }
}

/// `thresholds.json` against contracts section 4 (its one reader, `decision_data::contract`).
pub fn check_thresholds(path: &Path) -> Result<()> {
    decision_data::contract::thresholds::ThresholdsFile::read(path).map(|_| ())
}

fn check_onnx(dir: &Path, o: &bundle::OnnxFacts, m: &Manifest) -> Result<()> {
    let model = onnx::read_model(&dir.join(&o.file))?;
    let opset = onnx::model_opset(&model);
    if opset != Some(o.opset) {
        anyhow::bail!("imports opset {opset:?}, the manifest says {}", o.opset);
    }
    let graph = model.graph.context("no graph")?;
    let signature = |vi: &onnx::pb::ValueInfoProto| -> (String, i32, usize) {
        match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(onnx::pb::type_proto::Value::TensorType(t)) => (
                vi.name.clone(),
                t.elem_type,
                t.shape.as_ref().map_or(0, |s| s.dim.len()),
            ),
            None => (vi.name.clone(), 0, 0),
        }
    };
    let (i64_t, f32_t) = (
        onnx::pb::tensor_proto::DataType::Int64 as i32,
        onnx::pb::tensor_proto::DataType::Float as i32,
    );
    let want_in = [
        ("input_ids", i64_t),
        ("attention_mask", i64_t),
        ("option_token_ids", i64_t),
    ];
    let want_out = [("option_logits", f32_t), ("option_probs", f32_t)];
    let got_in: Vec<_> = graph.input.iter().map(signature).collect();
    let got_out: Vec<_> = graph.output.iter().map(signature).collect();
    let want = |w: &[(&str, i32)]| -> Vec<(String, i32, usize)> {
        w.iter().map(|(n, t)| (n.to_string(), *t, 2)).collect()
    };
    if got_in != want(&want_in) || got_out != want(&want_out) {
        anyhow::bail!(
            "interface {got_in:?} -> {got_out:?} is not the contract's (input_ids, attention_mask, option_token_ids: int64 \
             [batch, seq|options] -> option_logits, option_probs: float [batch, options])"
        );
    }
    let mut parameters = 0u64;
    for t in &graph.initializer {
        if !t.name.starts_with("const/") {
            parameters += t.dims.iter().product::<i64>().max(0) as u64;
        }
        if t.data_location == onnx::pb::tensor_proto::DataLocation::External as i32 {
            let get = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key == k)
                    .map(|e| e.value.as_str())
            };
            let location = get("location")
                .with_context(|| format!("tensor {} has no external location", t.name))?;
            if o.external_data.as_deref() != Some(location) {
                anyhow::bail!(
                    "tensor {} lives in {location:?}, not the manifest's external data file",
                    t.name
                );
            }
            let size = std::fs::metadata(dir.join(location))
                .with_context(|| format!("{location} is missing"))?
                .len();
            let offset: u64 = get("offset")
                .unwrap_or("0")
                .parse()
                .context("external offset")?;
            let length: u64 = get("length")
                .context("external length")?
                .parse()
                .context("external length")?;
            if offset + length > size {
                anyhow::bail!(
                    "tensor {} reads {location} up to byte {}, the file has {size}",
                    t.name,
                    offset + length
                );
            }
        }
    }
    if parameters != m.model.parameters {
        anyhow::bail!(
            "holds {parameters} weight parameters, the manifest says {}",
            m.model.parameters
        );
    }
    Ok(())
}

/// Run `model.onnx` on the bundle's probe states with tract and hold it to their recorded answers.
fn rerun_probes(dir: &Path, o: &bundle::OnnxFacts, m: &Manifest) -> Result<()> {
    if !m.files.iter().any(|f| f.path == samples::PROBES_FILE) {
        anyhow::bail!(
            "missing: a bundle with {} must hold the probe states its export recorded, to run \
             the model on again",
            o.file
        );
    }
    let dtype = match m.model.dtype.as_str() {
        "f32" => DType::F32,
        "f16" => DType::F16,
        other => anyhow::bail!("manifest.json: model.dtype {other:?} is not f32 or f16"),
    };
    let spec = decision_train::DecisionSpec::from_file(&dir.join(bundle::DECISION))
        .with_context(|| format!("reading {}", bundle::DECISION))?;
    let model = TractModel::load(&dir.join(&o.file))?;
    check_probes(dir, &model, dtype, spec.max_options).map(|_| ())
}

/// A probe's recorded answer, replayed.
struct Recorded<'a>(&'a crate::coreml::check::CheckSample);

impl Scorer for Recorded<'_> {
    fn describe(&self) -> String {
        "the answers recorded in probes.json".into()
    }
    fn score(&self, _: &Batch) -> Result<Scores> {
        Ok(Scores {
            logits: vec![self.0.option_logits.clone()],
            probs: vec![self.0.probs.clone()],
        })
    }
}

/// Read `probes.json` in `dir` and run `model` on each probe (batch 1, unpadded), with the parity
/// gate's rule for `dtype` ([`parity::compare`]); an error names every probe that misses, or a
/// set of probes narrower than `max_options`. Returns how many probes ran and the largest gap.
pub fn check_probes(
    dir: &Path,
    model: &dyn Scorer,
    dtype: DType,
    max_options: usize,
) -> Result<(usize, f32)> {
    let path = dir.join(samples::PROBES_FILE);
    let file: ProbeFile = serde_json::from_value(read_json(&path)?)
        .with_context(|| format!("{}: not a probe file", path.display()))?;
    if file.schema != samples::PROBES_SCHEMA {
        anyhow::bail!(
            "schema is {:?}, this build reads {:?}",
            file.schema,
            samples::PROBES_SCHEMA
        );
    }
    let widest = file
        .probes
        .iter()
        .map(|p| p.option_token_ids.len())
        .max()
        .unwrap_or(0);
    if widest < max_options {
        anyhow::bail!(
            "the widest probe has {widest} options; decision.json's max_options is {max_options}"
        );
    }
    let mut failed = Vec::new();
    let mut max_dp = 0f32;
    for p in &file.probes {
        let options = p.option_token_ids.len();
        if p.input_ids.len() != p.attention_mask.len() || p.probs.len() != options {
            anyhow::bail!(
                "probe {}: {} input ids, {} mask values, {} recorded probabilities for {options} \
                 options",
                p.id,
                p.input_ids.len(),
                p.attention_mask.len(),
                p.probs.len()
            );
        }
        let batch = Batch {
            batch: 1,
            seq: p.input_ids.len(),
            options,
            input_ids: p.input_ids.clone(),
            attention_mask: p.attention_mask.clone(),
            option_token_ids: p.option_token_ids.clone(),
        };
        let r = parity::compare(&p.id, model, &Recorded(p), &[batch], dtype)
            .with_context(|| format!("probe {}", p.id))?;
        max_dp = max_dp.max(r.max_abs_dp);
        if !r.passed {
            failed.push(format!(
                "probe {} ({options} options): max |Δp| {:.3e} (tolerance {:.0e}){}",
                p.id,
                r.max_abs_dp,
                r.tolerance,
                if r.pick_mismatches > 0 {
                    ", a different pick"
                } else {
                    ""
                }
            ));
        }
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{} reproduces {} of {} probe answers recorded by {}: {}",
            model.describe(),
            file.probes.len() - failed.len(),
            file.probes.len(),
            file.reference,
            failed.join("; ")
        );
    }
    Ok((file.probes.len(), max_dp))
}

/// `model.mlpackage`: its structure ([`crate::coreml::verify_package`]) and the facts the
/// manifest states about it.
fn check_coreml(dir: &Path, c: &crate::coreml::CoremlFacts) -> Result<()> {
    let pkg = dir.join(&c.file);
    let summary = crate::coreml::verify_package(&pkg)?;
    let model = crate::coreml::read_model(&pkg)?;
    let dtype = model
        .description
        .as_ref()
        .and_then(|d| d.metadata.as_ref())
        .and_then(|m| m.user_defined.get("dtype"))
        .cloned()
        .unwrap_or_default();
    if dtype != c.dtype {
        anyhow::bail!("holds {dtype:?} weights, the manifest says {:?}", c.dtype);
    }
    if summary.operations != c.operations || summary.weight_blobs != c.weight_blobs {
        anyhow::bail!(
            "has {} operations and {} weight blobs, the manifest says {} and {}",
            summary.operations,
            summary.weight_blobs,
            c.operations,
            c.weight_blobs
        );
    }
    Ok(())
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
