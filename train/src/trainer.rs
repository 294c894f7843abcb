//! `decision train`: supervised fine-tuning on recorded decision states.
//!
//! # The run folder
//!
//! ```text
//! RUN_DIR/
//!   run.toml              the resolved run config (file + --set overrides + defaults)
//!   metrics.jsonl         one JSON object per line: {"kind":"train", step, epoch, loss, lr,
//!                         grad_norm, tokens, tokens_per_s, elapsed_s} every `log_every` steps,
//!                         {"kind":"eval", step, split:"valid", n, accuracy, nll, brier, ece, loss}
//!                         every `eval_every` steps, and one {"kind":"final", ...} line
//!   quarantine.jsonl      only with [data] skip_bad: the rejected rows, untouched
//!                         (+ quarantine.errors.jsonl saying what is wrong with each)
//!   tokenizer.json        for init = "random": the word-level tokenizer built from the data
//!   checkpoints/step-NNNNNNN/   see [`crate::checkpoint`] (atomic, COMPLETE marker, newest kept)
//!   final/                a model folder `DecisionModel::load` reads: config.json,
//!                         model.safetensors (f32; for LoRA runs the adapters merged into the
//!                         base), tokenizer.json, decision.json (prompt, labels, max_options,
//!                         max_tokens, the fitted temperature per decision point and the global
//!                         one), and for LoRA runs adapter/ (PEFT layout: adapter_config.json with
//!                         base_model_name_or_path = the base, adapter_model.safetensors)
//!   summary.json          validation metrics at T = 1 and at the fitted temperatures, ECE
//!                         before/after, flip rate, temperatures, steps, tokens/s, wall time
//!   plots/loss.svg        training loss per step and validation loss per evaluation
//!   plots/reliability.svg reliability diagram on the validation split, before/after T
//! ```
//!
//! # Determinism and resume
//!
//! The epoch order is a shuffle seeded by (seed, epoch); the candidate order of example `i` in
//! epoch `e` by (seed, e, i); the dropout stream is reseeded by (seed, step, micro-batch) before
//! every forward pass. So the whole random state of a run is its seed plus the data position,
//! which the checkpoint stores; `--resume` continues from the newest complete checkpoint exactly
//! as if the run had not stopped (same backend).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Device;
use decision_data::{Split, SplitRatios, State};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::calibration::{self, Temperatures};
use crate::checkpoint::{self, PendingCheckpoint, TrainerState};
use crate::config::Qwen3Config;
use crate::decision_model::{DecisionModel, LoadOptions};
use crate::lora::{self, LoraSpec};
use crate::loss::{LossTargets, LossWeights, batch_loss};
use crate::metrics::{Bin, Report, ScoredState};
use crate::model::Batch;
use crate::optim::{AdamW, AdamWSettings, Schedule, clip_factor, global_grad_norm};
use crate::run_config::{Init, Mode, RunConfig};
use crate::spec::{DecisionSpec, PromptTemplate};

/// `decision train`
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Example:\n  decision train --config configs/tiny.toml --out runs/tiny-v1\n  \
decision train --config configs/tiny.toml --set train.max_steps=50 --set optim.lr=3e-4\n  \
decision train --config configs/tiny.toml --out runs/tiny-v1 --resume"
)]
pub struct TrainArgs {
    /// The run config (TOML); see configs/tiny.toml for every key.
    #[arg(long)]
    pub config: PathBuf,
    /// Override a config key, e.g. `--set train.max_steps=200` (repeatable; unknown keys are errors).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue the run in the run folder from its newest complete checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Run folder (default: runs/<name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the run's memory plan (weights, trainable state, activations per micro-batch with
    /// and without `[train] recompute`, against the device's memory) and exit without training.
    /// Every run checks the same plan first and refuses one that does not fit;
    /// DECISION_DEVICE_MEMORY=GiB sets the budget where the device's memory cannot be read.
    #[arg(long)]
    pub plan: bool,
}

pub fn run(args: &TrainArgs) -> Result<std::process::ExitCode> {
    let cfg = RunConfig::load(&args.config, &args.set)?;
    if args.plan {
        let arch = crate::plan::architecture(&cfg)?;
        let plan = crate::plan::plan(&cfg, &arch);
        let device = crate::plan::device_limit(cfg.train.backend)?;
        print!("{}", plan.render(&cfg, device.as_ref()));
        if let Some(dev) = &device {
            if let Err(e) = plan.check(&cfg, &arch, dev) {
                println!("  does not fit: {e:#}");
                return Ok(std::process::ExitCode::from(1));
            }
            println!("  fits");
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let run_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name));
    let opts = TrainOptions {
        resume: args.resume,
        progress: std::io::stderr().is_terminal(),
        stop_after: None,
    };
    let s = train(&cfg, &run_dir, &opts)?;
    println!("run folder      {}", run_dir.display());
    println!(
        "steps           {} ({:.0} tokens/s, {:.1} s)",
        s.steps, s.tokens_per_s, s.wall_s
    );
    println!(
        "valid           n = {}  accuracy {:.4}  nll {:.4}  brier {:.4}",
        s.valid_after.n, s.valid_after.accuracy, s.valid_after.nll, s.valid_after.brier
    );
    println!(
        "ECE             {:.4} at T = 1 -> {:.4} at the fitted temperatures",
        s.valid_before.ece, s.valid_after.ece
    );
    if let Some(f) = s.flip_rate {
        println!(
            "flip rate       {:.4} ({} extra candidate orders)",
            f, cfg.eval.permutations
        );
    }
    println!(
        "temperatures    global {:.3} {:?}",
        s.temperatures.global, s.temperatures.points
    );
    println!("model           {}", run_dir.join("final").display());
    Ok(std::process::ExitCode::SUCCESS)
}

