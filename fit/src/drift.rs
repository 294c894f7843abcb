//! Refit against the previous thresholds file (`--previous`): per point, old and new threshold,
//! coverage and success, the drift signal (share of accepted answers at or above the old
//! threshold, in the old data and in the new), and whether the change is larger than noise.
//!
//! The noise test: on the new data, the judged records at or above the OLD threshold give a
//! success rate and its two-sided Wilson interval at the point's level. The change is
//! `beyond-noise` when the target lies outside that interval (the old threshold now clearly
//! misses the target, or clearly clears it), `within-noise` when the interval holds the target,
//! `unchanged` when the threshold did not move, and `untestable` when no judged record of the new
//! data lies at or above the old threshold. When the previous file had no threshold for the
//! point, the same test is made at the new threshold (a newly fitted threshold is beyond noise
//! when its lower bound clears the target).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use decision_data::contract::thresholds::ThresholdsFile;
use serde::Serialize;

use crate::aggregate::PointAgg;
use crate::bounds;
use crate::thresholds::PointFit;

/// A previous thresholds.json, read and checked by the contract's one reader.
#[derive(Debug, Clone)]
pub(crate) struct Previous {
    pub file: ThresholdsFile,
}

impl Previous {
    pub fn read(path: &Path) -> Result<Previous> {
        let file = ThresholdsFile::read(path).context("--previous: refusing to compare")?;
        Ok(Previous { file })
    }

    /// The old thresholds to count above, per point.
    pub fn cuts(&self) -> BTreeMap<String, Vec<f64>> {
        self.file
            .points
            .iter()
            .filter_map(|(name, p)| p.threshold.map(|t| (name.clone(), vec![t])))
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Unchanged,
    WithinNoise,
    BeyondNoise,
    Untestable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Unchanged => "unchanged",
            Verdict::WithinNoise => "within noise",
            Verdict::BeyondNoise => "beyond noise",
            Verdict::Untestable => "untestable",
        }
    }
}

/// Success of the new data's judged records at or above a threshold, with its interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tested {
    pub threshold: f64,
    pub n: u64,
    pub success: u64,
    pub rate: f64,
    pub lower: f64,
    pub upper: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftRow {
    pub point: String,
    pub old_status: Option<String>,
    pub new_status: String,
    pub old_threshold: Option<f64>,
    pub new_threshold: Option<f64>,
    pub old_coverage: Option<f64>,
    pub new_coverage: f64,
    pub old_success: Option<f64>,
    pub new_success: Option<f64>,
    /// Share of accepted answers at or above the old threshold: in the old data (the previous
    /// file's coverage) and in the new data.
    pub share_above_old: Option<f64>,
    pub share_above_new: Option<f64>,
    pub target: f64,
    pub tested: Option<Tested>,
    pub verdict: Verdict,
}

fn tested(threshold: f64, n: u64, success: u64, level: f64) -> Option<Tested> {
    let (lower, upper) = bounds::wilson(success, n, level)?;
    Some(Tested {
        threshold,
        n,
        success,
        rate: success as f64 / n as f64,
        lower,
        upper,
    })
}

/// One row per point in either file (a point only in the previous file gets a row with
/// `new_status = "no receipts"`).
pub(crate) fn compare(
    prev: &Previous,
    aggs: &BTreeMap<String, PointAgg>,
    fits: &BTreeMap<String, PointFit>,
) -> Vec<DriftRow> {
    let points = &prev.file.points;
    let mut names: Vec<&String> = points.keys().chain(fits.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let old = points.get(name);
            let (Some(new), Some(agg)) = (fits.get(name), aggs.get(name)) else {
                // In the previous file only: no receipts for it now.
                let old = old?;
                return Some(DriftRow {
                    point: name.clone(),
                    old_status: Some(old.status.as_str().to_string()),
                    new_status: "no receipts".into(),
                    old_threshold: old.threshold,
                    new_threshold: None,
                    old_coverage: old.coverage,
                    new_coverage: 0.0,
                    old_success: old.success_above,
                    new_success: None,
                    share_above_old: old.threshold.and(old.coverage),
                    share_above_new: None,
                    target: f64::NAN,
                    tested: None,
                    verdict: if old.threshold.is_none() {
                        Verdict::Unchanged
                    } else {
                        Verdict::Untestable
                    },
                });
            };
            let old_t = old.and_then(|o| o.threshold);
            let level = new.policy.level;
            let mut share_above_new = None;
            let test = match old_t {
                Some(t) => {
                    let cut = agg
                        .cuts
                        .iter()
                        .find(|c| c.threshold == t)
                        .copied()
                        .unwrap_or_default();
                    share_above_new = Some(if agg.counts.valid == 0 {
                        0.0
                    } else {
                        cut.accepted as f64 / agg.counts.valid as f64
                    });
                    tested(t, cut.n, cut.success, level)
                }
                None => new.threshold.and_then(|t| {
                    let i = agg.bucketing().index(t);
                    let n = agg.buckets[i..].iter().map(|b| b.n).sum();
                    let s = agg.buckets[i..].iter().map(|b| b.success).sum();
                    tested(t, n, s, level)
                }),
            };
            let verdict = if old_t == new.threshold {
                Verdict::Unchanged
            } else {
                match test {
                    None => Verdict::Untestable,
                    Some(t) if new.policy.target < t.lower || new.policy.target > t.upper => {
                        Verdict::BeyondNoise
                    }
                    Some(_) => Verdict::WithinNoise,
                }
            };
            Some(DriftRow {
                point: name.clone(),
                old_status: old.map(|o| o.status.as_str().to_string()),
                new_status: new.status.as_str().to_string(),
                old_threshold: old_t,
                new_threshold: new.threshold,
                old_coverage: old.and_then(|o| o.coverage),
                new_coverage: new.coverage,
                old_success: old.and_then(|o| o.success_above),
                new_success: new.success_above,
                share_above_old: old_t.and(old.and_then(|o| o.coverage)),
                share_above_new,
                target: new.policy.target,
                tested: test,
                verdict,
            })
        })
        .collect()
}

fn num(x: Option<f64>) -> String {
    x.map_or_else(|| "—".to_string(), |v| format!("{v:.3}"))
}

/// The comparison as a Markdown table.
pub(crate) fn markdown(rows: &[DriftRow]) -> String {
    let mut s = String::from(
        "| point | threshold old → new | coverage old → new | success old → new | share ≥ old threshold (old data → new data) | old threshold on new data: success [interval] vs target | change |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let test = r.tested.map_or_else(
            || "—".to_string(),
            |t| {
                format!(
                    "{:.3} [{:.3}, {:.3}] (n = {}, at {}) vs {:.3}",
                    t.rate, t.lower, t.upper, t.n, t.threshold, r.target
                )
            },
        );
        s.push_str(&format!(
            "| {} | {} → {} | {} → {:.3} | {} → {} | {} → {} | {} | {} |\n",
            r.point,
            num(r.old_threshold),
            num(r.new_threshold),
            num(r.old_coverage),
            r.new_coverage,
            num(r.old_success),
            num(r.new_success),
            num(r.share_above_old),
            num(r.share_above_new),
            test,
            r.verdict.as_str(),
        ));
    }
    s
}
