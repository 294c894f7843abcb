//! Synthetic receipts for the demo, the cross-check fixture and the benchmark, until real shadow
//! receipts exist. Deterministic for a seed. Each point has its own character:
//!
//! * `tool`: many records, mostly confident, roughly calibrated (a threshold fits);
//! * `args`: overconfident (success well below confidence: no bucket may qualify);
//! * `route`: good except a dip at confidence 0.7–0.8 (the dip blocks the buckets below);
//! * `stop`: rare (too few judged records: insufficient data).
//!
//! Around them the harness's other endings: abstentions, rejections of each kind (an
//! out-of-set rejection names an id that was not offered; a gate rejection an offered one),
//! fallbacks (some with success outcomes; at `route`, keel's intake quirk), routes the host
//! scored itself (keel's `backend: host`, confidence 0.75), pending and abandoned outcomes,
//! shadow-mode records judged against a reference, free-text outcomes, and, on request, a share
//! of bad records (a confidence above 1, or a pick that was not offered yet accepted). About a third of the confidences are rounded to two
//! decimals, as rounded model probabilities are, so exact bucket edges (0.0, 0.3, 1.0, ...)
//! occur.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;
use decision_data::receipts_io::{ReceiptJsonlWriter, ReceiptParquetWriter};
use decision_data::states_io::Format;
use decision_data::{Fallback, Outcome, OutcomeStatus, Receipt, ReceiptResult, Shadow, Validation};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Example:\n  decision gen receipts --n 20000 --seed 7 --bad 0.001 --out demo-out/receipts.parquet"
)]
pub struct GenReceiptsArgs {
    /// Output file: .parquet (flattened columns) or .jsonl (contract shape).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of receipts.
    #[arg(long, default_value_t = 20_000)]
    pub n: u64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Share of bad records (confidence above 1, or an accepted pick that was not offered).
    #[arg(long, default_value_t = 0.0)]
    pub bad: f64,
}

/// One receipt; `i` numbers it (ids and times follow it).
pub(crate) fn receipt(rng: &mut ChaCha8Rng, i: u64, bad_share: f64) -> Receipt {
    let u: f64 = rng.random();
    let point = match u {
        u if u < 0.55 => "tool",
        u if u < 0.80 => "args",
        u if u < 0.995 => "route",
        _ => "stop",
    };
    let k = rng.random_range(2..=8usize);
    let candidates: Vec<String> = (0..k).map(|j| format!("{point}-{j}")).collect();
    let best = rng.random_range(0..k);

    // Confidence: skewed towards 1 for tool, broad for the others.
    let skew = match point {
        "tool" => 0.35,
        "args" => 0.6,
        _ => 0.8,
    };
    let mut c: f64 = 1.0 - rng.random::<f64>().powf(1.0 / skew).min(1.0);
    c = c.clamp(0.0, 1.0);
    if rng.random::<f64>() < 0.35 {
        c = (c * 100.0).round() / 100.0;
    }
    // Probability that the pick is right, given its confidence.
    let p_ok = match point {
        "tool" => (0.02 + 0.98 * c).min(1.0),
        "args" => c * 0.8,
        "route" if (0.7..0.8).contains(&c) => 0.55,
        _ => (0.05 + 0.95 * c).min(1.0),
    };
    let ok = rng.random::<f64>() < p_ok;
    let pick = if ok {
        best
    } else {
        (best + 1 + rng.random_range(0..k - 1)) % k
    };

    let model = match rng.random::<f64>() {
        u if u < 0.78 => "laya",
        u if u < 0.98 => "jev",
        // a route the host scored itself (keel's `backend: host`)
        _ => "host",
    };
    let mut r = Receipt {
        id: format!("r{i:09}"),
        at: at_of(i),
        point: point.to_string(),
        model: Some(model.to_string()),
        candidates,
        result: ReceiptResult::Pick {
            id: format!("{point}-{pick}"),
            // keel's constant on every host-scored route, not a model's confidence
            confidence: if model == "host" { 0.75 } else { c },
        },
        validation: Validation::Accepted,
        fallback: None,
        outcome: None,
        shadow: None,
        observed_outcome: None,
    };

    let v: f64 = rng.random();
    if v < 0.04 {
        r.result = ReceiptResult::Abstain;
        if rng.random::<f64>() < 0.5 {
            r.fallback = Some(Fallback {
                used: true,
                to: Some(r.candidates[0].clone()),
                reason: Some("abstained".into()),
            });
        }
        return maybe_bad(rng, r, bad_share);
    }
    if v < 0.07 {
        r.validation = match rng.random_range(0..5) {
            0 => {
                r.result = ReceiptResult::Pick {
                    id: format!("{point}-ghost"),
                    confidence: c,
                };
                Validation::RejectedOutOfSet
            }
            1 => Validation::RejectedStale,
            2 => Validation::RejectedExpired,
            3 => Validation::RejectedUnauthorized,
            // the host's own gates refused an offered pick
            _ => Validation::RejectedGate,
        };
        return maybe_bad(rng, r, bad_share);
    }
    let o: f64 = rng.random();
    let duration_ms = Some(rng.random_range(200..90_000u64));
    let retries = Some(rng.random_range(0..3u32));
    if o < 0.25 {
        // shadow mode: not acted on, judged against the answer key
        r.shadow = Some(Shadow {
            reference: format!("{point}-{best}"),
        });
    } else if o < 0.30 {
        // pending
    } else if o < 0.32 {
        r.outcome = Some(Outcome {
            status: OutcomeStatus::Abandoned,
            duration_ms,
            retries,
        });
    } else if o < 0.34 {
        r.observed_outcome = Some("user closed the window".into());
    } else {
        let status = if ok {
            OutcomeStatus::Success
        } else {
            OutcomeStatus::Failure
        };
        r.outcome = Some(Outcome {
            status,
            duration_ms,
            retries,
        });
        if rng.random::<f64>() < 0.05 {
            // the host fell back after accepting; often the fallback then succeeded
            // at `route`, keel's intake quirk: the selector abstained and the host's own route
            // was recorded as the pick
            let reason = if point == "route" {
                "Selector abstained; host scored the 0G catalog"
            } else {
                "provider auth failed"
            };
            r.fallback = Some(Fallback {
                used: true,
                to: Some(r.candidates[0].clone()),
                reason: Some(reason.into()),
            });
            if rng.random::<f64>() < 0.8 {
                r.outcome = Some(Outcome {
                    status: OutcomeStatus::Success,
                    duration_ms,
                    retries,
                });
            }
        }
    }
    maybe_bad(rng, r, bad_share)
}

