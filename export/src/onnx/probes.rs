//! `probes.jsonl` (contracts section 5): the probe states ([`crate::samples::probes`]) as tokens,
//! with the export's reference answers. Every bundle with `model.onnx` holds it; the export runs
//! the written model on it ([`check`]) and `bundle verify` runs it again, so rewritten weights
//! fail even when the manifest's hashes and claims were rewritten to match.
//!
//! JSON Lines: the first line is the header, `{"schema": "decision-probes/1", "reference": …}`;
//! each further line is one probe (`id`, `input_ids`, `attention_mask`, `option_token_ids`, and
//! the recorded `probs`, `option_logits` and their `temperature`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use decision_data::State;
use decision_train::DecisionModel;
use serde::{Deserialize, Serialize};

use crate::coreml::check::{CheckSample, samples_from};
use crate::graph::DType;
use crate::parity::{self, Batch, Scorer, Scores};
use crate::samples::{option_counts, probes};
use crate::source::BurnScorer;

/// The bundle file holding the probe states, as tokens, with the export's reference answers:
/// `bundle verify` runs them through the bundle's model again (see [`super::verify`]).
pub const PROBES_FILE: &str = "probes.jsonl";
pub(crate) const PROBES_SCHEMA: &str = "decision-probes/1";

/// `probes.jsonl`: one batch-1 sample per probe state ([`probes`]), named by the state's id.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeFile {
    pub schema: String,
    /// What computed the recorded answers (the export's reference forward pass).
    pub reference: String,
    pub probes: Vec<CheckSample>,
}

/// The file's first line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    schema: String,
    reference: String,
}

impl ProbeFile {
    /// The file's bytes: the header line, then a line per probe.
    pub fn to_jsonl(&self) -> Result<Vec<u8>> {
        let mut out = serde_json::to_vec(&Header {
            schema: self.schema.clone(),
            reference: self.reference.clone(),
        })?;
        out.push(b'\n');
        for p in &self.probes {
            serde_json::to_writer(&mut out, p)?;
            out.push(b'\n');
        }
        Ok(out)
    }

    /// Read the file's bytes; an error names the line (1-based) that is not what it should be.
    pub fn parse(bytes: &[u8]) -> Result<ProbeFile> {
        let text = std::str::from_utf8(bytes).context("not UTF-8")?;
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, first)) = lines.next() else {
            bail!("empty: no header line");
        };
        let header: Header = serde_json::from_str(first)
            .context("line 1: not a header {\"schema\", \"reference\"}")?;
        let probes = lines
            .map(|(i, line)| {
                serde_json::from_str(line).with_context(|| format!("line {}: not a probe", i + 1))
            })
            .collect::<Result<_>>()?;
        Ok(ProbeFile {
            schema: header.schema,
            reference: header.reference,
            probes,
        })
    }
}

/// Score the probe states of `model` (its points, up to its `max_options`) with the reference
/// forward pass at `temperature`.
pub fn record(model: &DecisionModel, reference: &str, temperature: f64) -> Result<ProbeFile> {
    let states = probes(&model.spec.points, model.spec.max_options);
    let mut batches = Vec::new();
    let mut ids = Vec::new();
    for k in option_counts(model.spec.max_options) {
        let group: Vec<&State> = states.iter().filter(|s| s.candidates.len() == k).collect();
        for chunk in group.chunks(8) {
            let rows = chunk
                .iter()
                .map(|s| {
                    model
                        .encode(s)
                        .with_context(|| format!("encoding probe state {:?}", s.id))
                })
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<(&[u32], &[u32])> = rows
                .iter()
                .map(|e| (e.input_ids.as_slice(), e.option_token_ids.as_slice()))
                .collect();
            batches.push(Batch::left_padded(&refs, model.pad_id)?);
            ids.extend(chunk.iter().map(|s| s.id.clone()));
        }
    }
    let scorer = BurnScorer {
        model,
        temperature,
        label: reference.to_string(),
    };
    let mut samples = samples_from(&scorer, &batches, temperature)?;
    if samples.len() != ids.len() {
        bail!(
            "the reference scored {} probe states, {} were asked",
            samples.len(),
            ids.len()
        );
    }
    for (s, id) in samples.iter_mut().zip(ids) {
        s.id = id;
    }
    Ok(ProbeFile {
        schema: PROBES_SCHEMA.into(),
        reference: reference.to_string(),
        probes: samples,
    })
}

/// A probe's recorded answer, replayed.
struct Recorded<'a>(&'a crate::coreml::check::CheckSample);

impl Scorer for Recorded<'_> {
    fn describe(&self) -> String {
        format!("the answers recorded in {PROBES_FILE}")
    }
    fn score(&self, _: &Batch) -> Result<Scores> {
        Ok(Scores {
            logits: vec![self.0.option_logits.clone()],
            probs: vec![self.0.probs.clone()],
        })
    }
}

/// Read `probes.jsonl` in `dir` and run `model` on each probe (batch 1, unpadded), with the parity
/// gate's rule for `dtype` ([`parity::compare`]); an error names every probe that misses, or a
/// set of probes narrower than `max_options`. Returns how many probes ran and the largest gap.
pub fn check(
    dir: &Path,
    model: &dyn Scorer,
    dtype: DType,
    max_options: usize,
) -> Result<(usize, f32)> {
    let path = dir.join(PROBES_FILE);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let file = ProbeFile::parse(&bytes)
        .with_context(|| format!("{}: not a probe file", path.display()))?;
    if file.schema != PROBES_SCHEMA {
        anyhow::bail!(
            "schema is {:?}, this build reads {:?}",
            file.schema,
            PROBES_SCHEMA
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
