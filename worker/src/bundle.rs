//! Loading an export bundle (contracts section 5) for serving: every file the worker reads is
//! checked against `manifest.json` (size and SHA-256) before it is used, then `decision.json`,
//! `tokenizer.json`, `thresholds.json` and `model.onnx` (in tract) are loaded and the model is
//! run once on a probe, so a bundle that cannot answer is refused at start-up, not at the first
//! decision.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use decision_data::State;
use decision_prompt::score::softmax_t;
use decision_prompt::{DecisionSpec, Encoded, Prompter};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tract_onnx::prelude::*;

pub use decision_data::contract::bundle::{DECISION, MANIFEST, THRESHOLDS, TOKENIZER};
use decision_data::contract::bundle::{FileEntry, SCHEMA as MANIFEST_SCHEMA};
use decision_data::contract::thresholds::ThresholdsFile;

#[derive(Deserialize)]
struct ManifestOnnx {
    file: String,
    #[serde(default)]
    external_data: Option<String>,
}

#[derive(Deserialize, Default)]
struct ManifestFormats {
    #[serde(default)]
    onnx: Option<ManifestOnnx>,
}

#[derive(Deserialize)]
struct ManifestModel {
    temperature: f64,
    #[serde(default)]
    config: serde_json::Value,
}

/// The parts of `manifest.json` the worker needs (the exporter's `Manifest` has more).
#[derive(Deserialize)]
struct Manifest {
    schema: String,
    model: ManifestModel,
    #[serde(default)]
    formats: ManifestFormats,
    files: Vec<FileEntry>,
}

/// A point's entry in `thresholds.json`: `None` is `threshold: null` (never auto-accept).
pub type Thresholds = BTreeMap<String, Option<f64>>;

/// A bundle ready to answer.
pub struct Bundle {
    pub dir: PathBuf,
    pub spec: DecisionSpec,
    pub prompter: Prompter,
    /// Per point; a point without an entry, or a bundle without `thresholds.json`, escalates.
    pub thresholds: Thresholds,
    pub has_thresholds: bool,
    /// The temperature `model.onnx` divides its option logits by (`decision.json`'s).
    pub model_temperature: f64,
    /// SHA-256 of `manifest.json` (which pins every other file): names the bundle in receipts.
    pub bundle_sha256: String,
    /// SHA-256 of `model.onnx`, from the manifest (and checked).
    pub model_sha256: String,
    /// Files in the folder that the manifest does not list (the worker reads none of them).
    pub unlisted: Vec<String>,
    plan: Arc<TypedRunnableModel>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `thresholds.json` (contracts section 4), read with its one reader: each point's threshold.
pub fn parse_thresholds(bytes: &[u8]) -> Result<Thresholds> {
    Ok(ThresholdsFile::parse(bytes)
        .context(THRESHOLDS)?
        .thresholds())
}

impl Bundle {
    /// Verify and load `dir`. The error says what is wrong (every hash problem at once).
    pub fn load(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!("{}: not a bundle folder", dir.display());
        }
        let manifest_bytes = std::fs::read(dir.join(MANIFEST))
            .with_context(|| format!("reading {}", dir.join(MANIFEST).display()))?;
        let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
            .context("manifest.json: not a decision bundle manifest")?;
        if manifest.schema != MANIFEST_SCHEMA {
            bail!(
                "manifest.json: schema {:?}, this worker reads {MANIFEST_SCHEMA:?}",
                manifest.schema
            );
        }
        let listed: BTreeMap<&str, &FileEntry> = manifest
            .files
            .iter()
            .map(|f| (f.path.as_str(), f))
            .collect();
        let onnx = manifest.formats.onnx.as_ref().context(
            "manifest.json: the bundle holds no model.onnx (export with --formats onnx)",
        )?;

        // The manifest walk `bundle verify` runs: no links, every listed file's size and hash,
        // the files the worker reads listed (thresholds.json when it is there).
        let mut required = vec![DECISION, TOKENIZER, onnx.file.as_str()];
        if let Some(d) = &onnx.external_data {
            required.push(d.as_str());
        }
        if dir.join(THRESHOLDS).exists() {
            required.push(THRESHOLDS);
        }
        let walk = decision_data::contract::bundle::walk(dir, &manifest.files, &required);
        if !walk.problems.is_empty() {
            bail!(
                "the bundle does not match its manifest: {}",
                walk.problems.join("; ")
            );
        }
        let unlisted = walk.unlisted;

