//! `decision sim`: arguments and the run. Loading the model is the caller's (the CLI knows the
//! bundle runtime and the trainer; this crate knows neither), passed in as a closure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use decision_data::r#gen::RulesVersion;
use decision_data::paths::IoCheck;

use crate::Thresholds;
use crate::llm::{DEFAULT_LATENCY_MS, DEFAULT_PRICE, Llm};
use crate::mode::Mode;
use crate::report::{report, svg, table};
use crate::run::{ModeRun, SimConfig, run_mode};
use crate::scorer::{Cache, Scorer};

/// Run the synthetic shop's agent end to end with the decision model deciding where a mode
/// lets it, on N fresh tasks, every mode on the same tasks.
///
/// Each task runs until the agent finishes, fails or runs out of steps: the next state follows
/// from the choice actually made, so a mistake propagates (a wrong lookup costs a step, a wrong
/// cancel_* / refund_* or a premature finish fails the task). The agent's LLM is simulated from
/// the generator's teacher (right about 85 % of the time, confidently wrong where it should ask)
/// at --price and --latency-ms per call; the model's own time is measured.
///
/// Modes: llm (the LLM decides everything), model (the model decides everything it can answer),
/// fixed:T (the model when its confidence >= T), cascade (the model when its confidence clears
/// the point's threshold, the LLM otherwise), shadow (the LLM acts, the model's answer is only
/// recorded). Every mode is compared with llm on the same tasks: success with its 95 % interval,
/// the difference and a one-sided non-inferiority test at a 3-point margin, the share of
/// decisions the model made per point, LLM calls, cost (price per call + 1 per failed task) and
/// time per task.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  # the paper's loop: shadow on fresh tasks, fit, then the cascade beside the baselines
  decision sim --model demo-out/bundle-v1 --rules v1 --tasks 150 --seed 101 --modes shadow \\
      --receipts demo-out/sim/shadow-v1.jsonl
  decision fit --receipts demo-out/sim/shadow-v1.jsonl --config configs/fit.toml --out demo-out/sim/thresholds-v1.json
  decision sim --model demo-out/bundle-v1 --thresholds demo-out/sim/thresholds-v1.json --rules v1 \\
      --tasks 500 --seed 102 --modes llm,model,fixed:0.5,cascade --report demo-out/sim/v1.json

--model takes an export bundle (scored through decision-worker, the harness's code path; its
own thresholds.json is used unless --thresholds is given), a training run folder or a model
folder (scored by decision-train). --report FILE.json also writes FILE.svg (success and cost by
mode). --receipts FILE (.jsonl or .parquet) gets one contract receipt per decision of the shadow
and cascade modes, outcome filled in and the answer key as shadow.reference: `decision fit`
reads it.")]
pub struct SimArgs {
    /// The decision model: a bundle, a run folder or a model folder. Needed by every mode but llm.
    #[arg(long, value_name = "SRC")]
    pub model: Option<String>,
    /// Rules version of the tasks: v1 or v2.
    #[arg(long, value_name = "VERSION", default_value = "v1")]
    pub rules: RulesVersion,
    /// Number of tasks; every mode runs the same ones.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub tasks: usize,
    /// Seed of the tasks (use one that no training data used: the demo trains on seed 7).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Comma-separated modes: llm, model, fixed:T, cascade, shadow.
    #[arg(long, default_value = "llm,cascade")]
    pub modes: String,
    /// thresholds.json for cascade (instead of the bundle's own).
    #[arg(long, value_name = "FILE")]
    pub thresholds: Option<PathBuf>,
    /// Write the shadow and cascade receipts here (.jsonl or .parquet), atomically.
    #[arg(long, value_name = "FILE")]
    pub receipts: Option<PathBuf>,
    /// Write the report (decision-sim/1 JSON) here, and the chart beside it as .svg.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
    /// Price of one LLM call, in units of a solved task's worth (a failed task costs 1).
    #[arg(long, default_value_t = DEFAULT_PRICE)]
    pub price: f64,
    /// Latency of one LLM call in milliseconds (JevAgentHarness: 809 for Gemini Flash).
    #[arg(long, default_value_t = DEFAULT_LATENCY_MS, value_name = "MS")]
    pub latency_ms: f64,
    /// States the model scores per call.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
}

/// A loaded model: the scorer and, for a bundle, its own thresholds.
pub struct LoadedModel {
    pub scorer: Box<dyn Scorer>,
    pub thresholds: Option<Thresholds>,
}

/// The chart's path beside the report: `r.json` → `r.svg`.
pub fn svg_path(report: &Path) -> PathBuf {
    report.with_extension("svg")
}

/// Read the thresholds of a `thresholds.json` (contracts section 4), each checked.
pub fn read_thresholds(path: &Path) -> Result<Thresholds> {
    let file = decision_data::contract::thresholds::ThresholdsFile::read(path)?;
    Ok(file.thresholds().into_iter().collect())
}

/// What one simulation produced.
pub struct SimOutcome {
    pub runs: Vec<ModeRun>,
    pub report: serde_json::Value,
}

