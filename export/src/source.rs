//! What an export reads: the model folder (a run's `final/`, a local folder or a Hub id), its
//! weights (with a PEFT adapter merged in when one is given), the training-side model the parity
//! gate compares against, and the sample states.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use decision_data::State;
use decision_prompt::Encoded;
use decision_train::model::hub::{self, HubEnv, ModelDir};
use decision_train::run_folder;
use decision_train::{Backend, DecisionModel, LoadOptions, Precision};

use crate::Qwen3Config;
use crate::lora::MergedSource;
use crate::parity::{Batch, Scorer, Scores};
use crate::samples;
use decision_train::model::peft::PeftAdapter;
use decision_train::model::weights::{SafetensorsDir, WeightSource};

/// Where the model comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A run folder of ours (`decision train --out RUN_DIR`).
    Run(PathBuf),
    /// A Hugging Face checkpoint (folder or Hub id), optionally with a PEFT adapter.
    Model {
        src: String,
        adapter: Option<PathBuf>,
    },
}

/// Everything an export needs, resolved and checked.
pub struct Source {
    pub model_dir: PathBuf,
    /// What the user named, for messages.
    pub origin: String,
    /// The base model the adapter applies to (or the model itself without one).
    pub base: String,
    pub config: Qwen3Config,
    /// `config.json` as read, for the manifest.
    pub config_json: serde_json::Value,
    /// The training-side model: prompt, tokenizer, spec, and the Burn forward pass.
    pub model: DecisionModel,
    /// How the reference was built, for the manifest.
    pub reference: String,
    /// The weights the model files get (adapter merged).
    pub weights: Arc<dyn WeightSource>,
    pub adapter: Option<PeftAdapter>,
    pub samples: Vec<State>,
    /// Where the samples came from.
    pub samples_from: String,
}

fn load_options() -> LoadOptions {
    LoadOptions {
        backend: Backend::Cpu,
        precision: Precision::F32,
        hub: None,
        trains: false,
    }
}

fn read_config(dir: &Path) -> Result<(Qwen3Config, serde_json::Value)> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", path.display()))?;
    let cfg = Qwen3Config::from_json(&json)
        .with_context(|| format!("{}: not an exportable Qwen3 config", path.display()))?;
    Ok((cfg, json))
}

impl Source {
    /// Resolve and load. `check_data` overrides the sample states; at most `limit` are used.
    pub fn open(origin: &Origin, check_data: Option<&Path>, limit: usize) -> Result<Self> {
        let mut source = match origin {
            Origin::Run(run) => Self::open_run(run)?,
            Origin::Model { src, adapter } => Self::open_model(src, adapter.as_deref())?,
        };
        if let Some(path) = check_data {
            source.samples = samples::read(path, source.model.spec.max_options, limit)?;
            source.samples_from = path.display().to_string();
        } else {
            source.samples = samples::spread(std::mem::take(&mut source.samples), limit);
        }
        Ok(source)
    }

    fn open_run(run: &Path) -> Result<Self> {
        if !run.is_dir() {
            bail!(
                "--run {}: no such folder (a run folder written by `decision train --out`)",
                run.display()
            );
        }
        let final_dir = run.join("final");
        if !final_dir.join("config.json").is_file() {
            bail!(
                "{}: the run has no final/ model (training unfinished or interrupted); finish it with \
                 `decision train --config … --resume --out {}`",
                run.display(),
                run.display()
            );
        }
        let md = ModelDir {
            dir: final_dir.clone(),
            origin: final_dir.display().to_string(),
        };
        let model = DecisionModel::load_dir(&md, &load_options())?;
        let (config, config_json) = read_config(&final_dir)?;
        // final/ holds the merged weights; final/adapter/ the same adapter for PEFT users.
        let weights: Arc<dyn WeightSource> = Arc::new(SafetensorsDir::open(&final_dir)?);
        let adapter_dir = final_dir.join("adapter");
        let adapter = if adapter_dir.is_dir() {
            Some(PeftAdapter::load(&adapter_dir, &config)?)
        } else {
            None
        };
        let run_cfg = run_folder::config(run)?;
        let base = adapter
            .as_ref()
            .and_then(|a| a.base_model.clone())
            .or_else(|| run_cfg.model.source.clone())
            .unwrap_or_else(|| run.display().to_string());
        // The run's validation states. Reading them may quarantine bad rows; keep that out of the
        // run folder.
        let scratch = tempfile::tempdir().context("a temporary folder")?;
        let valid = run_folder::validation_states(&run_cfg, scratch.path())
            .with_context(|| format!("{}: reading the run's validation states", run.display()))?;
        let samples_from = format!("{} (validation split)", run.display());
        let samples = if valid.is_empty() {
            samples::probes(&model.spec.points, model.spec.max_options)
        } else {
            valid
        };
        Ok(Self {
            model_dir: final_dir,
            origin: run.display().to_string(),
            base,
            config,
            config_json,
            model,
            reference: "burn (decision-train, cpu f32)".into(),
            weights,
            adapter,
            samples,
            samples_from,
        })
    }

