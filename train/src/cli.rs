//! The arguments of `decision score`, `decision train` and `decision eval` (clap); each command's
//! pipeline is in `run.rs`.

use std::path::PathBuf;

use crate::model::backend::{Backend, Precision};

/// `decision score`
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
    /// States per forward pass, at most. On the CPU a batch runs per thread side by side, or as
    /// many as the RAM available holds; on a GPU batches go one at a time, each of no more
    /// states than the device's memory holds. Either way the scores are the same, and stderr
    /// says where fewer ran.
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

/// `decision train`
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Example:\n  decision train --config configs/tiny.toml --out runs/tiny-v1\n  \
decision train --config configs/tiny.toml --set train.max_steps=50 --set optim.lr=3e-4\n  \
decision train --config configs/tiny.toml --out runs/tiny-v1 --resume\n\n\
Progress goes to stderr: a bar on a terminal; otherwise (a log file, a batch job, CI) a line \
when the model is set up and one per logged step (`[train] log_every`) and evaluation. \
Each logged step is also a `train` line in the run folder's metrics.jsonl."
)]
pub struct TrainArgs {
    /// The run config (TOML); see configs/tiny.toml for every key.
    #[arg(long)]
    pub config: PathBuf,
    /// Override a config key, e.g. `--set train.max_steps=200` (repeatable; unknown keys are errors).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue the run in the run folder from its newest intact checkpoint (its files match the
    /// hashes recorded when it was written; a damaged one is passed over with a warning).
    #[arg(long)]
    pub resume: bool,
    /// Run folder (default: runs/<name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the run's memory plan (weights, trainable state, activations per micro-batch with
    /// and without `[train] recompute`, against the device's memory) and exit without training.
    /// Every run checks the same plan first and refuses one that does not fit;
    /// DECISION_DEVICE_MEMORY=GiB sets the budget where the device's memory cannot be read.
    /// `[train] dtype = "auto"` is planned as the dtype the device will run.
    #[arg(long)]
    pub plan: bool,
    /// Shorthand for `--set train.backend=...`: `cpu` (Burn flex) or `wgpu` (the GPU: Metal's MSL
    /// on macOS, Vulkan's SPIR-V elsewhere). A wgpu run first names the adapter, the compiler,
    /// the dtypes the device computes and its memory.
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
}

/// `decision eval`
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  decision eval --run runs/tiny-v1 --data demo-out/v1.parquet --split test\n  \
decision eval --run runs/tiny-v2 --data v2.parquet --split test --baseline runs/tiny-v1 --permutations 2\n  \
decision eval --model Qwen/Qwen3-0.6B --data states.jsonl --receipts receipts.jsonl"
)]
pub struct EvalArgs {
    /// A run folder of ours (its final/ model; its validation states when --data is absent).
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    pub run: Option<PathBuf>,
    /// A model folder or Hub id (`owner/name[@revision]`).
    #[arg(long)]
    pub model: Option<String>,
    /// States to evaluate (Parquet/JSON Lines file or folder); required with --model.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Which split of --data to evaluate: all (the default), train, valid or test. Without
    /// --data, eval takes the run's validation states, and --split is refused.
    #[arg(long, requires = "data")]
    pub split: Option<String>,
    /// Write one shadow receipt per state here (contracts section 3), for `decision fit`.
    #[arg(long)]
    pub receipts: Option<PathBuf>,
    /// Evaluate this run folder or model on the same states and show both side by side.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Extra random candidate orders per state for the flip rate (0 = skip).
    #[arg(long, default_value_t = 0)]
    pub permutations: usize,
    /// Seed of the candidate orders for the flip rate.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// States per forward pass, at most; sized to the memory free as `decision score` does.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// `cpu` (Burn flex) or `wgpu` (Metal / Vulkan).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Write the metrics as JSON here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Name for the receipts' `model` field (default: the run's name, or the model source).
    #[arg(long)]
    pub name: Option<String>,
}
