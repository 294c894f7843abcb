//! `decision fit`'s arguments; the run itself is in `run.rs`.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Example:\n  decision fit --receipts receipts/2026-11.jsonl --config configs/fit.toml \\\n      --out thresholds.json --previous thresholds-2026-10.json --report fit-report"
)]
pub struct FitArgs {
    /// Receipt files (.jsonl / .json: contract records or keel DecisionEvents; .parquet: flattened
    /// columns) or folders of such shards; or object-store URLs of files or prefixes
    /// (s3://bucket/receipts/2026-11/, gs://…, az://…, https://…), credentials from the
    /// environment, the AWS profile files or instance metadata.
    #[arg(long, required = true, num_args = 1..)]
    pub receipts: Vec<PathBuf>,
    /// The fit config (policies per decision point, outcome patterns).
    #[arg(long, default_value = "configs/fit.toml")]
    pub config: PathBuf,
    /// Where to write thresholds.json; bad records go beside it in <stem>.quarantine.jsonl. A URL
    /// is written only if nobody else wrote it since the run started (a conditional put).
    #[arg(long)]
    pub out: PathBuf,
    /// The thresholds currently in use: compare against them (never overwritten unless --out
    /// names the same file).
    #[arg(long)]
    pub previous: Option<PathBuf>,
    /// Write report.md and report.html (charts) into this folder.
    #[arg(long)]
    pub report: Option<PathBuf>,
}
