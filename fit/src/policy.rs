//! The threshold rules of issue 5: confidence buckets, and the `bucket`, `cost` and `risk`
//! policies that pick a threshold from them.

use crate::bounds;
use crate::config::{Bound, PointPolicy, PolicyKind};

/// Buckets of width `w` over [0, 1]: bucket `i` holds confidences in `[edge_i, edge_{i+1})`, the
/// top bucket also holds 1.0.
///
/// The edges are `i·w` rounded to 12 decimals, so an edge is the double nearest to its decimal
/// value (3 · 0.1 gives 0.30000000000000004; the edge is 0.3). A confidence's bucket is the
/// last edge it reaches, compared against these rounded edges: 0.3 lands in bucket 3, and the
/// threshold the harness compares with (`confidence ≥ threshold`) accepts exactly the buckets
/// counted here. That rounding is the tolerance: no floating-point error moves an exact edge down.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    width: f64,
    edges: Vec<f64>,
}

/// Round to 12 decimals.
pub(crate) fn round12(x: f64) -> f64 {
    (x * 1e12).round() / 1e12
}

impl Buckets {
    pub fn new(width: f64) -> Buckets {
        assert!(width > 0.0 && width <= 1.0, "bucket width {width}");
        let count = ((1.0 / width) - 1e-9).ceil().max(1.0) as usize;
        let edges = (0..count).map(|i| round12(i as f64 * width)).collect();
        Buckets { width, edges }
    }

    pub fn len(&self) -> usize {
        self.edges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    pub fn width(&self) -> f64 {
        self.width
    }

    /// Lower edge of bucket `i`.
    pub fn lo(&self, i: usize) -> f64 {
        self.edges[i]
    }

    /// Upper edge of bucket `i` (1 for the top bucket).
    pub fn hi(&self, i: usize) -> f64 {
        self.edges.get(i + 1).copied().unwrap_or(1.0)
    }

    /// The bucket of a confidence in [0, 1].
    pub fn index(&self, c: f64) -> usize {
        let n = self.edges.len();
        let mut i = ((c / self.width) as usize).min(n - 1);
        while i + 1 < n && c >= self.edges[i + 1] {
            i += 1;
        }
        while i > 0 && c < self.edges[i] {
            i -= 1;
        }
        i
    }
}

/// Counts of the judged records of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct BucketCount {
    pub n: u64,
    pub success: u64,
}

/// What a policy decided: a point's `status` in thresholds.json (the contract's type).
pub use decision_data::contract::thresholds::Status;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub status: Status,
    /// Index of the bucket whose lower edge is the threshold.
    pub bucket: Option<usize>,
}

/// The lower end `lower` of a bucket: the Wilson lower bound at `level`, or the rate.
pub(crate) fn bucket_lower(c: BucketCount, policy: &PointPolicy) -> Option<f64> {
    bounds::lower_bound(c.success, c.n, policy.level, policy.bound == Bound::Wilson)
}

/// Run the point's policy over its buckets (judged counts per bucket, bottom to top).
pub(crate) fn decide(counts: &[BucketCount], policy: &PointPolicy) -> Decision {
    match policy.kind {
        PolicyKind::Bucket | PolicyKind::Cost => bucket_rule(counts, policy),
        PolicyKind::Risk => risk_rule(counts, policy),
    }
}

/// Scan from the top bucket down, skipping buckets with fewer than `min_count` judged records;
/// a bucket is acceptable when its `lower ≥ target`; stop at the first unacceptable one. The
/// threshold is the lower edge of the lowest acceptable bucket reached, so an unacceptable
/// bucket blocks every bucket below it.
pub(crate) fn bucket_rule(counts: &[BucketCount], policy: &PointPolicy) -> Decision {
    let mut any_counted = false;
    let mut lowest_ok = None;
    for i in (0..counts.len()).rev() {
        let c = counts[i];
        if c.n < policy.min_count {
            continue;
        }
        any_counted = true;
        let lower = bucket_lower(c, policy).expect("n ≥ min_count ≥ 1");
        if lower >= policy.target {
            lowest_ok = Some(i);
        } else {
            break;
        }
    }
    match (any_counted, lowest_ok) {
        (false, _) => Decision {
            status: Status::InsufficientData,
            bucket: None,
        },
        (true, None) => Decision {
            status: Status::NoAcceptableBucket,
            bucket: None,
        },
        (true, Some(i)) => Decision {
            status: Status::Fitted,
            bucket: Some(i),
        },
    }
}

