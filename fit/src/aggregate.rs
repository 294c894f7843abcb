//! One streaming pass over the receipts: per decision point, counts that are all a fit needs.
//! The state is plain sums, so shards (or threads) can aggregate separately and
//! [`Aggregate::merge`] afterwards; the result does not depend on how the input was split
//! (confidences are summed in fixed point, so not even on the order of the additions), and a
//! record counted too early can be taken back exactly ([`PointAgg::add_facts`] with weight -1).
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

use decision_data::receipts_io::{Facts, Tally};
use decision_data::{OutcomeStatus, Receipt, Validation};
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
    /// Offered picks the host's own gates refused (keel's low probability, low confidence,
    /// ambiguity).
    pub rejected_gate: u64,
    /// Fallbacks, with the host's own routes recorded as picks (`Receipt::host_scored`).
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
        self.rejected_gate += o.rejected_gate;
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
                + self.rejected_gate
                == self.rejected
    }
}

/// Sums over the records of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BucketSums {
    /// Judged records and their successes.
    pub n: u64,
    pub success: u64,
    /// Sum of the judged records' confidences (for the mean confidence and ECE), in units of
    /// 2^-64 ([`BucketSums::confidence_sum`] gives it as a number).
    pub confidence_units: u128,
    /// Accepted picks, whatever followed (fallback, outcome or none): what the harness would
    /// have auto-accepted at a threshold at or below this bucket.
    pub accepted: u64,
}

impl BucketSums {
    pub(crate) fn confidence_sum(&self) -> f64 {
        self.confidence_units as f64 / UNIT
    }
}

const UNIT: f64 = 18_446_744_073_709_551_616.0; // 2^64

/// A confidence in [0, 1] in units of 2^-64, truncated (exact down to 2^-64). Below 1 the
/// product fits 64 bits, whose conversion is one instruction (to 128 bits it is a call).
fn units(c: f64) -> u128 {
    if c < 1.0 {
        u128::from((c * UNIT) as u64)
    } else {
        (c * UNIT) as u128
    }
}

/// `x += w` for a weight of 1 or -1 (a take-back never goes below what was added).
fn bump(x: &mut u64, w: i64) {
    *x = x.wrapping_add_signed(w);
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

    /// Count one record (`w` = 1) or take one back (`w` = -1).
    pub(crate) fn add_facts(&mut self, f: &Facts, w: i64) {
        let c = &mut self.counts;
        bump(&mut c.valid, w);
        let Some(confidence) = f.confidence else {
            bump(&mut c.abstain, w);
            return;
        };
        // the host's own route: its confidence is not a selector's, so it enters no bucket and
        // no coverage, whatever keel's validation says
        if f.host_scored {
            bump(&mut c.fallback, w);
            return;
        }
        match f.validation {
            Validation::Accepted => {}
            reason => {
                bump(&mut c.rejected, w);
                bump(
                    match reason {
                        Validation::RejectedOutOfSet => &mut c.rejected_out_of_set,
                        Validation::RejectedStale => &mut c.rejected_stale,
                        Validation::RejectedExpired => &mut c.rejected_expired,
                        Validation::RejectedUnauthorized => &mut c.rejected_unauthorized,
                        Validation::RejectedGate => &mut c.rejected_gate,
                        Validation::Accepted => unreachable!(),
                    },
                    w,
                );
                return;
            }
        }
        let b = self.bucketing.index(confidence);
        bump(&mut self.buckets[b].accepted, w);
        for cut in &mut self.cuts {
            if confidence >= cut.threshold {
                bump(&mut cut.accepted, w);
            }
        }
        if f.fallback_used {
            bump(&mut c.fallback, w);
            return;
        }
        let success = match (f.shadow_match, f.outcome) {
            (Some(matched), _) => Some(matched),
            (None, Some(OutcomeStatus::Success)) => Some(true),
            (None, Some(OutcomeStatus::Failure)) => Some(false),
            (None, Some(OutcomeStatus::Abandoned)) => {
                bump(&mut c.abandoned, w);
                None
            }
            (None, None) if f.observed => {
                bump(&mut c.unknown, w);
                None
            }
            (None, None) => {
                bump(&mut c.pending, w);
                None
            }
        };
        if let Some(ok) = success {
            bump(&mut c.judged, w);
            let s = &mut self.buckets[b];
            bump(&mut s.n, w);
            if ok {
                bump(&mut s.success, w);
            }
            let u = units(confidence);
            s.confidence_units = if w > 0 {
                s.confidence_units.wrapping_add(u)
            } else {
                s.confidence_units.wrapping_sub(u)
            };
            for cut in &mut self.cuts {
                if confidence >= cut.threshold {
                    bump(&mut cut.n, w);
                    if ok {
                        bump(&mut cut.success, w);
                    }
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
            a.confidence_units += b.confidence_units;
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
    pub(crate) fn bucket_counts(&self) -> Vec<BucketCount> {
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
        Tally::add(self, &r.point, &Facts::of(r), 1);
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

    /// Drop the points that only records taken back had named (and the config does not): a
    /// point appears in the output when a counted receipt or the config names it.
    pub fn drop_unseen(&mut self) {
        let config = &self.config;
        self.points
            .retain(|name, p| p.counts.valid > 0 || config.points.contains_key(name));
    }
}

/// The parallel read's counting (`decision_data::receipts_io::scan_unique_receipts`): each
/// piece of the input is aggregated on its own and merged in input order.
impl Tally for Aggregate {
    fn add(&mut self, point: &str, facts: &Facts, weight: i64) {
        self.records = self.records.wrapping_add_signed(weight);
        // one lookup on the common path (the point exists)
        if let Some(p) = self.points.get_mut(point) {
            p.add_facts(facts, weight);
            return;
        }
        self.point_mut(point).add_facts(facts, weight);
    }

    fn merge(&mut self, later: Self) {
        Aggregate::merge(self, &later);
    }

    /// A batch's points are looked up once each: taken out of the map while the rows are
    /// counted, then put back.
    fn add_rows(&mut self, points: &[&str], rows: &[(u32, Facts)]) {
        let mut taken: Vec<(String, PointAgg)> = points
            .iter()
            .map(|name| {
                self.point_mut(name);
                self.points.remove_entry(*name).expect("made above")
            })
            .collect();
        for (p, facts) in rows {
            taken[*p as usize].1.add_facts(facts, 1);
        }
        self.records += rows.len() as u64;
        self.points.extend(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decision_data::{Fallback, Outcome, ReceiptResult, Shadow};

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
                confidence_units: units(0.95) + units(0.99),
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
                confidence_units: units(1.0),
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

    #[test]
    fn a_record_taken_back_leaves_exactly_what_never_counting_it_leaves() {
        let cfg = FitConfig::parse("").unwrap();
        let cuts: BTreeMap<String, Vec<f64>> = [("tool".to_string(), vec![0.5])].into();
        let all = sample();
        let mut without = Aggregate::new(&cfg, cuts.clone());
        all.iter().skip(3).for_each(|r| without.add(r));
        let mut with = Aggregate::new(&cfg, cuts);
        for r in all.iter().rev() {
            Tally::add(&mut with, &r.point, &Facts::of(r), 1);
        }
        for r in all.iter().take(3) {
            Tally::add(&mut with, &r.point, &Facts::of(r), -1);
        }
        assert_eq!(
            with.points, without.points,
            "bit for bit, confidence sums included"
        );
        assert_eq!(with.records, without.records);
    }
}