/// How to run [`train`].
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    pub resume: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Stop (after checkpointing) once this many steps are done, without finishing the run:
    /// what an interrupted run looks like. For tests.
    pub stop_after: Option<u64>,
}

/// What a finished run reports (also written to `summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainSummary {
    pub schema: String,
    pub name: String,
    pub steps: u64,
    pub tokens: u64,
    pub tokens_per_s: f64,
    pub wall_s: f64,
    pub trainable_params: usize,
    pub total_params: usize,
    pub valid_before: crate::metrics::Metrics,
    pub valid_after: crate::metrics::Metrics,
    pub report_after: Report,
    pub flip_rate: Option<f64>,
    pub temperatures: Temperatures,
    pub final_train_loss: Option<f32>,
    /// True when the run stopped early (`stop_after`) and `final/` was not written.
    pub interrupted: bool,
}

/// Derive a seed for a sub-stream: (seed, a, b) → u64 (SplitMix64 of a simple mix).
pub fn mix_seed(seed: u64, a: u64, b: u64) -> u64 {
    let mut z =
        seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The order of the training examples in epoch `epoch`.
pub fn epoch_order(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(seed, 1 + epoch, 0));
    order.shuffle(&mut rng);
    order
}

/// Examples per length bucket, in batches: a shuffled epoch is cut into pools of this many
/// batches, each pool is sorted by length and cut into batches, and the batches of a pool are
/// shuffled. Batches then hold prompts of similar length (little padding) while the order stays
/// random and a pure function of (seed, epoch).
pub const BUCKET_BATCHES: usize = 16;

/// The epoch order with length bucketing (see [`BUCKET_BATCHES`]); `lengths[i]` is example
/// `i`'s approximate prompt length.
pub fn bucketed_order(seed: u64, epoch: u64, lengths: &[usize], batch: usize) -> Vec<usize> {
    let order = epoch_order(seed, epoch, lengths.len());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(seed, 1 + epoch, 1));
    let mut out = Vec::with_capacity(order.len());
    for pool in order.chunks(batch.max(1) * BUCKET_BATCHES) {
        let mut pool = pool.to_vec();
        pool.sort_by_key(|&i| (lengths[i], i));
        let mut batches: Vec<&[usize]> = pool.chunks(batch.max(1)).collect();
        batches.shuffle(&mut rng);
        for b in batches {
            out.extend_from_slice(b);
        }
    }
    out
}

/// A cheap stand-in for a state's prompt length: words of its context and candidate labels.
pub fn approx_length(s: &State) -> usize {
    s.context.split_whitespace().count()
        + s.candidates
            .iter()
            .map(|c| 2 + c.label.split_whitespace().count())
            .sum::<usize>()
}

/// The candidate order of example `index` in epoch `epoch` (identity when not shuffling).
pub fn candidate_order(seed: u64, epoch: u64, index: usize, k: usize, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..k).collect();
    if shuffle {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(
            seed,
            0x5eed_0000 + epoch,
            index as u64 + 1,
        ));
        order.shuffle(&mut rng);
    }
    order
}

/// `state` with its candidates (and teacher) presented in `order` (`order[i]` = original index
/// of the candidate shown at position `i`); the answer id moves with its candidate.
pub fn permuted(state: &State, order: &[usize]) -> State {
    let mut s = state.clone();
    s.candidates = order.iter().map(|&i| state.candidates[i].clone()).collect();
    s.teacher = state
        .teacher
        .as_ref()
        .map(|t| order.iter().map(|&i| t[i]).collect());
    s
}

/// Read states (one file, a folder of shards, JSON Lines or Parquet), checked against the
/// contract. Bad rows fail the run, or with `quarantine` are written there and skipped.
pub fn load_states(
    path: &Path,
    max_options: usize,
    quarantine: Option<&Path>,
) -> Result<Vec<State>> {
    let opts = decision_data::ValidateOptions {
        max_options,
        ..Default::default()
    };
    let paths = [path.to_path_buf()];
    let Some(qpath) = quarantine else {
        return decision_data::read_states(&paths, opts);
    };
    let mut q = decision_data::Quarantine::create(qpath)?;
    let mut states = Vec::new();
    for item in decision_data::StateReader::open(&paths)?.validated(opts) {
        match item? {
            Ok(row) => states.push(row.value),
            Err(bad) => q.add(&bad)?,
        }
    }
    let n = q.finish()?;
    if n > 0 {
        eprintln!(
            "skipped {n} bad row(s) of {}; they are in {}",
            path.display(),
            qpath.display()
        );
    }
    Ok(states)
}

