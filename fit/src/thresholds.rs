//! `thresholds.json` (contracts section 4, schema `decision-thresholds/1`): what the fit writes
//! and the harness reads. Fields beyond the contract's example (additive): `source.valid`,
//! `source.duplicates`,
//! per point `records` (valid records of the point), `counts` (the category counts behind
//! `judged` and `rates`), `rates.unknown` and `rates.rejected_by`, `policy.bucket_width` and the
//! cost parameters, and per bucket `mean_confidence` and `accepted`.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::aggregate::{Counts, PointAgg};
use crate::bounds;
use crate::config::PointPolicy;
use crate::policy::{Status, decide};

pub use decision_data::contract::thresholds::SCHEMA;

#[derive(Debug, Clone, Serialize)]
pub struct Thresholds {
    pub schema: &'static str,
    pub fitted_at: String,
    pub source: Source,
    pub points: BTreeMap<String, PointFit>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Source {
    pub files: Vec<String>,
    /// SHA-256 of the input files' bytes, concatenated in the order of `files`.
    pub sha256: String,
    /// Records read, good and bad, duplicates included.
    pub records: u64,
    /// Bad records, a duplicate id with a different body included.
    pub bad: u64,
    /// Records dropped because a record with the same id and body was read before (the same
    /// file twice, overlapping folders, a receipt in two shards): each id counts once.
    pub duplicates: u64,
    /// `records − bad − duplicates`: the records counted in the points.
    pub valid: u64,
    /// The quarantine file's name (it lies beside thresholds.json).
    pub quarantine: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointFit {
    pub status: Status,
    pub threshold: Option<f64>,
    pub policy: PointPolicy,
    pub judged: u64,
    /// Accepted picks with confidence ≥ threshold over all valid records of the point.
    pub coverage: f64,
    /// Success rate of the judged records at or above the threshold, and its Wilson lower bound
    /// at the policy's level.
    pub success_above: Option<f64>,
    pub success_above_lower: Option<f64>,
    pub rates: Rates,
    /// Expected calibration error over the judged records, same buckets.
    pub ece: Option<f64>,
    /// Buckets with any judged record or accepted pick, bottom to top.
    pub buckets: Vec<BucketFit>,
    /// Valid records of the point.
    pub records: u64,
    pub counts: Counts,
}

/// Each over all valid records of the point; with the judged share they add up to 1.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rates {
    pub abstain: f64,
    pub rejected: f64,
    pub rejected_by: BTreeMap<&'static str, f64>,
    pub fallback: f64,
    pub pending: f64,
    pub abandoned: f64,
    /// Free-text outcomes no configured pattern recognised (observed, not judged).
    pub unknown: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketFit {
    pub lo: f64,
    pub hi: f64,
    pub n: u64,
    pub success: u64,
    pub rate: Option<f64>,
    pub lower: Option<f64>,
    pub mean_confidence: Option<f64>,
    /// Accepted picks in the bucket, judged or not (the coverage's numerator).
    pub accepted: u64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Fit one point from its aggregate under its policy.
pub fn fit_point(agg: &PointAgg, policy: &PointPolicy) -> PointFit {
    let c = &agg.counts;
    let b = agg.bucketing();
    let decision = decide(&agg.bucket_counts(), policy);
    let threshold = decision.bucket.map(|i| b.lo(i));

    let (mut coverage, mut success_above, mut success_above_lower) = (0.0, None, None);
    if let Some(i) = decision.bucket {
        let above = &agg.buckets[i..];
        coverage = ratio(above.iter().map(|s| s.accepted).sum(), c.valid);
        let n: u64 = above.iter().map(|s| s.n).sum();
        let s: u64 = above.iter().map(|s| s.success).sum();
        if n > 0 {
            success_above = Some(s as f64 / n as f64);
            success_above_lower = bounds::wilson(s, n, policy.level).map(|(lo, _)| lo);
        }
    }

    let ece = decision_data::calibration::expected_calibration_error(
        agg.buckets.iter().filter(|s| s.n > 0).map(|s| {
            let n = s.n as f64;
            (s.n, s.success as f64 / n, s.confidence_sum() / n)
        }),
    );

    let buckets = agg
        .buckets
        .iter()
        .enumerate()
        .filter(|(_, s)| s.n > 0 || s.accepted > 0)
        .map(|(i, s)| BucketFit {
            lo: b.lo(i),
            hi: b.hi(i),
            n: s.n,
            success: s.success,
            rate: (s.n > 0).then(|| s.success as f64 / s.n as f64),
            lower: crate::policy::bucket_lower(
                crate::policy::BucketCount {
                    n: s.n,
                    success: s.success,
                },
                policy,
            ),
            mean_confidence: (s.n > 0).then(|| s.confidence_sum() / s.n as f64),
            accepted: s.accepted,
        })
        .collect();

    let v = c.valid;
    let rates = Rates {
        abstain: ratio(c.abstain, v),
        rejected: ratio(c.rejected, v),
        rejected_by: [
            ("out-of-set", ratio(c.rejected_out_of_set, v)),
            ("stale", ratio(c.rejected_stale, v)),
            ("expired", ratio(c.rejected_expired, v)),
            ("unauthorized", ratio(c.rejected_unauthorized, v)),
            ("gate", ratio(c.rejected_gate, v)),
        ]
        .into(),
        fallback: ratio(c.fallback, v),
        pending: ratio(c.pending, v),
        abandoned: ratio(c.abandoned, v),
        unknown: ratio(c.unknown, v),
    };

    PointFit {
        status: decision.status,
        threshold,
        policy: policy.clone(),
        judged: c.judged,
        coverage,
        success_above,
        success_above_lower,
        rates,
        ece,
        buckets,
        records: c.valid,
        counts: c.clone(),
    }
}
