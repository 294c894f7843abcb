//! The parity gate: run an exported model on sample batches and compare with a reference.
//!
//! The ONNX file runs in-process with `tract-onnx`. A model passes when, over every sample, the
//! largest `|Δp|` between its `option_probs` and the reference's is within tolerance (1e-4 for f32
//! weights, 2e-3 for f16) and it picks the same option, except where the reference itself cannot
//! tell its top two options apart within that tolerance (a near-tie, counted and reported).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use decision_data::stats::first_max;
use serde::Serialize;
use tract_onnx::prelude::*;

use crate::graph::DType;

/// One batch in the exported model's interface: left-padded `input_ids` and `attention_mask`
/// `[batch, seq]`, `option_token_ids` `[batch, options]`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub batch: usize,
    pub seq: usize,
    pub options: usize,
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    pub option_token_ids: Vec<i64>,
}

impl Batch {
    /// Left-pad token rows with `pad_id`; all rows must offer the same number of options.
    pub fn left_padded(rows: &[(&[u32], &[u32])], pad_id: u32) -> Result<Self> {
        let batch = rows.len();
        if batch == 0 {
            bail!("an empty batch");
        }
        let seq = rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
        let options = rows[0].1.len();
        if rows.iter().any(|(_, o)| o.len() != options) {
            bail!("decisions in one batch must share their option count");
        }
        let (mut input_ids, mut attention_mask, mut option_token_ids) =
            (Vec::new(), Vec::new(), Vec::new());
        for (ids, opts) in rows {
            let pad = seq - ids.len();
            input_ids.extend(std::iter::repeat_n(pad_id as i64, pad));
            input_ids.extend(ids.iter().map(|&t| t as i64));
            attention_mask.extend(std::iter::repeat_n(0i64, pad));
            attention_mask.extend(std::iter::repeat_n(1i64, ids.len()));
            option_token_ids.extend(opts.iter().map(|&t| t as i64));
        }
        Ok(Self {
            batch,
            seq,
            options,
            input_ids,
            attention_mask,
            option_token_ids,
        })
    }
}

/// A model's answer for a batch: per row, `option_logits` (divided by T) and `option_probs`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    pub logits: Vec<Vec<f32>>,
    pub probs: Vec<Vec<f32>>,
}

/// Something that scores batches: an exported model, or the training-side forward pass.
pub trait Scorer {
    /// A short description for reports (`tract-onnx 0.23.9`, `burn (decision-train, f32)`).
    fn describe(&self) -> String;
    fn score(&self, batch: &Batch) -> Result<Scores>;
}

/// Another scorer's answers, recorded once and replayed by batch: lets the exporter free the
/// reference model before the exported one is loaded, so the two never share memory.
pub(crate) struct Recorded {
    label: String,
    answers: Vec<(Batch, Scores)>,
}

impl Recorded {
    pub fn record(scorer: &dyn Scorer, batches: &[Batch]) -> Result<Self> {
        let bar = decision_data::progress::task(
            batches.len() as u64,
            "scoring samples with the reference",
        );
        let answers = batches
            .iter()
            .map(|b| {
                let s = scorer.score(b);
                bar.inc(1);
                s.map(|s| (b.clone(), s))
            })
            .collect::<Result<_>>()
            .context("running the reference")?;
        bar.finish_and_clear();
        Ok(Self {
            label: scorer.describe(),
            answers,
        })
    }
}

impl Scorer for Recorded {
    fn describe(&self) -> String {
        self.label.clone()
    }

    fn score(&self, batch: &Batch) -> Result<Scores> {
        self.answers
            .iter()
            .find(|(b, _)| b == batch)
            .map(|(_, s)| s.clone())
            .context("the reference has no recorded answer for this batch")
    }
}

/// An ONNX file loaded into tract, optimised once, run on any batch shape.
pub struct TractModel {
    plan: Arc<TypedRunnableModel>,
}

impl TractModel {
    pub fn load(path: &Path) -> Result<Self> {
        let plan = tract_onnx::onnx()
            .model_for_path(path)
            .and_then(|m| m.into_optimized())
            .and_then(|m| m.into_runnable())
            .map_err(|e| anyhow::anyhow!("tract could not load {}: {e:?}", path.display()))?;
        Ok(Self { plan })
    }
}

impl Scorer for TractModel {
    fn describe(&self) -> String {
        format!("tract-onnx {}", env!("TRACT_ONNX_VERSION"))
    }