/// Training and validation states of a run (see the module docs for the rule).
///
/// Training: the rows of `[data] train` whose split is `train` (explicit, or by hashing the
/// task id when absent — absent counts as `train` when a separate `valid` file is given).
/// Validation: every row of `[data] valid`, or when there is none, the rows of `train` whose
/// split is `valid`. Test rows are never used.
pub fn load_run_states(cfg: &RunConfig, run_dir: &Path) -> Result<(Vec<State>, Vec<State>)> {
    let quarantine = cfg.data.skip_bad.then(|| run_dir.join("quarantine.jsonl"));
    let all = load_states(&cfg.data.train, cfg.data.max_options, quarantine.as_deref())?;
    let ratios = SplitRatios::default();
    let separate_valid = cfg.data.valid.is_some();
    let split_of = |s: &State| match s.split.as_deref().and_then(Split::parse) {
        Some(sp) => sp,
        None if separate_valid => Split::Train,
        None => ratios.split_of_task(&s.task_id),
    };
    let (mut train, mut valid) = (Vec::new(), Vec::new());
    for s in all {
        match split_of(&s) {
            Split::Train => train.push(s),
            Split::Valid if !separate_valid => valid.push(s),
            _ => {}
        }
    }
    if let Some(v) = &cfg.data.valid {
        let q = cfg
            .data
            .skip_bad
            .then(|| run_dir.join("quarantine.valid.jsonl"));
        valid = load_states(v, cfg.data.max_options, q.as_deref())?;
    }
    let unlabeled = train.iter().filter(|s| s.answer.is_none()).count();
    train.retain(|s| s.answer.is_some());
    if unlabeled > 0 {
        eprintln!("{unlabeled} unlabeled training state(s) have no answer and are not trained on");
    }
    valid.retain(|s| s.answer.is_some());
    if train.is_empty() {
        bail!("{}: no labelled training states", cfg.data.train.display());
    }
    if valid.is_empty() {
        bail!(
            "no labelled validation states (give [data] valid, or states whose split is `valid`)"
        );
    }
    Ok((train, valid))
}

/// Build the starting model: a pretrained folder / Hub id, or a fresh random model with a
/// word-level tokenizer made from `train`.
pub fn initial_model(cfg: &RunConfig, train: &[State], device: &Device) -> Result<DecisionModel> {
    match cfg.model.init {
        Init::Pretrained => {
            let src = cfg.model.source.as_deref().expect("checked");
            let backend = cfg.train.backend;
            let dm = DecisionModel::load(
                src,
                &LoadOptions {
                    backend,
                    precision: cfg.train.dtype,
                    ..Default::default()
                },
            )?;
            let mut spec = dm.spec.clone();
            spec.max_options = cfg.data.max_options;
            spec.max_tokens = cfg.data.max_tokens;
            spec.label_token_ids.clear();
            let tok = dm.prompter.tokenizer.clone();
            DecisionModel::from_parts(dm.config, dm.model, tok, Some(spec), &dm.origin)
        }
        Init::Random => {
            let mut template = PromptTemplate::plain();
            if let Some(option) = &cfg.model.option_template {
                template.option = option.clone();
            }
            let mut spec = DecisionSpec::defaults(template);
            spec.max_options = cfg.data.max_options;
            spec.max_tokens = cfg.data.max_tokens;
            let literal = crate::prompt::Template::parse(&spec.template)?.literal_text();
            let labels: Vec<&str> = spec
                .labels
                .iter()
                .take(spec.max_options)
                .map(String::as_str)
                .collect();
            let mut required = vec![literal.as_str()];
            required.extend(labels);
            let corpus = train.iter().flat_map(|s| {
                std::iter::once(s.point.as_str())
                    .chain(std::iter::once(s.context.as_str()))
                    .chain(s.candidates.iter().map(|c| c.label.as_str()))
            });
            let opts = crate::tokenizer::WordLevelOptions {
                min_count: cfg.model.min_token_count,
                max_vocab: None,
            };
            let tok = crate::tokenizer::build_word_level(corpus, &required, &opts)?;
            let arch = cfg.model.arch.clone().expect("checked");
            let mut json = serde_json::to_value(&arch)?;
            json["model_type"] = "qwen3".into();
            if json.get("vocab_size").is_none() {
                json["vocab_size"] = tok.get_vocab_size(true).into();
            }
            let qcfg = Qwen3Config::from_json(&json).context("[model.arch]")?;
            device.seed(mix_seed(cfg.train.seed, 0x1417, 0));
            let std = json
                .get("initializer_range")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.02);
            let model = crate::model::init_random(&qcfg, std, device);
            DecisionModel::from_parts(qcfg, model, tok, Some(spec), "random init")
        }
    }
}

fn lora_spec(cfg: &RunConfig) -> LoraSpec {
    LoraSpec {
        rank: cfg.lora.rank,
        alpha: cfg.lora.alpha,
        dropout: cfg.lora.dropout,
        targets: cfg.lora.targets.clone(),
    }
}

fn adamw_settings(cfg: &RunConfig) -> AdamWSettings {
    AdamWSettings {
        beta1: cfg.optim.beta1,
        beta2: cfg.optim.beta2,
        eps: cfg.optim.eps,
        weight_decay: cfg.optim.weight_decay,
    }
}

/// Steps the run makes in total.
pub fn total_steps(cfg: &RunConfig, n_train: usize) -> u64 {
    let per_step = (cfg.train.batch_size * cfg.optim.grad_accum) as u64;
    let by_epochs = (cfg.train.epochs * n_train as u64)
        .div_ceil(per_step)
        .max(1);
    match cfg.train.max_steps {
        0 => by_epochs,
        m if cfg.train.epochs == 0 => m,
        m => m.min(by_epochs),
    }
}

/// The training data stream: epoch orders and candidate orders from the seed.
struct Stream<'a> {
    states: &'a [State],
    lengths: Vec<usize>,
    batch: usize,
    seed: u64,
    shuffle: bool,
    epoch: u64,
    position: usize,
    order: Vec<usize>,
}

