//! One streaming pass over the receipts: per decision point, counts that are all a fit needs.
//! The state is plain sums, so shards (or threads) can aggregate separately and
//! [`Aggregate::merge`] afterwards; the result does not depend on how the input was split
//! (up to the order of floating-point additions in the confidence sums).
//!
//! Every valid record lands in exactly one category, checked in this order:
//!
//! 1. `abstain`: the selector abstained;
//! 2. `rejected` (by reason): a pick the host did not accept;
//! 3. `fallback`: an accepted pick after which a fallback ran (never a selector success);
//! 4. `judged`: `shadow.reference` present (success = pick equals it), or an outcome of
//!    success / failure;
//! 5. `abandoned`: outcome abandoned;
//! 6. `unknown`: a free-text outcome that no configured pattern recognised;
//! 7. `pending`: no outcome yet.
//!
//! so `valid = judged + abstain + rejected + fallback + abandoned + unknown + pending`.

use std::collections::BTreeMap;

use decision_data::{OutcomeStatus, Receipt, ReceiptResult, Validation};
use serde::Serialize;

use crate::config::FitConfig;
use crate::policy::{BucketCount, Buckets};

/// The category counts of one point (serialised as `counts` in thresholds.json).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub valid: u64,
    pub judged: u64,
    pub abstain: u64,
    pub rejected: u64,
    pub rejected_out_of_set: u64,
    pub rejected_stale: u64,
    pub rejected_expired: u64,
    pub rejected_unauthorized: u64,
    pub fallback: u64,
    pub abandoned: u64,
    pub unknown: u64,
    pub pending: u64,
}

impl Counts {
    fn merge(&mut self, o: &Counts) {
        self.valid += o.valid;
        self.judged += o.judged;
        self.abstain += o.abstain;
        self.rejected += o.rejected;
        self.rejected_out_of_set += o.rejected_out_of_set;
        self.rejected_stale += o.rejected_stale;
        self.rejected_expired += o.rejected_expired;
        self.rejected_unauthorized += o.rejected_unauthorized;
        self.fallback += o.fallback;
        self.abandoned += o.abandoned;
        self.unknown += o.unknown;
        self.pending += o.pending;
    }

    /// The categories add up to the valid records.
    pub fn balanced(&self) -> bool {
        self.judged
            + self.abstain
            + self.rejected
            + self.fallback
            + self.abandoned
            + self.unknown
            + self.pending
            == self.valid
            && self.rejected_out_of_set
                + self.rejected_stale
                + self.rejected_expired
                + self.rejected_unauthorized
                == self.rejected
    }
}

/// Sums over the records of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BucketSums {
    /// Judged records and their successes.
    pub n: u64,
    pub success: u64,
    /// Sum of the judged records' confidences (for the mean confidence and ECE).
    pub confidence_sum: f64,
    /// Accepted picks, whatever followed (fallback, outcome or none): what the harness would
    /// have auto-accepted at a threshold at or below this bucket.
    pub accepted: u64,
}

/// Counts above one fixed threshold (the previous file's, for the drift table).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CutSums {
    pub threshold: f64,
    pub n: u64,
    pub success: u64,
    pub accepted: u64,
}

/// Everything kept about one decision point.
#[derive(Debug, Clone, PartialEq)]
pub struct PointAgg {
    pub counts: Counts,
    pub buckets: Vec<BucketSums>,
    pub cuts: Vec<CutSums>,
    bucketing: Buckets,
}

impl PointAgg {
    pub fn new(bucketing: Buckets, cuts: &[f64]) -> PointAgg {
        PointAgg {
            counts: Counts::default(),
            buckets: vec![BucketSums::default(); bucketing.len()],
            cuts: cuts
                .iter()
                .map(|&t| CutSums {
                    threshold: t,
                    ..CutSums::default()
                })
                .collect(),
            bucketing,
        }
    }

    pub fn bucketing(&self) -> &Buckets {
        &self.bucketing
    }