/// Run the modes of `args` with `model` (already loaded, when a mode needs it).
pub fn simulate(args: &SimArgs, model: Option<LoadedModel>) -> Result<SimOutcome> {
    let modes = Mode::parse_list(&args.modes)?;
    if !(args.price.is_finite() && args.price >= 0.0) {
        bail!("--price {} is not a non-negative number", args.price);
    }
    if !(args.latency_ms.is_finite() && args.latency_ms >= 0.0) {
        bail!(
            "--latency-ms {} is not a non-negative number",
            args.latency_ms
        );
    }
    if args.tasks == 0 {
        bail!("--tasks 0: nothing to simulate");
    }
    let needs_model = modes.iter().any(|m| m.uses_model());
    let (mut scorer, bundle_thresholds) = match model {
        Some(m) => (Some(m.scorer), m.thresholds),
        None if needs_model => bail!(
            "--modes {} needs a decision model: --model BUNDLE, RUN or MODEL folder",
            args.modes
        ),
        None => (None, None),
    };
    let thresholds = match (&args.thresholds, bundle_thresholds) {
        (Some(p), _) => read_thresholds(p)?,
        (None, Some(t)) => t,
        (None, None) => Thresholds::new(),
    };
    if modes.contains(&Mode::Cascade) && thresholds.is_empty() {
        bail!(
            "mode cascade needs thresholds: --thresholds FILE, or a bundle exported with \
             --thresholds (this model has none)"
        );
    }
    if args.receipts.is_some() && !modes.iter().any(|m| m.writes_receipts()) {
        bail!("--receipts: only the shadow and cascade modes write receipts; add one to --modes");
    }
    let cfg = SimConfig {
        rules: args.rules,
        tasks: args.tasks,
        seed: args.seed,
        llm: Llm {
            price_per_call: args.price,
            latency_ms: args.latency_ms,
        },
        thresholds,
        at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    let mut cache = scorer.as_deref_mut().map(|s| Cache::new(s, args.batch));
    let model_name = cache.as_ref().map(Cache::name);
    let mut runs = Vec::new();
    for &mode in &modes {
        let t = std::time::Instant::now();
        let run = run_mode(&cfg, mode, cache.as_mut())?;
        eprintln!(
            "sim: {mode} on {} tasks in {:.1} s",
            cfg.tasks,
            t.elapsed().as_secs_f64()
        );
        runs.push(run);
    }
    // The reference for every comparison: llm on the same tasks (cheap: no model).
    let llm_run = match runs.iter().position(|r| r.mode == Mode::Llm) {
        Some(_) => None,
        None => Some(run_mode(&cfg, Mode::Llm, None)?),
    };
    let llm = llm_run
        .as_ref()
        .or_else(|| runs.iter().find(|r| r.mode == Mode::Llm))
        .expect("an llm run");
    let (scored, hits) = cache.as_ref().map_or((0, 0), |c| (c.scored, c.hits));
    let rep = report(&cfg, &runs, llm, model_name.as_deref(), scored, hits);
    Ok(SimOutcome { runs, report: rep })
}

/// `decision sim`: check the paths, load the model with `load` (given `--model`), simulate, and
/// write the report, the chart and the receipts.
pub fn run(args: &SimArgs, load: impl FnOnce(&str) -> Result<LoadedModel>) -> Result<ExitCode> {
    let mut io = IoCheck::new();
    if let Some(m) = &args.model {
        io.input("--model", m);
    }
    if let Some(t) = &args.thresholds {
        io.input("--thresholds", t);
    }
    if let Some(r) = &args.report {
        io.output_file("--report", r)
            .output_file("--report's chart", svg_path(r));
    }
    if let Some(r) = &args.receipts {
        io.output_file("--receipts", r);
    }
    io.check()?;
    if let Some(r) = &args.report
        && r.extension().and_then(|e| e.to_str()) != Some("json")
    {
        bail!(
            "--report {}: name a .json file (the chart goes beside it as .svg)",
            r.display()
        );
    }
    // Every output is opened before the simulation, so a path that cannot be written stops it
    // first; the outputs land together at the end, or none does.
    let mut staged = decision_data::outputs::Staged::new();
    let report_files = match &args.report {
        Some(r) => Some((
            staged.file("--report's chart", &svg_path(r))?,
            staged.file("--report", r)?,
        )),
        None => None,
    };
    let mut receipts_out = match &args.receipts {
        Some(path) => {
            staged.will_create(decision_data::outputs::parent(path));
            Some(
                decision_data::receipts_io::ReceiptWriter::create(path)
                    .with_context(|| format!("--receipts {}", path.display()))?,
            )
        }
        None => None,
    };
    let model = args.model.as_deref().map(load).transpose()?;
    let out = simulate(args, model)?;
    print!("{}", table(&out.report));
    if let Some(w) = &mut receipts_out {
        for r in out.runs.iter().flat_map(|r| &r.receipts) {
            w.write(r)?;
        }
    }
    if let Some((chart, report)) = report_files {
        staged.get(chart).write_all(svg(&out.report).as_bytes())?;
        let mut json = serde_json::to_vec_pretty(&out.report)?;
        json.push(b'\n');
        staged.get(report).write_all(&json)?;
    }
    staged.publish()?;
    if let (Some(w), Some(path)) = (receipts_out, &args.receipts) {
        let n = w
            .finish()
            .with_context(|| format!("writing --receipts {}", path.display()))?;
        println!("receipts  {} ({n})", path.display());
    }
    if let Some(path) = &args.report {
        println!(
            "report    {} , {}",
            path.display(),
            svg_path(path).display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
