//! `decision score`: run a decision model over states and write one line of scores per state.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use decision_data::paths::IoCheck;
use serde_json::json;

use crate::backend::{Backend, Precision};
use crate::decision_model::{DecisionModel, LoadOptions};

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Example:\n  decision score --model runs/tiny/model --data demo-out/v1-test.parquet --out demo-out/scores.jsonl\n  decision score --model Qwen/Qwen3-0.6B@main --data states.jsonl --out scores.jsonl --backend wgpu --batch-size 16"
)]
pub struct ScoreArgs {
    /// Model folder (config.json, model.safetensors, tokenizer.json, optional decision.json), or a
    /// Hugging Face Hub id `owner/name[@revision]` (HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE apply).
    #[arg(long)]
    pub model: String,
    /// States: a .parquet / .jsonl file or a folder of shards (repeatable).
    #[arg(long, required = true)]
    pub data: Vec<PathBuf>,
    /// Where to write the scores (JSON Lines, one line per state, in input order).
    #[arg(long)]
    pub out: PathBuf,
    /// States per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// `cpu` (Burn flex) or `wgpu` (Metal / Vulkan).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Compute precision; f16 only where the backend supports it.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub dtype: Precision,
    /// Also write input_ids, attention_mask, option_token_ids, option_logits and temperature.
    #[arg(long)]
    pub emit_tokens: bool,
}

/// Run `decision score`.
pub fn run_score(args: ScoreArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let mut io = IoCheck::new();
    io.inputs("--data", &args.data)
        .output_file("--out", &args.out);
    if Path::new(&args.model).exists() {
        io.input("--model", &args.model);
    }
    io.check()?;
    let opts = LoadOptions {
        backend: args.backend,
        precision: args.dtype,
        hub: None,
    };
    // Opened now, so that an --out that cannot be written fails before the scoring; nothing
    // appears there (and the temporary file, and any folder made for it, go) unless every state
    // is scored.
    let mut staged = decision_data::outputs::Staged::new();
    let out_file = staged.file("--out", &args.out)?;
    let model = DecisionModel::load_as(&format!("--model {}", args.model), &args.model, &opts)?;
    eprintln!(
        "model {} ({} parameters, {} layers) on {} in {:?}",
        model.origin,
        model.config.parameter_count(),
        model.config.num_hidden_layers,
        args.backend,
        args.dtype
    );
    let states = decision_data::read_states(
        &args.data,
        decision_data::ValidateOptions {
            max_options: model.spec.max_options,
            ..Default::default()
        },
    )?;
    let encoded = states
        .iter()
        .map(|s| model.encode(s))
        .collect::<Result<Vec<_>>>()?;
    let points: Vec<&str> = states.iter().map(|s| s.point.as_str()).collect();
    let tokens: usize = encoded.iter().map(|e| e.input_ids.len()).sum();

    let bar = decision_data::progress::bar(Some(states.len() as u64), "states");
    let t0 = Instant::now();
    let scores = model.score_encoded(&encoded, &points, args.batch_size, &mut |n| {
        bar.inc(n as u64)
    });
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    // Nothing reaches --out from a model whose logits overflowed (a NaN pick has no confidence).
    let logits: Vec<Vec<f64>> = scores.iter().map(|s| s.logits.clone()).collect();
    crate::score::check_finite(&logits, &|i| {
        format!(
            "state {:?} (state {} of {} read from --data)",
            states[i].id,
            i + 1,
            states.len()
        )
    })
    .with_context(|| format!("--model {}", args.model))?;

    for ((state, enc), sc) in states.iter().zip(&encoded).zip(&scores) {
        let mut line = json!({
            "id": state.id,
            "pick": state.candidates[sc.pick_index].id,
            "confidence": sc.confidence,
            "probs": sc.probs,
        });
        if args.emit_tokens {
            line["input_ids"] = json!(enc.input_ids);
            line["attention_mask"] = json!(vec![1u8; enc.input_ids.len()]);
            line["option_token_ids"] = json!(enc.option_token_ids);
            line["option_logits"] = json!(sc.logits);
            line["temperature"] = json!(sc.temperature);
            line["truncated"] = json!(enc.truncated);
        }
        let out = staged.get(out_file);
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    staged
        .publish()
        .with_context(|| format!("writing {}", args.out.display()))?;

    let truncated = encoded.iter().filter(|e| e.truncated).count();
    eprintln!(
        "scored {} states ({} prompt tokens) in {:.2}s: {:.1} states/s, {:.0} tokens/s; {} truncated to max_tokens = {}; wrote {} (total {:.2}s)",
        states.len(),
        tokens,
        secs,
        states.len() as f64 / secs.max(1e-9),
        tokens as f64 / secs.max(1e-9),
        truncated,
        model.prompter.max_tokens,
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// What reading `src` (a run folder of ours, a model folder, or a Hub id) reads, as inputs of
/// `io` given as `flag`: for a run folder its `run.toml`, its `final/` model and the states its
/// config names (not the whole folder: receipts or a bundle may be written beside them); for a
/// model folder the folder. A Hub id reads nothing local.
pub fn model_or_run_inputs(io: &mut IoCheck, flag: &str, src: &Path) {
    let run_toml = src.join("run.toml");
    if run_toml.is_file() {
        io.input(flag, &run_toml).input(flag, src.join("final"));
        if let Ok(cfg) = crate::run_config::RunConfig::load(&run_toml, &[]) {
            io.input(&format!("{flag}'s data.train"), &cfg.data.train);
            if let Some(v) = &cfg.data.valid {
                io.input(&format!("{flag}'s data.valid"), v);
            }
        }
    } else if src.exists() {
        io.input(flag, src);
    }
}

/// `decision train`'s paths, checked before any work: the run folder may not be, hold, or lie
/// inside the states it trains on or the model it starts from. (The config file may be the run's
/// own `run.toml`: resuming rewrites it with the same config.)
pub fn check_train_args(args: &crate::trainer::TrainArgs) -> Result<()> {
    let cfg = crate::run_config::RunConfig::load(&args.config, &args.set)?;
    let (flag, run_dir) = match &args.out {
        Some(o) => ("--out".to_string(), o.clone()),
        None => {
            let d = PathBuf::from("runs").join(&cfg.name);
            (format!("the run folder (runs/<name>: {})", d.display()), d)
        }
    };
    let mut io = IoCheck::new();
    io.output_folder(&flag, &run_dir)
        .input("data.train", &cfg.data.train);
    if let Some(v) = &cfg.data.valid {
        io.input("data.valid", v);
    }
    if let Some(src) = &cfg.model.source
        && Path::new(src).exists()
    {
        io.input("model.source", src);
    }
    io.check()
}