    pub fn add(&mut self, r: &Receipt) {
        let c = &mut self.counts;
        c.valid += 1;
        let (pick, confidence) = match &r.result {
            ReceiptResult::Abstain => {
                c.abstain += 1;
                return;
            }
            ReceiptResult::Pick { id, confidence } => (id, *confidence),
        };
        match r.validation {
            Validation::Accepted => {}
            reason => {
                c.rejected += 1;
                match reason {
                    Validation::RejectedOutOfSet => c.rejected_out_of_set += 1,
                    Validation::RejectedStale => c.rejected_stale += 1,
                    Validation::RejectedExpired => c.rejected_expired += 1,
                    Validation::RejectedUnauthorized => c.rejected_unauthorized += 1,
                    Validation::Accepted => unreachable!(),
                }
                return;
            }
        }
        let b = self.bucketing.index(confidence);
        self.buckets[b].accepted += 1;
        for cut in &mut self.cuts {
            if confidence >= cut.threshold {
                cut.accepted += 1;
            }
        }
        if r.fallback_used() {
            c.fallback += 1;
            return;
        }
        let success = match (&r.shadow, r.outcome.as_ref().map(|o| o.status)) {
            (Some(shadow), _) => Some(*pick == shadow.reference),
            (None, Some(OutcomeStatus::Success)) => Some(true),
            (None, Some(OutcomeStatus::Failure)) => Some(false),
            (None, Some(OutcomeStatus::Abandoned)) => {
                c.abandoned += 1;
                None
            }
            (None, None) if r.observed_outcome.is_some() => {
                c.unknown += 1;
                None
            }
            (None, None) => {
                c.pending += 1;
                None
            }
        };
        if let Some(ok) = success {
            c.judged += 1;
            let s = &mut self.buckets[b];
            s.n += 1;
            s.success += u64::from(ok);
            s.confidence_sum += confidence;
            for cut in &mut self.cuts {
                if confidence >= cut.threshold {
                    cut.n += 1;
                    cut.success += u64::from(ok);
                }
            }
        }
    }

    pub fn merge(&mut self, o: &PointAgg) {
        assert_eq!(
            self.bucketing, o.bucketing,
            "merging points bucketed differently"
        );
        assert_eq!(
            self.cuts.len(),
            o.cuts.len(),
            "merging points with different cuts"
        );
        self.counts.merge(&o.counts);
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            a.n += b.n;
            a.success += b.success;
            a.confidence_sum += b.confidence_sum;
            a.accepted += b.accepted;
        }
        for (a, b) in self.cuts.iter_mut().zip(&o.cuts) {
            assert_eq!(
                a.threshold, b.threshold,
                "merging points with different cuts"
            );
            a.n += b.n;
            a.success += b.success;
            a.accepted += b.accepted;
        }
    }

    /// Judged counts per bucket, bottom to top (the policies' input).
    pub fn bucket_counts(&self) -> Vec<BucketCount> {
        self.buckets
            .iter()
            .map(|b| BucketCount {
                n: b.n,
                success: b.success,
            })
            .collect()
    }
}

/// The whole pass: per-point state plus the records that could not be read.
#[derive(Debug, Clone)]
pub struct Aggregate {
    pub points: BTreeMap<String, PointAgg>,
    /// Records read (good and bad) and bad ones.
    pub records: u64,
    pub bad: u64,
    config: FitConfig,
    /// Extra thresholds to count above, per point (from `--previous`).
    cuts: BTreeMap<String, Vec<f64>>,
}

impl Aggregate {
    /// Points named in the config start empty, so they appear in the output without receipts.
    pub fn new(config: &FitConfig, cuts: BTreeMap<String, Vec<f64>>) -> Aggregate {
        let mut a = Aggregate {
            points: BTreeMap::new(),
            records: 0,
            bad: 0,
            config: config.clone(),
            cuts,
        };
        for name in config.points.keys() {
            a.point_mut(name);
        }
        a
    }

    fn point_mut(&mut self, name: &str) -> &mut PointAgg {
        if !self.points.contains_key(name) {
            let buckets = Buckets::new(self.config.policy(name).bucket_width);
            let cuts = self.cuts.get(name).map(Vec::as_slice).unwrap_or(&[]);
            self.points
                .insert(name.to_string(), PointAgg::new(buckets, cuts));
        }
        self.points.get_mut(name).expect("inserted")
    }

    pub fn add(&mut self, r: &Receipt) {
        self.records += 1;
        self.point_mut(&r.point).add(r);
    }

    pub fn add_bad(&mut self) {
        self.records += 1;
        self.bad += 1;
    }

    /// Fold another aggregate (same config and cuts) into this one.
    pub fn merge(&mut self, o: &Aggregate) {
        self.records += o.records;
        self.bad += o.bad;
        for (name, p) in &o.points {
            self.point_mut(name).merge(p);
        }
    }

