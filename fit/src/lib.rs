//! `decision fit`: receipts (contracts section 3) → per-decision-point confidence thresholds
//! (contracts section 4), by the rules of issue 5.
//!
//! One streaming pass aggregates per point ([`aggregate`]); each point's policy picks a
//! threshold from its confidence buckets ([`policy`], with the bounds of [`bounds`]); the
//! result is written as thresholds.json ([`thresholds`]), compared with a previous file
//! ([`drift`]) and shown in a report (`report.rs`). [`synth`] makes receipts for the demo,
//! the cross-check and the benchmark.

pub mod aggregate;
pub mod bounds;
mod cli;
mod config;
pub mod drift;
mod outputs;
pub mod policy;
mod remote;
mod report;
mod run;
pub mod synth;
pub mod thresholds;

pub use cli::FitArgs;
pub use config::FitConfig;
pub use run::{FitOutcome, fit, run};
pub use synth::GenReceiptsArgs;