impl<'a> Stream<'a> {
    fn new(
        states: &'a [State],
        batch: usize,
        seed: u64,
        shuffle: bool,
        epoch: u64,
        position: usize,
    ) -> Self {
        let lengths: Vec<usize> = states.iter().map(approx_length).collect();
        let order = bucketed_order(seed, epoch, &lengths, batch);
        Self {
            states,
            lengths,
            batch,
            seed,
            shuffle,
            epoch,
            position,
            order,
        }
    }

    fn next(&mut self) -> State {
        if self.position >= self.order.len() {
            self.epoch += 1;
            self.position = 0;
            self.order = bucketed_order(self.seed, self.epoch, &self.lengths, self.batch);
        }
        let i = self.order[self.position];
        self.position += 1;
        let s = &self.states[i];
        permuted(
            s,
            &candidate_order(self.seed, self.epoch, i, s.candidates.len(), self.shuffle),
        )
    }
}

/// One training micro-batch on the host.
struct MicroBatch {
    batch: Batch,
    targets: LossTargets,
    label_ids: Vec<u32>,
    tokens: u64,
}

fn micro_batch(dm: &DecisionModel, states: &[State], teacher_blend: f32) -> Result<MicroBatch> {
    let mut rows = Vec::with_capacity(states.len());
    let mut tgt = Vec::with_capacity(states.len());
    for s in states {
        let e = dm.prompter.encode(s)?;
        let teacher = s
            .teacher
            .as_ref()
            .map(|t| t.iter().map(|&x| x as f32).collect());
        tgt.push((
            s.candidates.len(),
            s.answer_index().expect("labelled"),
            teacher,
        ));
        rows.push(e.input_ids);
    }
    let kmax = tgt.iter().map(|t| t.0).max().unwrap_or(0);
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let tokens = rows.iter().map(|r| r.len() as u64).sum();
    Ok(MicroBatch {
        batch: Batch::left_padded(&refs, dm.pad_id),
        targets: LossTargets::build(&tgt, teacher_blend),
        label_ids: dm.prompter.label_token_ids[..kmax].to_vec(),
        tokens,
    })
}

/// What one shard of a micro-batch contributes: its gradients, its (scaled) loss, its tokens.
struct ShardOut {
    grads: GradientsParams,
    loss: f32,
    tokens: u64,
}

/// The model with every trainable parameter re-rooted as a new autodiff leaf (same values and
/// parameter ids, so its gradients accumulate onto the original's). Shards on parallel threads
/// must not share a tracked node: Burn merges autodiff graphs that do, serialising their backward
/// passes, and a merge racing a backward pass can deadlock on Burn's two graph locks.
fn fresh_leaves(model: &crate::model::Qwen3) -> crate::model::Qwen3 {
    struct Reroot;
    impl burn::module::ModuleMapper for Reroot {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<burn::tensor::Tensor<D>>,
        ) -> burn::module::Param<burn::tensor::Tensor<D>> {
            let (id, tensor, mapper) = param.consume();
            let tensor = if tensor.is_require_grad() {
                tensor.detach().require_grad()
            } else {
                tensor
            };
            burn::module::Param::from_mapped_value(id, tensor, mapper)
        }
    }
    model.clone().map(&mut Reroot)
}

/// Forward and backward over one shard of a micro-batch; the loss is multiplied by `scale` (the
/// shard's share of the batch over the accumulation steps) before the backward pass.
fn shard_pass(
    model: &crate::model::Qwen3,
    dm: &DecisionModel,
    states: &[State],
    weights: LossWeights,
    cfg: &RunConfig,
    scale: f32,
) -> Result<ShardOut> {
    let mb = micro_batch(dm, states, weights.teacher_blend)?;
    let lm_weight = cfg.loss.lm_weight;
    // The loss from the last decoder layer's output `[b, s, hidden]`, in f32.
    let head = |decoded: burn::tensor::Tensor<3>| {
        let [b, s, h] = decoded.dims();
        let (last, lm) = if lm_weight > 0.0 {
            let hidden = model.model.norm.forward(decoded);
            let last = hidden.clone().narrow(1, s - 1, 1).reshape([b, h]);
            (last, Some(lm_term(model, hidden, &mb.batch)))
        } else {
            let last = decoded.narrow(1, s - 1, 1).reshape([b, h]);
            (model.model.norm.forward(last), None)
        };
        let logits = crate::model::in_f32(model.token_logits(last, &mb.label_ids));
        let (absent, q, onehot) = mb.targets.tensors(&logits.device());
        let loss = batch_loss(logits, absent, q, onehot, weights.brier_weight);
        let loss = match lm {
            Some(lm) => loss + lm.mul_scalar(lm_weight),
            None => loss,
        };
        loss.mul_scalar(scale)
    };
    let (value, grads) = if cfg.train.recompute {
        crate::recompute::loss_and_grads(model, &mb.batch, head)
    } else {
        let loss = head(model.decode(&mb.batch));
        let value: f32 = loss.clone().into_scalar();
        let grads = if value.is_finite() {
            GradientsParams::from_grads(loss.backward(), model)
        } else {
            GradientsParams::new()
        };
        (value, grads)
    };
    Ok(ShardOut {
        grads,
        loss: value,
        tokens: mb.tokens,
    })
}