fn maybe_bad(rng: &mut ChaCha8Rng, mut r: Receipt, share: f64) -> Receipt {
    if share > 0.0 && rng.random::<f64>() < share {
        if rng.random::<bool>() {
            r.result = ReceiptResult::Pick {
                id: r.candidates[0].clone(),
                confidence: 1.5,
            };
        } else {
            r.result = ReceiptResult::Pick {
                id: "never-offered".into(),
                confidence: 0.9,
            };
            r.validation = Validation::Accepted;
        }
    }
    r
}

fn at_of(i: u64) -> String {
    // 2026-11-01T00:00:00Z plus i seconds
    let t = chrono::DateTime::from_timestamp(1_793_491_200 + i as i64, 0).expect("in range");
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Stream `n` receipts into the writer for the file's extension.
pub(crate) fn generate(args: &GenReceiptsArgs) -> Result<u64> {
    if !(0.0..=1.0).contains(&args.bad) {
        bail!("--bad {} must lie in [0, 1]", args.bad);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let pb = decision_data::progress::bar(Some(args.n), "receipts");
    let written = match Format::from_path(&args.out)? {
        Format::Parquet => {
            let mut w = ReceiptParquetWriter::create(&args.out)?;
            for i in 0..args.n {
                w.write(&receipt(&mut rng, i, args.bad))?;
                if i % 65_536 == 0 {
                    pb.set_position(i);
                }
            }
            w.finish()?
        }
        Format::Jsonl => {
            let mut w = ReceiptJsonlWriter::create(&args.out)?;
            for i in 0..args.n {
                w.write(&receipt(&mut rng, i, args.bad))?;
                if i % 65_536 == 0 {
                    pb.set_position(i);
                }
            }
            w.finish()?
        }
    };
    pb.finish_and_clear();
    Ok(written)
}

pub fn run(args: GenReceiptsArgs) -> Result<ExitCode> {
    let n = generate(&args)?;
    println!("wrote {n} receipts to {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}