/// Fixed-sequence test: for candidate thresholds at the bucket edges from the highest down,
/// take the judged records at or above it; skip the candidate while they are fewer than
/// `min_count`; test the one-sided Clopper–Pearson upper bound on the error rate at `level`
/// against `1 − target`; pass while it holds, stop at the first failure. The threshold is the
/// last candidate passed. `insufficient-data` when no candidate reached `min_count` records
/// (i.e. fewer judged records than `min_count` in all), `no-acceptable-bucket` when the first
/// candidate tested failed.
pub(crate) fn risk_rule(counts: &[BucketCount], policy: &PointPolicy) -> Decision {
    let (mut n, mut s) = (0u64, 0u64);
    let mut tested = false;
    let mut last_pass = None;
    for i in (0..counts.len()).rev() {
        n += counts[i].n;
        s += counts[i].success;
        if n < policy.min_count {
            continue;
        }
        tested = true;
        let upper = bounds::clopper_pearson_upper(n - s, n, policy.level);
        if upper <= 1.0 - policy.target {
            last_pass = Some(i);
        } else {
            break;
        }
    }
    match (tested, last_pass) {
        (false, _) => Decision {
            status: Status::InsufficientData,
            bucket: None,
        },
        (true, None) => Decision {
            status: Status::NoAcceptableBucket,
            bucket: None,
        },
        (true, Some(i)) => Decision {
            status: Status::Fitted,
            bucket: Some(i),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FitConfig;

    #[test]
    fn exact_edges_land_in_their_bucket() {
        let b = Buckets::new(0.1);
        assert_eq!(b.len(), 10);
        assert_eq!(
            b.index(0.3),
            3,
            "0.3 / 0.1 = 2.9999999999999996 must not fall to bucket 2"
        );
        assert_eq!(b.index(0.0), 0);
        assert_eq!(b.index(1.0), 9, "the top bucket holds 1.0");
        assert_eq!(b.index(0.7), 7);
        assert_eq!(b.index(0.6), 6);
        assert_eq!(b.index(0.29999999999), 2);
        assert_eq!(b.lo(3), 0.3);
        for i in 0..10 {
            let edge = b.lo(i);
            assert_eq!(b.index(edge), i, "edge {edge}");
            assert_eq!(
                edge,
                format!("{:.1}", i as f64 / 10.0).parse::<f64>().unwrap()
            );
        }
        let odd = Buckets::new(0.15);
        assert_eq!(odd.len(), 7);
        assert_eq!(odd.hi(6), 1.0);
        assert_eq!(odd.index(1.0), 6);
        assert_eq!(odd.index(0.45), 3);
        assert_eq!(Buckets::new(1.0).len(), 1);
        assert_eq!(Buckets::new(0.05).index(0.35), 7);
    }

    fn policy(extra: &str) -> PointPolicy {
        FitConfig::parse(&format!("[defaults]\nmin_count = 10\n{extra}"))
            .unwrap()
            .defaults
    }

    fn counts(v: &[(u64, u64)]) -> Vec<BucketCount> {
        v.iter()
            .map(|&(n, success)| BucketCount { n, success })
            .collect()
    }

    #[test]
    fn a_dip_blocks_everything_below_it() {
        let p = policy("target = 0.8\nbound = \"none\"");
        // bottom → top: bucket 7 dips to 50% between good buckets.
        let mut c = counts(&[(0, 0); 10]);
        c[9] = BucketCount {
            n: 100,
            success: 99,
        };
        c[8] = BucketCount {
            n: 100,
            success: 95,
        };
        c[7] = BucketCount {
            n: 100,
            success: 50,
        };
        c[6] = BucketCount {
            n: 100,
            success: 99,
        };
        let d = bucket_rule(&c, &p);
        assert_eq!(
            d,
            Decision {
                status: Status::Fitted,
                bucket: Some(8)
            }
        );
        // A sparse bucket is skipped, not a stop.
        c[8] = BucketCount { n: 5, success: 0 };
        assert_eq!(bucket_rule(&c, &p).bucket, Some(9));
        c[7] = BucketCount {
            n: 100,
            success: 99,
        };
        assert_eq!(
            bucket_rule(&c, &p).bucket,
            Some(6),
            "skipped bucket 8 lies inside the accepted range"
        );
        // Top bucket unacceptable: nothing below can be accepted.
        c[9] = BucketCount {
            n: 100,
            success: 10,
        };
        assert_eq!(
            bucket_rule(&c, &p),
            Decision {
                status: Status::NoAcceptableBucket,
                bucket: None
            }
        );
        // Nothing reaches min_count.
        let thin = counts(&[(9, 9); 10]);
        assert_eq!(bucket_rule(&thin, &p).status, Status::InsufficientData);
    }

    #[test]
    fn wilson_is_stricter_than_the_rate() {
        let mut c = counts(&[(0, 0); 10]);
        c[9] = BucketCount { n: 20, success: 20 };
        assert_eq!(
            bucket_rule(&c, &policy("target = 0.9\nbound = \"none\"")).bucket,
            Some(9)
        );
        // Wilson lower bound of 20/20 at 95% is about 0.839
        assert_eq!(
            bucket_rule(&c, &policy("target = 0.9")).status,
            Status::NoAcceptableBucket
        );
    }

    #[test]
    fn risk_rule_accumulates_from_the_top() {
        let p = policy("policy = \"risk\"\ntarget = 0.9");
        let mut c = counts(&[(0, 0); 10]);
        // 6 records per top bucket: only cumulative counts reach min_count = 10.
        c[9] = BucketCount { n: 6, success: 6 };
        c[8] = BucketCount { n: 6, success: 6 };
        // 12 of 12: CP upper on errors = 1 - 0.05^(1/12) = 0.2209 > 0.1: fails
        assert_eq!(risk_rule(&c, &p).status, Status::NoAcceptableBucket);
        c[9] = BucketCount { n: 40, success: 40 };
        c[8] = BucketCount { n: 20, success: 20 };
        c[7] = BucketCount { n: 30, success: 10 };
        // 40/40: upper 0.0722 passes; 60/60: passes; 90 with 20 errors fails.
        assert_eq!(
            risk_rule(&c, &p),
            Decision {
                status: Status::Fitted,
                bucket: Some(8)
            }
        );
        assert_eq!(
            risk_rule(&counts(&[(1, 1); 9]), &p).status,
            Status::InsufficientData
        );
    }
}