    fn open_model(src: &str, adapter_dir: Option<&Path>) -> Result<Self> {
        let md = hub::resolve_as(&format!("--model {src}"), src, &HubEnv::from_env())?;
        let mut model = DecisionModel::load_dir(&md, &load_options())?;
        let (config, config_json) = read_config(&md.dir)?;
        let base_weights: Arc<dyn WeightSource> = Arc::new(SafetensorsDir::open(&md.dir)?);
        let (weights, adapter, reference) = match adapter_dir {
            None => (
                base_weights,
                None,
                "burn (decision-train, cpu f32)".to_string(),
            ),
            Some(dir) => {
                let adapter = PeftAdapter::load(dir, &config)?;
                let merged: Arc<dyn WeightSource> =
                    Arc::new(MergedSource::new(base_weights, Arc::new(adapter.clone()))?);
                // The reference applies the adapter its own way (unmerged, x·W + s·(x·A)·B),
                // reading it from the PEFT files we write, so those are checked too.
                let scratch = tempfile::tempdir().context("a temporary folder")?;
                let mut normalized = adapter.clone();
                normalized.base_model.get_or_insert_with(|| src.to_string());
                normalized.write_peft(scratch.path())?;
                model.model =
                    decision_train::model::lora::load_peft(model.model.clone(), scratch.path())
                        .context("applying the adapter to the reference model")?
                        .0;
                let reference =
                    "burn (decision-train, cpu f32, PEFT adapter applied unmerged)".to_string();
                (merged, Some(adapter), reference)
            }
        };
        let samples = samples::probes(&model.spec.points, model.spec.max_options);
        // The base is what the adapter was merged onto here, whatever its config claims.
        let base = src.to_string();
        Ok(Self {
            model_dir: md.dir.clone(),
            origin: md.origin.clone(),
            base,
            config,
            config_json,
            model,
            reference,
            weights,
            adapter,
            samples,
            samples_from: "built-in probe states".into(),
        })
    }

    /// The sample states, encoded and grouped into left-padded batches (rows of one batch share
    /// their option count).
    pub fn batches(&self, batch_size: usize) -> Result<Vec<Batch>> {
        let mut by_options: std::collections::BTreeMap<usize, Vec<Encoded>> = Default::default();
        for s in &self.samples {
            let e = self
                .model
                .encode(s)
                .with_context(|| format!("encoding sample state {:?}", s.id))?;
            by_options
                .entry(e.option_token_ids.len())
                .or_default()
                .push(e);
        }
        let mut out = Vec::new();
        for group in by_options.values() {
            for chunk in group.chunks(batch_size.max(1)) {
                let rows: Vec<(&[u32], &[u32])> = chunk
                    .iter()
                    .map(|e| (e.input_ids.as_slice(), e.option_token_ids.as_slice()))
                    .collect();
                out.push(Batch::left_padded(&rows, self.model.pad_id)?);
            }
        }
        Ok(out)
    }
}

/// The training-side forward pass as a [`Scorer`]: decision-train's label logits at the answer
/// slot, divided by `temperature`, softmaxed.
pub struct BurnScorer<'a> {
    pub model: &'a DecisionModel,
    pub temperature: f64,
    pub label: String,
}

impl Scorer for BurnScorer<'_> {
    fn describe(&self) -> String {
        self.label.clone()
    }

    fn score(&self, b: &Batch) -> Result<Scores> {
        let rows: Vec<Encoded> = (0..b.batch)
            .map(|r| {
                let span = r * b.seq..(r + 1) * b.seq;
                let input_ids = b.input_ids[span.clone()]
                    .iter()
                    .zip(&b.attention_mask[span])
                    .filter(|(_, m)| **m != 0)
                    .map(|(t, _)| *t as u32)
                    .collect();
                let option_token_ids = b.option_token_ids[r * b.options..(r + 1) * b.options]
                    .iter()
                    .map(|t| *t as u32)
                    .collect();
                Encoded {
                    input_ids,
                    option_token_ids,
                    truncated: false,
                    dropped_context_bytes: 0,
                }
            })
            .collect();
        let refs: Vec<&Encoded> = rows.iter().collect();
        let raw =
            decision_train::model::score::label_logits(&self.model.model, &refs, self.model.pad_id);
        // A reference that overflowed would make NaN probes and a parity gate that compares NaNs.
        decision_train::model::score::check_finite(&raw, &|r| format!("sample row {r} of a batch"))
            .with_context(|| format!("{} (the reference forward pass)", self.label))?;
        let (mut logits, mut probs) = (Vec::new(), Vec::new());
        for r in raw {
            let (p, l) = decision_train::model::score::softmax_t(&r, self.temperature);
            probs.push(p.iter().map(|x| *x as f32).collect());
            logits.push(l.iter().map(|x| *x as f32).collect());
        }
        Ok(Scores { logits, probs })
    }
}