/// `[loss] lm_weight`'s term: next-token cross-entropy of every real prompt token.
fn lm_term(
    model: &crate::model::Qwen3,
    hidden: burn::tensor::Tensor<3>,
    batch: &Batch,
) -> burn::tensor::Tensor<1> {
    use burn::tensor::{Int, Tensor, TensorData};
    let [b, s, _] = hidden.dims();
    let device = hidden.device();
    let logits = crate::model::in_f32(model.logits(hidden.narrow(1, 0, s - 1)));
    let mut next = Vec::with_capacity(b * (s - 1));
    let mut mask = Vec::with_capacity(b * (s - 1));
    for (ids, am) in batch.input_ids.iter().zip(&batch.attention_mask) {
        for t in 0..s - 1 {
            next.push(ids[t + 1] as i64);
            mask.push(f32::from(am[t] != 0 && am[t + 1] != 0));
        }
    }
    let next = Tensor::<2, Int>::from_data(TensorData::new(next, [b, s - 1]), &device);
    let mask = Tensor::<2>::from_data(TensorData::new(mask, [b, s - 1]), &device);
    crate::loss::next_token_loss(logits, next, mask)
}

/// Drop the lines of `metrics.jsonl` past `step`: what a run killed after its last checkpoint
/// logged, and will log again from that checkpoint on (a resume must not repeat steps). A line
/// that does not parse (a torn last line) goes too.
fn truncate_metrics(path: &Path, step: u64) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if kept != text {
        decision_data::atomic::write_atomic(path, kept.as_bytes())?;
    }
    Ok(())
}

fn append_metrics(path: &Path, value: &serde_json::Value) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{value}").with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Count parameters: (trainable, total).
fn param_counts(model: &crate::model::Qwen3) -> (usize, usize) {
    struct V {
        trainable: usize,
        total: usize,
    }
    impl burn::module::ModuleVisitor for V {
        fn visit_float<const D: usize>(
            &mut self,
            p: &burn::module::Param<burn::tensor::Tensor<D>>,
        ) {
            let n = p.shape().num_elements();
            self.total += n;
            if p.is_require_grad() {
                self.trainable += n;
            }
        }
    }
    let mut v = V {
        trainable: 0,
        total: 0,
    };
    model.visit(&mut v);
    (v.trainable, v.total)
}

