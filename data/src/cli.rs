//! `decision data ...` and `decision gen ...`: arguments and what they do. The binary's main.rs
//! only lists these enums and calls `run`.
//!
//! Exit codes: 0 done (and clean), 1 the data has bad rows, 2 the command could not run (bad
//! arguments, a missing or unreadable file).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::paths::IoCheck;
use crate::progress;
use crate::quarantine::{Quarantine, errors_path};
use crate::split::SplitRatios;
use crate::states_io::StateReader;
use crate::stats::Stats;
use crate::validate::{DEFAULT_MAX_OPTIONS, ValidateOptions};

/// Check and summarise decision-state datasets (Parquet or JSON Lines, files or folders of shards).
#[derive(Debug, Subcommand)]
pub enum DataCmd {
    Validate(ValidateArgs),
    Stats(StatsArgs),
}

impl DataCmd {
    pub fn run(self) -> Result<ExitCode> {
        match self {
            DataCmd::Validate(a) => validate(a),
            DataCmd::Stats(a) => stats(a),
        }
    }
}

/// The rule options shared by the data commands.
#[derive(Debug, Clone, Args)]
pub struct RuleArgs {
    /// Most candidates a state may offer.
    #[arg(long, default_value_t = DEFAULT_MAX_OPTIONS, value_name = "N")]
    pub max_options: usize,
    /// Shares of tasks for train,valid,test when a state names no split (hash of task_id).
    #[arg(long, default_value = "0.8,0.1,0.1", value_name = "TRAIN,VALID,TEST")]
    pub ratios: SplitRatios,
}

impl RuleArgs {
    pub fn options(&self) -> ValidateOptions {
        ValidateOptions {
            max_options: self.max_options,
            ratios: self.ratios,
        }
    }
}

/// Check every row against the decision-state rules and list what is wrong
///
/// Every error names the file, the row (1-based; the line number for JSON Lines), the field and
/// the reason. Exits 0 when clean, 1 when a row is bad, 2 when the files cannot be read.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  decision data validate demo-out/v1.parquet
  decision data validate states/ extra.jsonl --max-errors 20 --quarantine bad.jsonl")]
pub struct ValidateArgs {
    /// States files (.parquet, .jsonl, .json) or folders of shards.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Errors to list before only counting the rest (0, the default: list them all).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_errors: u64,
    /// Write the bad rows, unchanged, to this JSON Lines file (and why, to FILE's `.errors.jsonl`).
    #[arg(long, value_name = "FILE")]
    pub quarantine: Option<PathBuf>,
    #[command(flatten)]
    pub rules: RuleArgs,
}

/// Summarise a states dataset: counts, histograms, teacher accuracy
///
/// Counts by point, rules, split (explicit or hashed from task_id) and after_error; options per
/// state; answer positions; teacher accuracy (arg-max = answer). Bad rows are counted and left out.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  decision data stats demo-out/v1.parquet
  decision data stats states/ --json > stats.json")]
pub struct StatsArgs {
    /// States files (.parquet, .jsonl, .json) or folders of shards.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub rules: RuleArgs,
}

fn validate(a: ValidateArgs) -> Result<ExitCode> {
    if let Some(q) = &a.quarantine {
        IoCheck::new()
            .inputs("the input", &a.paths)
            .output_file("--quarantine", q)
            .output_file("--quarantine (its errors file)", errors_path(q))
            .check()?;
    }
    let reader = StateReader::open(&a.paths)?;
    let files = reader.files().len();
    let pb = progress::bar(reader.row_count_hint(), "rows");
    let mut quarantine = a.quarantine.as_ref().map(Quarantine::create).transpose()?;
    let mut out = std::io::stdout().lock();
    let (mut rows, mut bad_rows, mut errors) = (0u64, 0u64, 0u64);
    for item in reader.validated(a.rules.options()) {
        let item = item?;
        rows += 1;
        pb.inc(1);
        let Err(bad) = item else { continue };
        bad_rows += 1;
        for line in bad.lines() {
            errors += 1;
            if a.max_errors == 0 || errors <= a.max_errors {
                pb.suspend(|| writeln!(out, "{line}"))?;
            }
        }
        if let Some(q) = quarantine.as_mut() {
            q.add(&bad)?;
        }
    }
    pb.finish_and_clear();
    if a.max_errors > 0 && errors > a.max_errors {
        writeln!(
            out,
            "... {} more error(s) not listed (--max-errors {})",
            errors - a.max_errors,
            a.max_errors
        )?;
    }
    let verdict = if bad_rows == 0 {
        "clean".to_string()
    } else {
        format!("{bad_rows} bad row(s), {errors} error(s)")
    };
    writeln!(out, "checked {rows} row(s) in {files} file(s): {verdict}")?;
    if let Some(q) = quarantine {
        let path = q.path().to_path_buf();
        let n = q.finish()?;
        writeln!(
            out,
            "quarantined {n} row(s) to {} (reasons in {})",
            path.display(),
            errors_path(&path).display()
        )?;
    }
    Ok(if bad_rows == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn stats(a: StatsArgs) -> Result<ExitCode> {
    let reader = StateReader::open(&a.paths)?;
    let pb = progress::bar(reader.row_count_hint(), "rows");
    let mut st = Stats::new();
    for item in reader.validated(a.rules.options()) {
        match item? {
            Ok(row) => st.add(&row.value, &a.rules.ratios),
            Err(_) => st.add_bad(),
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        print!("{}", st.render());
    }
    Ok(ExitCode::SUCCESS)
}
