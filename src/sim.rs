//! `decision sim`'s model: a bundle is scored through decision-worker's `decide` (the code the
//! harness runs: manifest hashes, `decision.json`, tokenizer, tract on `model.onnx`), a training
//! run or model folder by decision-train. decision-sim itself links neither.

use std::path::Path;

use anyhow::Result;
use decision_data::State;
use decision_sim::Scorer;
use decision_sim::cli::LoadedModel;
use decision_worker::bundle::{Bundle, MANIFEST};
use decision_worker::protocol::Request;
use decision_worker::{Answer, ServeOptions, decide};

/// Load `--model SRC`: a folder with a `manifest.json` is a bundle, anything else a run or model
/// folder (or a Hub id).
pub fn load(src: &str) -> Result<LoadedModel> {
    if Path::new(src).join(MANIFEST).is_file() {
        let bundle = Bundle::load(Path::new(src))?;
        let thresholds = bundle.has_thresholds.then(|| bundle.thresholds.clone());
        eprintln!(
            "sim: bundle {src} (model.onnx {}), {}",
            &bundle.model_sha256[..12],
            if thresholds.is_some() {
                "with its thresholds.json"
            } else {
                "no thresholds.json"
            }
        );
        return Ok(LoadedModel {
            scorer: Box::new(BundleScorer {
                bundle,
                name: src.to_string(),
            }),
            thresholds,
        });
    }
    let loaded = decision_train::run_folder::load("--model", src, decision_train::Backend::Cpu)?;
    eprintln!(
        "sim: model {} ({} parameters) on the CPU",
        loaded.name,
        loaded.dm.config.parameter_count()
    );
    Ok(LoadedModel {
        scorer: Box::new(ModelScorer { loaded }),
        thresholds: None,
    })
}

/// A bundle, as the worker answers keel: each state is the request keel would send (the state
/// text and the candidates), at the state's own decision point.
struct BundleScorer {
    bundle: Bundle,
    name: String,
}

impl Scorer for BundleScorer {
    /// The states of a call in parallel, one `decide` each (a request is answered alone, batch
    /// 1, as keel sends them).
    fn score(&mut self, states: &[&State]) -> Result<Vec<Option<Vec<f64>>>> {
        use rayon::prelude::*;
        states
            .par_iter()
            .map(|s| {
                let req = Request {
                    state: s.context.clone(),
                    candidates: s
                        .candidates
                        .iter()
                        .map(|c| (c.id.clone(), c.label.clone()))
                        .collect(),
                };
                let opts = ServeOptions {
                    point: Some(s.point.clone()),
                };
                match decide(&self.bundle, &opts, &req) {
                    // One candidate is not a question the model was trained on: the worker never
                    // accepts it, so neither does the simulation.
                    Answer::Decision {
                        escalated: Some("single-candidate"),
                        ..
                    } => Ok(None),
                    Answer::Decision { probs, .. } => Ok(Some(probs)),
                    Answer::Capacity { .. } => Ok(None),
                    Answer::Inference { reason } => {
                        anyhow::bail!("{}: state {}: {reason}", self.name, s.id)
                    }
                }
            })
            .collect()
    }

    fn name(&self) -> String {
        format!("bundle {}", self.name)
    }

    fn parallelism(&self) -> usize {
        rayon::current_num_threads()
    }
}

/// A run or model folder, scored as `decision score` scores: states the model cannot take
/// (more options than it labels, a prompt cut to fit) go to the LLM, as the worker's
/// `capacity` answer does.
struct ModelScorer {
    loaded: decision_train::run_folder::Loaded,
}

impl Scorer for ModelScorer {
    fn score(&mut self, states: &[&State]) -> Result<Vec<Option<Vec<f64>>>> {
        let dm = &self.loaded.dm;
        let mut out = vec![None; states.len()];
        let mut take = Vec::new();
        let mut encoded = Vec::new();
        for (i, s) in states.iter().enumerate() {
            if s.candidates.len() < 2 || s.candidates.len() > dm.spec.max_options {
                continue;
            }
            let enc = dm.encode(s)?;
            if enc.truncated {
                continue;
            }
            take.push(i);
            encoded.push(enc);
        }
        let points: Vec<&str> = take.iter().map(|&i| states[i].point.as_str()).collect();
        let scores = dm.score_encoded(&encoded, &points, encoded.len().max(1), &mut |_| {});
        let logits: Vec<Vec<f64>> = scores.iter().map(|s| s.logits.clone()).collect();
        decision_train::model::score::check_finite(&logits, &|j| {
            format!("state {:?}", states[take[j]].id)
        })?;
        for (&i, sc) in take.iter().zip(scores) {
            out[i] = Some(sc.probs);
        }
        Ok(out)
    }

    fn name(&self) -> String {
        self.loaded.name.clone()
    }
}