/// Train according to `cfg` into `run_dir`.
pub fn train(cfg: &RunConfig, run_dir: &Path, opts: &TrainOptions) -> Result<TrainSummary> {
    let started = Instant::now();
    let resume_from = if opts.resume {
        let saved = run_dir.join("run.toml");
        let text = std::fs::read_to_string(&saved)
            .with_context(|| format!("--resume: {} has no run to continue", run_dir.display()))?;
        let prev = RunConfig::parse(&text, &[]).with_context(|| saved.display().to_string())?;
        if prev != *cfg {
            bail!(
                "--resume: the config differs from the run's own {} (resume with the same config and --set overrides)",
                saved.display()
            );
        }
        checkpoint::latest(run_dir)?
    } else {
        if checkpoint::latest(run_dir)?.is_some() || run_dir.join("final").exists() {
            bail!(
                "{} already holds a run; pass --resume to continue it, or choose another --out",
                run_dir.display()
            );
        }
        None
    };
    // The memory plan, before anything is loaded or written.
    if let Some(dev) = crate::plan::device_limit(cfg.train.backend)? {
        let arch = crate::plan::architecture(cfg)?;
        crate::plan::plan(cfg, &arch).check(cfg, &arch, &dev)?;
    }
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let _lock = crate::run_lock::RunLock::acquire(run_dir)?;
    decision_data::atomic::write_atomic(run_dir.join("run.toml"), cfg.to_toml().as_bytes())?;

    let (train_states, valid_states) = load_run_states(cfg, run_dir)?;
    let plain = crate::backend::device(cfg.train.backend)?;
    let dm = initial_model(cfg, &train_states, &plain)?;
    if cfg.model.init == Init::Random {
        crate::tokenizer::save(dm.tokenizer(), &run_dir.join("tokenizer.json"))?;
    }
    let lspec = (cfg.train.mode == Mode::Lora).then(|| lora_spec(cfg));
    let base_ref = cfg.model.source.clone().unwrap_or_default();

    // Model and optimizer state: fresh, or from the checkpoint.
    let mut state = TrainerState::new(cfg.train.seed);
    let mut opt = AdamW::new(adamw_settings(cfg));
    let mut model = dm.model.clone();
    if let Some(spec) = &lspec {
        model = lora::attach(model, spec, cfg.train.seed);
    }
    if let Some((step, dir)) = &resume_from {
        state = checkpoint::read_state(dir)?;
        if state.step != *step {
            bail!(
                "{}: trainer state says step {}, folder says {step}",
                dir.display(),
                state.step
            );
        }
        model = match &lspec {
            Some(_) => lora::load_peft(dm.model.clone(), &dir.join("adapter"))?.0,
            None => {
                let files = crate::weights::weight_files(&dir.join("model"))?;
                crate::weights::load_model(
                    &dm.config,
                    &files,
                    &dir.display().to_string(),
                    &plain,
                    dm.dtype(),
                )?
            }
        };
        let (tensors, _) = checkpoint::read_tensors(&dir.join(checkpoint::OPTIMIZER_FILE))?;
        opt = AdamW::import(adamw_settings(cfg), state.step, tensors, &plain)?;
        eprintln!("resuming {} from step {step}", run_dir.display());
    }
    let mut model = model.train();
    if lspec.is_none() {
        model = model.set_require_grad(true);
    }
    let (trainable, total) = param_counts(&model);

    let total_steps = total_steps(cfg, train_states.len());
    let schedule = Schedule {
        peak: cfg.optim.lr,
        warmup: cfg.optim.warmup_steps,
        total: total_steps,
        min_ratio: cfg.optim.min_lr_ratio,
    };
    let weights = LossWeights {
        brier_weight: cfg.loss.brier_weight,
        teacher_blend: cfg.loss.teacher_blend,
    };
    let metrics_path = run_dir.join("metrics.jsonl");
    if resume_from.is_none() {
        decision_data::atomic::write_atomic(&metrics_path, b"")?;
    } else {
        truncate_metrics(&metrics_path, state.step)?;
    }
    let device = plain.clone().autodiff();
    let _ = &device;
    let bar = progress_bar(opts.progress, total_steps, state.step);
    let mut stream = Stream::new(
        &train_states,
        cfg.train.batch_size,
        cfg.train.seed,
        cfg.data.shuffle_options,
        state.epoch,
        state.position,
    );
    let loop_started = Instant::now();
    let tokens_at_start = state.tokens;
    let mut window_tokens = 0u64;
    let mut window_start = Instant::now();
    let save_checkpoint = |model: &crate::model::Qwen3,
                           opt: &AdamW,
                           state: &TrainerState|
     -> Result<()> {
        let c = PendingCheckpoint::begin(run_dir, state.step, cfg.train.keep_checkpoints)?;
        match &lspec {
            Some(spec) => lora::save_peft(model, spec, &base_ref, &c.path().join("adapter"))?,
            None => {
                let snapshot = DecisionModel::from_parts(
                    dm.config.clone(),
                    model.valid(),
                    dm.prompter.tokenizer.clone(),
                    Some(dm.spec.clone()),
                    "checkpoint",
                )?;
                snapshot.save(&c.path().join("model"))?;
            }
        }
        let mut meta = BTreeMap::new();
        meta.insert("step".to_string(), opt.step.to_string());
        checkpoint::write_tensors(
            &c.path().join(checkpoint::OPTIMIZER_FILE),
            &opt.export(),
            meta,
        )?;
        checkpoint::write_state(c.path(), state)?;
        decision_data::atomic::write_atomic(c.path().join("run.toml"), cfg.to_toml().as_bytes())?;
        c.commit()?;
        Ok(())
    };

    while state.step < total_steps {
        if opts.stop_after.is_some_and(|n| state.step >= n) {
            break;
        }
        let mut acc: GradientsAccumulator<crate::model::Qwen3> = GradientsAccumulator::new();
        let mut loss_sum = 0.0f32;
        for micro in 0..cfg.optim.grad_accum {
            let states: Vec<State> = (0..cfg.train.batch_size).map(|_| stream.next()).collect();
            model
                .device()
                .seed(mix_seed(cfg.train.seed, 0xd0 + state.step, micro as u64));
            // Shards of the micro-batch run side by side; each loss carries its share of the
            // batch so the summed gradients are those of the whole micro-batch.
            let n_shards = cfg.train.shards.min(states.len()).max(1);
            let per = states.len().div_ceil(n_shards);
            let pieces: Vec<&[State]> = states.chunks(per).collect();
            let run_shard = |piece: &[State]| {
                let share = piece.len() as f32 / states.len() as f32;
                let scale = share / cfg.optim.grad_accum as f32;
                if n_shards == 1 {
                    shard_pass(&model, &dm, piece, weights, cfg, scale)
                } else {
                    let own = fresh_leaves(&model);
                    shard_pass(&own, &dm, piece, weights, cfg, scale)
                }
            };
            // On Burn's rayon pool, so that the kernels' own parallel loops nest under the
            // shards instead of competing with them.
            let results: Vec<Result<ShardOut>> = if pieces.len() == 1 {
                vec![run_shard(pieces[0])]
            } else {
                use rayon::prelude::*;
                pieces.par_iter().map(|piece| run_shard(piece)).collect()
            };
            for r in results {
                let out = r?;
                if !out.loss.is_finite() {
                    bail!(
                        "the training loss became {} at step {}; lower [optim] lr or raise warmup",
                        out.loss,
                        state.step + 1
                    );
                }
                loss_sum += out.loss;
                acc.accumulate(&model, out.grads);
                state.tokens += out.tokens;
                window_tokens += out.tokens;
            }
        }
        let mut grads = acc.grads();
        let norm = global_grad_norm(&model, &grads);
        let lr = schedule.lr(state.step);
        model = opt.update(model, &mut grads, lr, clip_factor(norm, cfg.optim.clip));
        state.step += 1;
        state.epoch = stream.epoch;
        state.position = stream.position;
        state.losses.push(loss_sum);
        let elapsed = loop_started.elapsed().as_secs_f64();
        let tps = (state.tokens - tokens_at_start) as f64 / elapsed.max(1e-9);
        if let Some(b) = &bar {
            b.set_position(state.step);
            b.set_message(format!("loss {loss_sum:.4}  lr {lr:.2e}  {tps:.0} tok/s"));
        }
        if state.step.is_multiple_of(cfg.train.log_every.max(1)) || state.step == total_steps {
            let window = window_start.elapsed().as_secs_f64();
            let line = serde_json::json!({
                "kind": "train", "step": state.step, "epoch": state.epoch, "loss": loss_sum,
                "lr": lr, "grad_norm": norm, "tokens": state.tokens,
                "tokens_per_s": window_tokens as f64 / window.max(1e-9),
                "elapsed_s": started.elapsed().as_secs_f64(),
            });
            append_metrics(&metrics_path, &line)?;
            window_tokens = 0;
            window_start = Instant::now();
        }
        if cfg.train.eval_every > 0
            && state.step.is_multiple_of(cfg.train.eval_every)
            && state.step < total_steps
        {
            let eval_model = DecisionModel {
                model: model.valid(),
                ..clone_shell(&dm)
            };
            let n = match cfg.eval.max_states {
                0 => valid_states.len(),
                m => m.min(valid_states.len()),
            };
            let scored =
                crate::eval::score_states(&eval_model, &valid_states[..n], cfg.eval.batch_size)?;
            let r = Report::new(&scored, &|_| 1.0);
            let vloss = crate::eval::mean_loss(&scored, &valid_states[..n], weights);
            let line = serde_json::json!({
                "kind": "eval", "step": state.step, "split": "valid", "n": r.overall.n,
                "accuracy": r.overall.accuracy, "nll": r.overall.nll, "brier": r.overall.brier,
                "ece": r.overall.ece, "loss": vloss,
            });
            append_metrics(&metrics_path, &line)?;
            if let Some(b) = &bar {
                b.println(format!(
                    "step {}: valid accuracy {:.4}, loss {vloss:.4}",
                    state.step, r.overall.accuracy
                ));
            }
        }
        if cfg.train.checkpoint_every > 0 && state.step.is_multiple_of(cfg.train.checkpoint_every) {
            save_checkpoint(&model, &opt, &state)?;
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let steps_done_now = checkpoint::latest(run_dir)?.map(|c| c.0);
    if steps_done_now != Some(state.step) {
        save_checkpoint(&model, &opt, &state)?;
    }
    let loop_s = loop_started.elapsed().as_secs_f64();
    let tokens_per_s = (state.tokens - tokens_at_start) as f64 / loop_s.max(1e-9);
    let interrupted = state.step < total_steps;
    if interrupted {
        let empty = Report::new(&[], &|_| 1.0);
        return Ok(TrainSummary {
            schema: "decision-train-summary/1".into(),
            name: cfg.name.clone(),
            steps: state.step,
            tokens: state.tokens,
            tokens_per_s,
            wall_s: started.elapsed().as_secs_f64(),
            trainable_params: trainable,
            total_params: total,
            valid_before: empty.overall,
            valid_after: empty.overall,
            report_after: empty,
            flip_rate: None,
            temperatures: Temperatures::default(),
            final_train_loss: state.losses.last().copied(),
            interrupted: true,
        });
    }

    // Final evaluation, temperatures, final/ and plots.
    let final_model = match &lspec {
        Some(_) => lora::merge(model.valid()),
        None => model.valid(),
    };
    let mut fin = DecisionModel {
        model: final_model,
        ..clone_shell(&dm)
    };
    let scored = crate::eval::score_states(&fin, &valid_states, cfg.eval.batch_size)?;
    let temps = calibration::fit(&scored, cfg.eval.min_states_per_point);
    let before = Report::new(&scored, &|_| 1.0);
    let after = Report::new(&scored, &|s| temps.for_point(&s.point));
    let flip_rate = if cfg.eval.permutations > 0 {
        Some(crate::eval::flip_rate(
            &fin,
            &valid_states,
            cfg.eval.permutations,
            cfg.train.seed,
            cfg.eval.batch_size,
        )?)
    } else {
        None
    };
    let mut after_report = after.clone();
    after_report.flip_rate = flip_rate;
    temps.record_in(&mut fin.spec);
    for w in temps.warnings() {
        eprintln!("warning: {w}");
    }
    let mut points: Vec<String> = train_states.iter().map(|s| s.point.clone()).collect();
    points.sort();
    points.dedup();
    fin.spec.points = points;
    {
        let final_dir = run_dir.join("final");
        let tmp = run_dir.join(".final.tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        fin.save(&tmp)?;
        if let Some(spec) = &lspec {
            lora::save_peft(&model.valid(), spec, &base_ref, &tmp.join("adapter"))?;
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir)?;
        }
        std::fs::rename(&tmp, &final_dir)
            .with_context(|| format!("publishing {}", final_dir.display()))?;
        write_plots(run_dir, &metrics_path, &scored, &temps)?;
    }
    let summary = TrainSummary {
        schema: "decision-train-summary/1".into(),
        name: cfg.name.clone(),
        steps: state.step,
        tokens: state.tokens,
        tokens_per_s,
        wall_s: started.elapsed().as_secs_f64(),
        trainable_params: trainable,
        total_params: total,
        valid_before: before.overall,
        valid_after: after.overall,
        report_after: after_report,
        flip_rate,
        temperatures: temps,
        final_train_loss: state.losses.last().copied(),
        interrupted: false,
    };
    append_metrics(
        &metrics_path,
        &serde_json::json!({
            "kind": "final", "step": state.step,
            "accuracy": summary.valid_after.accuracy, "ece_before": summary.valid_before.ece,
            "ece_after": summary.valid_after.ece, "nll_after": summary.valid_after.nll,
            "flip_rate": flip_rate, "tokens_per_s": tokens_per_s,
        }),
    )?;
    {
        decision_data::atomic::write_json_atomic(run_dir.join("summary.json"), &summary)?;
    }
    Ok(summary)
}

/// A DecisionModel sharing `dm`'s config, spec and tokenizer, with a placeholder model to be
/// replaced by the caller (`DecisionModel { model, ..clone_shell(dm) }`).
fn clone_shell(dm: &DecisionModel) -> DecisionModel {
    DecisionModel {
        config: dm.config.clone(),
        model: dm.model.clone(),
        spec: dm.spec.clone(),
        prompter: dm.prompter.clone(),
        pad_id: dm.pad_id,
        device: dm.device.clone(),
        origin: dm.origin.clone(),
    }
}

fn progress_bar(show: bool, total: u64, at: u64) -> Option<indicatif::ProgressBar> {
    if !show {
        return None;
    }
    let b = indicatif::ProgressBar::new(total);
    b.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  ETA {eta}")
            .expect("valid template"),
    );
    b.set_position(at);
    Some(b)
}

/// `plots/loss.svg` and `plots/reliability.svg`.
fn write_plots(
    run_dir: &Path,
    metrics: &Path,
    scored: &[ScoredState],
    temps: &Temperatures,
) -> Result<()> {
    let text = std::fs::read_to_string(metrics)?;
    let (mut train, mut valid) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let step = v["step"].as_f64().unwrap_or(0.0);
        match v["kind"].as_str() {
            Some("train") => train.push((step, v["loss"].as_f64().unwrap_or(f64::NAN))),
            Some("eval") => valid.push((step, v["loss"].as_f64().unwrap_or(f64::NAN))),
            _ => {}
        }
    }
    let loss = crate::plots::line_chart(
        "loss (cross-entropy + Brier)",
        "step",
        "loss",
        &[
            crate::plots::Series {
                name: "train",
                color: "#1f77b4",
                points: train,
            },
            crate::plots::Series {
                name: "valid",
                color: "#ff7f0e",
                points: valid,
            },
        ],
    );
    let bins = |t: &dyn Fn(&ScoredState) -> f32| -> Vec<Bin> {
        let pairs: Vec<(f64, bool)> = scored
            .iter()
            .map(|s| {
                let p = s.probs(t(s));
                let pick = crate::metrics::argmax(&p);
                (p[pick], pick == s.answer)
            })
            .collect();
        crate::metrics::reliability(&pairs, crate::metrics::ECE_BINS)
    };
    let before = bins(&|_| 1.0);
    let after = bins(&|s| temps.for_point(&s.point));
    let ece = |b: &[Bin]| {
        let n: usize = b.iter().map(|x| x.n).sum();
        b.iter()
            .map(|x| x.n as f64 / n.max(1) as f64 * (x.accuracy - x.confidence).abs())
            .sum::<f64>()
    };
    let rel = crate::plots::reliability_diagram(
        "reliability (validation)",
        &before,
        &after,
        ece(&before),
        ece(&after),
    );
    let dir = run_dir.join("plots");
    decision_data::atomic::write_atomic(dir.join("loss.svg"), loss.as_bytes())?;
    decision_data::atomic::write_atomic(dir.join("reliability.svg"), rel.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_seeded_permutations() {
        let a = epoch_order(7, 0, 50);
        assert_eq!(a, epoch_order(7, 0, 50));
        assert_ne!(a, epoch_order(7, 1, 50));
        assert_ne!(a, epoch_order(8, 0, 50));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_eq!(candidate_order(1, 0, 3, 4, false), vec![0, 1, 2, 3]);
        let shuffled: Vec<Vec<usize>> =
            (0..20).map(|i| candidate_order(1, 0, i, 4, true)).collect();
        assert!(shuffled.iter().any(|o| o != &vec![0, 1, 2, 3]));
    }

    #[test]
    fn bucketing_keeps_a_permutation_and_groups_lengths() {
        let lengths: Vec<usize> = (0..200).map(|i| (i * 37) % 101).collect();
        let o = bucketed_order(3, 0, &lengths, 8);
        let mut sorted = o.clone();
        sorted.sort();
        assert_eq!(sorted, (0..200).collect::<Vec<_>>());
        assert_eq!(o, bucketed_order(3, 0, &lengths, 8));
        let spread = |order: &[usize]| -> usize {
            order
                .chunks(8)
                .map(|b| {
                    let l: Vec<usize> = b.iter().map(|&i| lengths[i]).collect();
                    l.iter().max().unwrap() - l.iter().min().unwrap()
                })
                .sum()
        };
        assert!(
            spread(&o) * 3 < spread(&epoch_order(3, 0, 200)),
            "bucketing does not group lengths"
        );
    }

    #[test]
    fn the_answer_moves_with_its_candidate() {
        let s = State {
            id: "s".into(),
            task_id: "t".into(),
            point: "tool".into(),
            context: "c".into(),
            candidates: ["a", "b", "c"]
                .iter()
                .map(|x| decision_data::Candidate {
                    id: x.to_string(),
                    label: format!("label {x}"),
                })
                .collect(),
            answer: Some("b".into()),
            teacher: Some(vec![0.2, 0.7, 0.1]),
            after_error: false,
            rules: None,
            split: None,
        };
        let p = permuted(&s, &[2, 0, 1]);
        assert_eq!(
            p.candidates
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>(),
            ["c", "a", "b"]
        );
        assert_eq!(p.answer_index(), Some(2));
        assert_eq!(p.teacher, Some(vec![0.1, 0.2, 0.7]));
    }
}