    fn score(&self, b: &Batch) -> Result<Scores> {
        let t = |data: &[i64], cols: usize| -> Result<TValue> {
            Ok(Tensor::from_shape(&[b.batch, cols], data)
                .context("input tensor")?
                .into())
        };
        let out = self
            .plan
            .run(tvec![
                t(&b.input_ids, b.seq)?,
                t(&b.attention_mask, b.seq)?,
                t(&b.option_token_ids, b.options)?
            ])
            .map_err(|e| anyhow::anyhow!("tract run failed: {e:?}"))?;
        let rows = |v: &TValue| -> Result<Vec<Vec<f32>>> {
            let view = v
                .to_plain_array_view::<f32>()
                .map_err(|e| anyhow::anyhow!("output is not f32: {e:?}"))?;
            if view.shape() != [b.batch, b.options] {
                bail!(
                    "output shape {:?}, expected [{}, {}]",
                    view.shape(),
                    b.batch,
                    b.options
                );
            }
            Ok(view
                .outer_iter()
                .map(|r| r.iter().copied().collect())
                .collect())
        };
        Ok(Scores {
            logits: rows(&out[0])?,
            probs: rows(&out[1])?,
        })
    }
}

/// The tolerance on `max |Δp|` for a weight dtype.
pub fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 2e-3,
        _ => 1e-4,
    }
}

/// What one parity check found.
#[derive(Debug, Clone, Serialize)]
pub struct ParityReport {
    /// `onnx` (the file checked).
    pub file: String,
    /// What ran the file, and what it was compared with.
    pub runtime: String,
    pub reference: String,
    pub dtype: String,
    pub samples: usize,
    pub max_abs_dp: f32,
    pub max_abs_dlogit: f32,
    pub tolerance: f32,
    /// Samples whose pick differs from the reference's (near-ties excluded).
    pub pick_mismatches: usize,
    /// Samples whose reference top two were within tolerance of each other.
    pub near_ties: usize,
    pub passed: bool,
}

impl ParityReport {
    /// An error naming by how much the check missed, or `Ok` when it passed.
    pub fn ensure(&self) -> Result<()> {
        if self.passed {
            return Ok(());
        }
        bail!(
            "parity check failed for {} ({} vs {}, {} weights): max |Δp| = {:.3e} (tolerance {:.0e}, \
             {:.1}× over), {} of {} picks differ; nothing was published",
            self.file,
            self.runtime,
            self.reference,
            self.dtype,
            self.max_abs_dp,
            self.tolerance,
            self.max_abs_dp / self.tolerance,
            self.pick_mismatches,
            self.samples
        )
    }
}
/// The running maximum of `|x − y|`; a NaN on either side counts as an infinite gap.
fn max_gap(max: f32, x: f32, y: f32) -> f32 {
    let d = (x - y).abs();
    if d.is_nan() {
        f32::INFINITY
    } else {
        max.max(d)
    }
}

/// That `s` holds one row of `b.options` values per row of `b`, logits and probabilities both, so
/// a short answer cannot pass the gate by comparing fewer values.
fn check_shape(s: &Scores, b: &Batch, who: &str, batch_index: usize) -> Result<()> {
    for (what, rows) in [("option_probs", &s.probs), ("option_logits", &s.logits)] {
        if rows.len() != b.batch {
            bail!(
                "batch {batch_index}: {who} returned {} rows of {what} for a batch of {}",
                rows.len(),
                b.batch
            );
        }
        if let Some((r, row)) = rows.iter().enumerate().find(|(_, r)| r.len() != b.options) {
            bail!(
                "batch {batch_index}, row {r}: {who} returned {} {what} for {} options",
                row.len(),
                b.options
            );
        }
    }
    Ok(())
}

