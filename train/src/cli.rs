//! `decision score`: run a decision model over states and write one line of scores per state.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
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
    let opts = LoadOptions {
        backend: args.backend,
        precision: args.dtype,
        hub: None,
    };
    let model = DecisionModel::load(&args.model, &opts)?;
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

    let mut out = decision_data::atomic::AtomicFile::create(&args.out)?;
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
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
    }
    out.commit()
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
