//! `decision`: the command line. This file only parses arguments and dispatches; each command's
//! arguments and `run` live in the crate that owns it. Adding a command is two lines: a variant
//! below and its arm in `main`. Every `run` returns `anyhow::Result<ExitCode>`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
mod sim;

#[derive(Parser)]
#[command(
    name = "decision",
    version,
    about = "Train, calibrate and ship the decision model behind an agent harness",
    after_help = "Example:\n  decision gen states --rules v1 --tasks 2000 --seed 7 --out demo-out/v1.parquet\n  decision data validate demo-out/v1.parquet"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check and summarise decision-state datasets (Parquet or JSON Lines)
    #[command(
        subcommand,
        after_help = "Example:\n  decision data validate demo-out/v1.parquet\n  decision data stats demo-out/v1.parquet"
    )]
    Data(decision_data::cli::DataCmd),
    /// Generate synthetic data (decision states from a simulated shop)
    #[command(
        subcommand,
        after_help = "Example:\n  decision gen states --rules v1 --tasks 2000 --seed 7 --out demo-out/v1.parquet\n  decision gen receipts --n 20000 --seed 7 --bad 0.001 --out demo-out/receipts.parquet"
    )]
    Gen(Gen),
    /// Fit per-decision-point confidence thresholds from receipts (thresholds.json, report)
    Fit(decision_fit::FitArgs),
    /// Score states with a decision model: probabilities per candidate, pick, confidence
    Score(decision_train::cli::ScoreArgs),
    /// Fine-tune the decision model on recorded states (full or LoRA), with checkpoints
    Train(decision_train::cli::TrainArgs),
    /// Evaluate a model or run on states: metrics, flip rate, shadow receipts, baseline
    Eval(decision_train::cli::EvalArgs),
    /// Export a model as the harness bundle (ONNX, PEFT adapter, manifest), parity-checked first
    Export(decision_export::cli::ExportArgs),
    /// Check an export bundle (`decision bundle verify BUNDLE`)
    #[command(subcommand)]
    Bundle(decision_export::cli::BundleCmd),
    /// Run the shop's agent with the model deciding above its thresholds: success, delegation,
    /// cost per mode, on paired tasks; shadow / cascade receipts for `fit`
    Sim(decision_sim::SimArgs),
    /// The whole job on synthetic data: generate, train, eval, fit, retrain on new rules, refit, export, verify, and the agent loop (sim) with each model
    Demo(demo::DemoArgs),
}

/// `decision gen ...`: the generators live with the records they make.
#[derive(Subcommand)]
enum Gen {
    States(decision_data::r#gen::GenStatesArgs),
    /// Generate synthetic receipts (fit's cross-check and benchmark)
    Receipts(decision_fit::GenReceiptsArgs),
}

fn main() -> ExitCode {
    // SAFETY: first thing in main, before any thread exists.
    unsafe {
        decision_train::model::backend::quiet_headless_vulkan();
        let _ = decision_train::model::host_memory::keep_freed_memory();
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Data(cmd) => cmd.run(),
        Command::Gen(Gen::States(args)) => decision_data::r#gen::cli::run(args),
        Command::Gen(Gen::Receipts(args)) => decision_fit::synth::run(args),
        Command::Fit(args) => decision_fit::run(args),
        Command::Score(args) => decision_train::run::score(args),
        Command::Train(args) => decision_train::run::train(&args),
        Command::Eval(args) => decision_train::run::eval(&args),
        Command::Export(args) => args.run(),
        Command::Bundle(cmd) => cmd.run(),
        Command::Sim(args) => decision_sim::cli::run(&args, sim::load),
        Command::Demo(args) => demo::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