        // The small files are read once and re-hashed as read, so what is parsed is what was
        // checked.
        let read_checked = |name: &str| -> Result<Vec<u8>> {
            let bytes = std::fs::read(dir.join(name)).with_context(|| format!("reading {name}"))?;
            let want = &listed[name].sha256;
            if &sha256_hex(&bytes) != want {
                bail!("{name}: changed while the bundle was being loaded");
            }
            Ok(bytes)
        };
        let spec = DecisionSpec::from_slice(&read_checked(DECISION)?, Path::new(DECISION))?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(read_checked(TOKENIZER)?)
            .map_err(|e| anyhow!("tokenizer.json: cannot load: {e}"))?;
        let max_positions = manifest
            .model
            .config
            .get("max_position_embeddings")
            .and_then(|v| v.as_u64())
            .map_or(usize::MAX, |v| v as usize);
        let prompter = Prompter::new(&spec, tokenizer, max_positions)
            .context("decision.json with tokenizer.json")?;
        let (thresholds, has_thresholds) = if listed.contains_key(THRESHOLDS) {
            (parse_thresholds(&read_checked(THRESHOLDS)?)?, true)
        } else {
            (Thresholds::new(), false)
        };
        if let Some(problem) = decision_data::contract::bundle::temperature_problem(
            manifest.model.temperature,
            spec.temperature,
        ) {
            bail!("{problem}");
        }
        let onnx_path = dir.join(&onnx.file);
        let plan = tract_onnx::onnx()
            .model_for_path(&onnx_path)
            .and_then(|m| m.into_optimized())
            .and_then(|m| m.into_runnable())
            .map_err(|e| anyhow!("tract could not load {}: {e:?}", onnx.file))?;
        let bundle = Self {
            dir: dir.to_path_buf(),
            spec,
            prompter,
            thresholds,
            has_thresholds,
            model_temperature: manifest.model.temperature,
            bundle_sha256: sha256_hex(&manifest_bytes),
            model_sha256: listed[onnx.file.as_str()].sha256.clone(),
            unlisted,
            plan,
        };
        bundle.probe().context("the model did not answer a probe")?;
        Ok(bundle)
    }

    /// One decision of two options through the whole path: the model loads, runs and answers
    /// with probabilities.
    fn probe(&self) -> Result<()> {
        let state = self.state(
            "intake",
            "probe",
            &[("a".into(), "yes".into()), ("b".into(), "no".into())],
        );
        let enc = self.prompter.encode(&state)?;
        let p = self.probabilities(&enc, "intake")?;
        if (p.iter().sum::<f64>() - 1.0).abs() > 1e-6 {
            bail!("probabilities {p:?} do not sum to 1");
        }
        Ok(())
    }

    /// The decision state of a request, as training renders states.
    pub fn state(&self, point: &str, context: &str, candidates: &[(String, String)]) -> State {
        State::unlabelled("request", point, context, candidates.iter().cloned())
    }

    /// `option_logits` (divided by the model temperature) of one encoded state, batch 1.
    pub fn option_logits(&self, enc: &Encoded) -> Result<Vec<f32>> {
        let n = enc.input_ids.len();
        let k = enc.option_token_ids.len();
        let t = |data: Vec<i64>, cols: usize| -> Result<TValue> {
            Ok(Tensor::from_shape(&[1, cols], data.as_slice())
                .context("input tensor")?
                .into())
        };
        let ids: Vec<i64> = enc.input_ids.iter().map(|&x| x as i64).collect();
        let opts: Vec<i64> = enc.option_token_ids.iter().map(|&x| x as i64).collect();
        let out = self
            .plan
            .run(tvec![t(ids, n)?, t(vec![1; n], n)?, t(opts, k)?])
            .map_err(|e| anyhow!("tract run failed: {e:?}"))?;
        let view = out[0]
            .to_plain_array_view::<f32>()
            .map_err(|e| anyhow!("option_logits is not f32: {e:?}"))?;
        if view.shape() != [1, k] {
            bail!(
                "option_logits has shape {:?}, expected [1, {k}]",
                view.shape()
            );
        }
        Ok(view.iter().copied().collect())
    }

    /// Calibrated probabilities of the candidates at `point`:
    /// `softmax(option_logits · T_model / T_point)`, as `decision score` computes them from the
    /// raw label logits.
    pub fn probabilities(&self, enc: &Encoded, point: &str) -> Result<Vec<f64>> {
        let logits = self.option_logits(enc)?;
        let raw: Vec<f64> = logits
            .iter()
            .map(|&l| l as f64 * self.model_temperature)
            .collect();
        let (p, _) = softmax_t(&raw, self.spec.temperature_for(point));
        if p.iter().any(|x| !x.is_finite()) {
            bail!("the model produced non-finite probabilities {p:?}");
        }
        Ok(p)
    }

    /// The threshold in force at `point` (`None`: escalate).
    pub fn threshold(&self, point: &str) -> Option<f64> {
        self.thresholds.get(point).copied().flatten()
    }
}