/// Compare a candidate with a reference on every batch.
pub fn compare(
    file: &str,
    candidate: &dyn Scorer,
    reference: &dyn Scorer,
    batches: &[Batch],
    dtype: DType,
) -> Result<ParityReport> {
    let tol = tolerance(dtype);
    let (mut max_dp, mut max_dl, mut samples, mut mismatches, mut ties) = (0f32, 0f32, 0, 0, 0);
    for (i, b) in batches.iter().enumerate() {
        let got = candidate
            .score(b)
            .with_context(|| format!("running {file}"))?;
        let want = reference.score(b).context("running the reference")?;
        check_shape(&got, b, file, i)?;
        check_shape(&want, b, "the reference", i)?;
        for (row, (g, w)) in got.probs.iter().zip(&want.probs).enumerate() {
            samples += 1;
            for (x, y) in g.iter().zip(w) {
                max_dp = max_gap(max_dp, *x, *y);
            }
            for (x, y) in got.logits[row].iter().zip(&want.logits[row]) {
                max_dl = max_gap(max_dl, *x, *y);
            }
            let mut sorted = w.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let tie = sorted.len() > 1 && sorted[0] - sorted[1] <= tol;
            if tie {
                ties += 1;
            } else if first_max(g) != first_max(w) {
                mismatches += 1;
            }
        }
    }
    Ok(ParityReport {
        file: file.to_string(),
        runtime: candidate.describe(),
        reference: reference.describe(),
        dtype: dtype.name().to_string(),
        samples,
        max_abs_dp: max_dp,
        max_abs_dlogit: max_dl,
        tolerance: tol,
        pick_mismatches: mismatches,
        near_ties: ties,
        passed: samples > 0 && max_dp <= tol && mismatches == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<Vec<f32>>);
    impl Scorer for Fixed {
        fn describe(&self) -> String {
            "fixed".into()
        }
        fn score(&self, _: &Batch) -> Result<Scores> {
            Ok(Scores {
                logits: self.0.clone(),
                probs: self.0.clone(),
            })
        }
    }

    #[test]
    fn gate_measures_the_gap_and_the_picks() {
        let b = Batch::left_padded(&[(&[5, 6, 7], &[1, 2]), (&[8], &[2, 1])], 0).unwrap();
        assert_eq!(b.input_ids, vec![5, 6, 7, 0, 0, 8]);
        assert_eq!(b.attention_mask, vec![1, 1, 1, 0, 0, 1]);
        let reference = Fixed(vec![vec![0.7, 0.3], vec![0.4, 0.6]]);
        let close = Fixed(vec![vec![0.70005, 0.29995], vec![0.4, 0.6]]);
        let r = compare(
            "onnx",
            &close,
            &reference,
            std::slice::from_ref(&b),
            DType::F32,
        )
        .unwrap();
        assert!(
            r.passed && r.max_abs_dp > 4e-5 && r.max_abs_dp < 6e-5,
            "{r:?}"
        );
        let flipped = Fixed(vec![vec![0.3, 0.7], vec![0.4, 0.6]]);
        let r = compare(
            "onnx",
            &flipped,
            &reference,
            std::slice::from_ref(&b),
            DType::F16,
        )
        .unwrap();
        assert!(!r.passed && r.pick_mismatches == 1);
        let msg = r.ensure().unwrap_err().to_string();
        assert!(
            msg.contains("max |Δp| = 4.000e-1") && msg.contains("1 of 2 picks"),
            "{msg}"
        );
        let nan = Fixed(vec![vec![f32::NAN, 0.3], vec![0.4, 0.6]]);
        assert!(
            !compare("onnx", &nan, &reference, &[b], DType::F32)
                .unwrap()
                .passed
        );
        assert!(Batch::left_padded(&[(&[1], &[1, 2]), (&[1], &[1])], 0).is_err());
    }

    #[test]
    fn the_runtime_named_is_the_tract_onnx_the_workspace_pins() {
        let root =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml")).unwrap();
        let pin = root
            .lines()
            .find_map(|l| l.strip_prefix("tract-onnx = \"="))
            .and_then(|l| l.strip_suffix('"'))
            .expect("Cargo.toml pins tract-onnx");
        assert_eq!(env!("TRACT_ONNX_VERSION"), pin);
    }

    #[test]
    fn a_short_answer_fails_the_gate_instead_of_comparing_less() {
        let b = Batch::left_padded(&[(&[5, 6], &[1, 2]), (&[8], &[2, 1])], 0).unwrap();
        let reference = Fixed(vec![vec![0.7, 0.3], vec![0.4, 0.6]]);
        // One row missing: the rows that are there agree exactly.
        let short = Fixed(vec![vec![0.7, 0.3]]);
        let e = compare(
            "onnx",
            &short,
            &reference,
            std::slice::from_ref(&b),
            DType::F32,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "batch 0: onnx returned 1 rows of option_probs for a batch of 2"
        );
        // One option missing in the second row.
        let narrow = Fixed(vec![vec![0.7, 0.3], vec![0.4]]);
        let e = compare(
            "onnx",
            &narrow,
            &reference,
            std::slice::from_ref(&b),
            DType::F32,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "batch 0, row 1: onnx returned 1 option_probs for 2 options"
        );
        // The reference short: named as such.
        let e = compare("onnx", &reference, &short, &[b], DType::F32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the reference returned 1 rows"), "{e}");
    }
}