    pub fn valid(&self) -> u64 {
        self.points.values().map(|p| p.counts.valid).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decision_data::{Fallback, Outcome, Shadow};

    fn pick(point: &str, c: f64) -> Receipt {
        Receipt {
            id: "r".into(),
            at: "2026-11-30T12:00:00Z".into(),
            point: point.into(),
            model: None,
            candidates: vec!["a".into(), "b".into()],
            result: ReceiptResult::Pick {
                id: "a".into(),
                confidence: c,
            },
            validation: Validation::Accepted,
            fallback: None,
            outcome: None,
            shadow: None,
            observed_outcome: None,
        }
    }

    fn outcome(mut r: Receipt, s: OutcomeStatus) -> Receipt {
        r.outcome = Some(Outcome {
            status: s,
            duration_ms: None,
            retries: None,
        });
        r
    }

    fn sample() -> Vec<Receipt> {
        let mut v = vec![
            outcome(pick("tool", 0.95), OutcomeStatus::Success),
            outcome(pick("tool", 0.3), OutcomeStatus::Failure),
            pick("tool", 0.5),
            outcome(pick("tool", 0.9), OutcomeStatus::Abandoned),
        ];
        let mut fb = outcome(pick("tool", 0.99), OutcomeStatus::Success);
        fb.fallback = Some(Fallback {
            used: true,
            to: Some("b".into()),
            reason: None,
        });
        v.push(fb);
        let mut unused_fb = outcome(pick("tool", 0.99), OutcomeStatus::Success);
        unused_fb.fallback = Some(Fallback {
            used: false,
            to: None,
            reason: None,
        });
        v.push(unused_fb);
        let mut shadow = outcome(pick("args", 1.0), OutcomeStatus::Abandoned);
        shadow.shadow = Some(Shadow {
            reference: "b".into(),
        });
        v.push(shadow);
        let mut ab = pick("args", 0.0);
        ab.result = ReceiptResult::Abstain;
        v.push(ab);
        let mut rej = pick("args", 0.0);
        rej.validation = Validation::RejectedUnauthorized;
        v.push(rej);
        let mut unk = pick("args", 0.7);
        unk.observed_outcome = Some("user closed the window".into());
        v.push(unk);
        v
    }

    #[test]
    fn every_record_lands_in_exactly_one_category() {
        let cfg = FitConfig::parse("").unwrap();
        let mut a = Aggregate::new(&cfg, BTreeMap::new());
        for r in sample() {
            a.add(&r);
        }
        a.add_bad();
        let t = &a.points["tool"].counts;
        assert_eq!(
            (t.valid, t.judged, t.pending, t.abandoned, t.fallback),
            (6, 3, 1, 1, 1)
        );
        let g = &a.points["args"].counts;
        assert_eq!(
            (
                g.valid,
                g.judged,
                g.abstain,
                g.rejected,
                g.rejected_unauthorized,
                g.unknown
            ),
            (4, 1, 1, 1, 1, 1)
        );
        assert!(t.balanced() && g.balanced());
        assert_eq!(a.records, a.valid() + a.bad);
        // the fallback with a success outcome is not a success; the shadow record is judged
        // against its reference (a failure), whatever its outcome says
        let tool = &a.points["tool"];
        assert_eq!(
            tool.buckets[9],
            BucketSums {
                n: 2,
                success: 2,
                confidence_sum: 0.95 + 0.99,
                accepted: 4
            },
            "0.9 is an edge: bucket 9"
        );
        assert_eq!(tool.buckets[3].n, 1);
        assert_eq!(tool.buckets[3].success, 0, "0.3 is judged in bucket 3");
        assert_eq!(
            a.points["args"].buckets[9],
            BucketSums {
                n: 1,
                success: 0,
                confidence_sum: 1.0,
                accepted: 1
            }
        );
    }

    #[test]
    fn merging_shards_equals_one_pass() {
        let cfg = FitConfig::parse("[points.stop]\n").unwrap();
        let cuts: BTreeMap<String, Vec<f64>> = [("tool".to_string(), vec![0.5, 0.9])].into();
        let all = sample();
        let mut whole = Aggregate::new(&cfg, cuts.clone());
        all.iter().for_each(|r| whole.add(r));
        for split in 0..=all.len() {
            let (mut a, mut b) = (
                Aggregate::new(&cfg, cuts.clone()),
                Aggregate::new(&cfg, cuts.clone()),
            );
            all[..split].iter().for_each(|r| a.add(r));
            all[split..].iter().for_each(|r| b.add(r));
            a.merge(&b);
            assert_eq!(a.points, whole.points, "split at {split}");
            assert_eq!(a.records, whole.records);
        }
        assert!(
            whole.points.contains_key("stop"),
            "configured points exist without receipts"
        );
        let cut = whole.points["tool"].cuts[1];
        assert_eq!(
            (cut.threshold, cut.n, cut.success, cut.accepted),
            (0.9, 2, 2, 4)
        );
    }
}
