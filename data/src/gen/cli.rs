//! `decision gen states`: arguments and what the command does.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::{GenOptions, RulesVersion, changed_rule, task_id, task_states};
use crate::progress;
use crate::split::SplitRatios;
use crate::states_io::StateWriter;

/// Generate decision states from the simulated customer-service shop: `tool`, `args` and
/// `stop` decisions with their answer key, a simulated teacher, states after injected mistakes,
/// and the train / valid / test split by task. The same seed gives the same bytes; `v1` and `v2`
/// share every task and differ only where the changed shipped-order rule applies.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  decision gen states --rules v1 --tasks 2000 --seed 7 --out data/demo/v1.parquet
  decision gen states --rules v2 --tasks 2000 --seed 7 --out data/demo/v2.jsonl --split 0.7,0.15,0.15")]
pub struct GenStatesArgs {
    /// Rules version the answer key follows: v1 or v2.
    #[arg(long, value_name = "VERSION")]
    pub rules: RulesVersion,
    /// Number of tasks (episodes); each gives six to seven states on average.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub tasks: usize,
    /// Seed: the same seed gives the same tasks (and the same bytes) for either version.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Output file: .parquet, or .jsonl / .json for JSON Lines; written atomically.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Shares of tasks for train,valid,test.
    #[arg(long, default_value = "0.8,0.1,0.1", value_name = "TRAIN,VALID,TEST")]
    pub split: SplitRatios,
}

/// Write the states and print a one-paragraph summary.
pub fn run(args: GenStatesArgs) -> Result<ExitCode> {
    let opts = GenOptions {
        rules: args.rules,
        tasks: args.tasks,
        seed: args.seed,
        splits: args.split,
    };
    opts.check()?;
    let mut writer = StateWriter::create(&args.out)?;
    let pb = progress::bar(Some(opts.tasks as u64), "tasks");
    let (mut after_error, mut touched) = (0u64, 0u64);
    let mut points: Vec<(String, u64)> = Vec::new();
    for index in 0..opts.tasks as u64 {
        let split = opts.splits.split_of_task(&task_id(opts.seed, index));
        for g in task_states(opts.rules, opts.seed, index, split.as_str()) {
            after_error += u64::from(g.state.after_error);
            touched += u64::from(g.touched());
            match points.iter_mut().find(|(p, _)| *p == g.state.point) {
                Some((_, n)) => *n += 1,
                None => points.push((g.state.point.clone(), 1)),
            }
            writer
                .write(&g.state)
                .with_context(|| format!("writing {}", args.out.display()))?;
        }
        pb.inc(1);
    }
    let rows = writer.finish()?;
    pb.finish_and_clear();
    let share = |n: u64| 100.0 * n as f64 / rows.max(1) as f64;
    let by_point: Vec<String> = points
        .iter()
        .map(|(p, n)| format!("{p} {n} ({:.1}%)", share(*n)))
        .collect();
    // writeln! rather than println!: a closed pipe is an error to report, not a panic.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "wrote {rows} states of {} tasks (rules {}, seed {}) to {}",
        opts.tasks,
        opts.rules,
        opts.seed,
        args.out.display()
    )?;
    writeln!(out, "  points: {}", by_point.join(", "))?;
    writeln!(
        out,
        "  after an error: {after_error} ({:.1}%)",
        share(after_error)
    )?;
    let other = match opts.rules {
        RulesVersion::V1 => "v2",
        RulesVersion::V2 => "v1",
    };
    writeln!(
        out,
        "  answered differently under {other} (the changed rule): {touched} ({:.1}%)",
        share(touched)
    )?;
    for (version, rule) in changed_rule() {
        writeln!(out, "  {version}: {rule}")?;
    }
    Ok(ExitCode::SUCCESS)
}
