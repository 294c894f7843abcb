//! `decision train`: supervised fine-tuning on recorded decision states.
//!
//! # The run folder
//!
//! ```text
//! RUN_DIR/
//!   run.toml              the resolved run config (file + --set overrides + defaults)
//!   metrics.jsonl         one JSON object per line: {"kind":"train", step, epoch, loss, lr,
//!                         grad_norm, tokens, tokens_per_s, elapsed_s, dtype (the base's, as the
//!                         device ran it)} every `log_every` steps,
//!                         {"kind":"eval", step, split:"valid", n, accuracy, nll, brier, ece, loss}
//!                         every `eval_every` steps, and one {"kind":"final", ...} line
//!   quarantine.jsonl      only with [data] skip_bad: the rejected rows, untouched
//!                         (+ quarantine.errors.jsonl saying what is wrong with each)
//!   tokenizer.json        for init = "random": the word-level tokenizer built from the data
//!   checkpoints/step-NNNNNNN/   see [`crate::checkpoint`] (atomic, COMPLETE manifest with each
//!                         file's SHA-256, newest kept)
//!   final/                a model folder `DecisionModel::load` reads: config.json,
//!                         model.safetensors (in the run's dtype, the adapters of a LoRA run
//!                         merged into the base), tokenizer.json, decision.json (prompt,
//!                         labels, max_options, max_tokens, the fitted temperature per decision
//!                         point and the global one), and for LoRA runs adapter/ (PEFT
//!                         layout: adapter_config.json with base_model_name_or_path = the
//!                         base, adapter_model.safetensors)
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
//! which the checkpoint stores; `--resume` continues from the newest intact checkpoint exactly
//! as if the run had not stopped (same backend).
//!
//! # The loop
//!
//! [`train`] checks the run folder, then a `Trainer` runs the loop nanoGPT's reads like:
//! `set_up` (or resume from a checkpoint), then per step `step` and `log_step`, now and then
//! `evaluate` and `checkpoint`, and at the end `finish` (the last checkpoint; for a finished run
//! the final evaluation, temperatures, `final/`, plots and `summary.json`). The data order is
//! [`crate::data_order`]; one micro-batch's forward and backward passes are `micro_batch.rs`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::optim::GradientsAccumulator;
use burn::tensor::Device;
use decision_data::State;
use serde::{Deserialize, Serialize};

use crate::calibration::{self, Temperatures};
use crate::checkpoint::{self, PendingCheckpoint, TrainerState};
use crate::data_order::{Stream, load_run_states, mix_seed};
use crate::loss::LossWeights;
use crate::metrics::Report;
use crate::micro_batch::PassPlan;
use crate::model::decision_model::{DecisionModel, LoadOptions};
use crate::model::f16_safety::F16Overflow;
use crate::model::lora::{self, LoraSpec};
use crate::model::peft::PeftAdapter;
use crate::model::qwen3::Qwen3;
use crate::optim::{AdamW, AdamWSettings, Gradients, Schedule, clip_factor};
use crate::plan::gib;
use crate::run_config::{Init, Mode, RunConfig};
use decision_prompt::spec::{DecisionSpec, PromptTemplate};

/// How a run reports its progress on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Progress {
    /// Nothing but warnings (a library caller, a test).
    #[default]
    Quiet,
    /// A progress bar, for a terminal.
    Bar,
    /// A line when the model is set up, and one per logged step and evaluation: for a log file,
    /// a batch job or CI, where a bar would draw nothing.
    Lines,
}

/// How to run [`train`].
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    pub resume: bool,
    pub progress: Progress,
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
    /// On a GPU: the most device memory the runtime held after a step or an evaluation (its
    /// pools' reserved pages) in this process's part of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_peak_bytes: Option<u64>,
}

/// Train according to `cfg` into `run_dir`.
pub fn train(given: &RunConfig, run_dir: &Path, opts: &TrainOptions) -> Result<TrainSummary> {
    let started = Instant::now();
    check_run_folder(given, run_dir, opts.resume)?;
    // The dtype the device runs (`auto` resolved), then the memory plan for it, before anything
    // is loaded or written. The run folder's run.toml keeps the config as given; the trainer and
    // the checkpoints work with the resolved one.
    let device = crate::model::backend::device(given.train.backend)?;
    let cfg = &crate::plan::resolve_dtype(given, &device)?;
    if cfg.train.dtype != given.train.dtype {
        eprintln!(
            "[train] dtype = \"{}\": the base computes in {} on this device",
            given.train.dtype, cfg.train.dtype
        );
    }
    if let Some(limit) = crate::model::backend::largest_buffer(&device) {
        let arch = crate::plan::architecture(cfg)?;
        crate::plan::plan(cfg, &arch).check_buffers(
            cfg,
            limit,
            &adapter_name(),
            &crate::model::backend::supported_precisions(&device),
        )?;
    }
    // What the plan fitted to the device changes: whether the replay keeps the attention, and
    // how many evaluation batches run side by side on the CPU: those the plan counts, for the
    // periodic evaluations and the final one (which scores every validation state, so would
    // otherwise run one batch per thread where `max_states` planned fewer), flip rate included
    // (`None`: no plan; as many as the free memory holds).
    let (keep_attention, eval_side_by_side) =
        match crate::plan::device_limit(cfg.train.backend, &device)? {
            Some(dev) => {
                let arch = crate::plan::architecture(cfg)?;
                let plan = crate::plan::plan(cfg, &arch).fitted(&dev);
                plan.check(cfg, &arch, &dev)?;
                if !plan.keep_attention {
                    eprintln!(
                        "[train] recompute: the replay computes each layer's attention again; \
                         keeping it from the first pass ({}) would not fit {} ({})",
                        gib(plan.attention_kept),
                        dev.what,
                        gib(dev.bytes)
                    );
                }
                if plan.eval_alive < plan.eval_threads {
                    eprintln!(
                        "[eval] {} batches of {} rows side by side, not {}: more would not fit \
                         {} ({})",
                        plan.eval_alive,
                        plan.eval_rows,
                        plan.eval_threads,
                        dev.what,
                        gib(dev.bytes)
                    );
                }
                (plan.keep_attention, Some(plan.eval_alive))
            }
            None => (true, None),
        };
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let _lock = crate::run_lock::RunLock::acquire(run_dir)?;
    let resume_from = if opts.resume {
        checkpoint::newest_verified(run_dir, &mut |w| eprintln!("warning: {w}"))?
    } else {
        None
    };
    decision_data::atomic::write_atomic(run_dir.join("run.toml"), given.to_toml().as_bytes())?;
    let (train_states, valid_states) = load_run_states(cfg, run_dir)?;

    let run = || {
        let mut t = Trainer::set_up(
            cfg,
            run_dir,
            &train_states,
            &valid_states,
            resume_from,
            opts.progress,
            started,
        )?;
        t.keep_attention = keep_attention;
        t.eval_side_by_side = eval_side_by_side;
        t.announce();
        while t.state.step < t.total_steps && opts.stop_after.is_none_or(|n| t.state.step < n) {
            let step = t.step()?;
            t.log_step(&step)?;
            if t.eval_due() {
                t.evaluate()?;
            }
            if t.checkpoint_due() {
                t.checkpoint()?;
            }
        }
        t.finish()
    };
    if cfg.train.backend == crate::Backend::Cpu {
        return run();
    }
    // Burn's GPU runtime reports a failed allocation, a lost device or a kernel it cannot run
    // by panicking: such a run ends with an error that says which, what the plan needed and
    // what to change. Nothing of the failed step is saved; the last checkpoint stands. A panic
    // on one of the runtime's own threads ends the process (`gpu_watch`) with the same error,
    // and the folder's lock released, where the run would otherwise wait for ever.
    let _explaining = {
        let (cfg, device, run_dir) = (cfg.clone(), device.clone(), run_dir.to_path_buf());
        crate::model::gpu_watch::explain_with(move |message| {
            let _ = std::fs::remove_file(run_dir.join(crate::run_lock::FILE));
            let failure = crate::model::backend::GpuFailure::of(message);
            format!(
                "{:#}",
                gpu_failure(&cfg, &device, &run_dir, failure, message)
            )
        })
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(result) => result,
        Err(panic) => {
            let message = crate::model::backend::panic_text(&panic);
            match crate::model::backend::GpuFailure::of(&message) {
                Some(failure) => Err(gpu_failure(cfg, &device, run_dir, Some(failure), &message)),
                None => std::panic::resume_unwind(panic),
            }
        }
    }
}

/// The error of a GPU run that failed with `failure` (`None`: a failure the runtime's message
/// does not name): what happened on which adapter, the plan's figure against the device's
/// memory, the settings to change, and the checkpoint to resume.
pub(crate) fn gpu_failure(
    cfg: &RunConfig,
    device: &Device,
    run_dir: &Path,
    failure: Option<crate::model::backend::GpuFailure>,
    message: &str,
) -> anyhow::Error {
    use crate::model::backend::GpuFailure;
    let on = crate::model::backend::wgpu_adapter()
        .map_or_else(String::new, |a| format!(" ({})", a.short()));
    let arch = crate::plan::architecture(cfg).ok();
    let planned = arch.as_ref().map_or_else(
        || "an unknown amount".into(),
        |arch| gib(crate::plan::plan(cfg, arch).total),
    );
    let memory = match crate::plan::device_limit(cfg.train.backend, device) {
        Ok(Some(dev)) => format!("the device has {} ({})", gib(dev.bytes), dev.what),
        _ => "the device does not report its memory (set DECISION_DEVICE_MEMORY=GiB to have the \
              plan enforced)"
            .into(),
    };
    let software = crate::model::backend::wgpu_adapter().is_some_and(|a| a.is_software());
    let what = match failure {
        Some(GpuFailure::OutOfMemory) => {
            // What a resumed run may change (`RESUMABLE`), then what needs a new run.
            let mut resumable = Vec::new();
            if !cfg.train.recompute {
                resumable.push("--set train.recompute=true".to_string());
            }
            let smaller = arch
                .as_ref()
                .and_then(|arch| crate::plan::smaller_replay_pieces(cfg, arch));
            if let Some((mib, total)) = smaller {
                resumable.push(format!(
                    "--set train.replay_piece_mib={mib} (now {}: the replay's second half in \
                     smaller pieces, about {} planned, more launches)",
                    cfg.train.replay_piece_mib,
                    gib(total)
                ));
            }
            let new_run = format!(
                "lower --set train.batch_size (now {}, raising optim.grad_accum keeps the \
                 effective batch) or --set data.max_tokens (now {})",
                cfg.train.batch_size, cfg.data.max_tokens
            );
            let fixes = if resumable.is_empty() {
                format!("{new_run}, in a new run (another --out: a resumed run keeps them)")
            } else {
                format!(
                    "{} with --resume, or {new_run} in a new run (another --out: a resumed run \
                     keeps them)",
                    resumable.join(", or ")
                )
            };
            format!(
                "the GPU{on} ran out of memory: the plan needs about {planned} and {memory}; \
                 {fixes}"
            )
        }
        Some(GpuFailure::DeviceLost) => format!(
            "the GPU{on} was lost (a driver reset, a hang or a fault) while the run needed about \
             {planned} and {memory}; check the driver's log; a smaller --set train.batch_size or \
             data.max_tokens shortens each kernel{}",
            if software {
                "; this adapter is a software rasteriser, and --backend cpu runs the same model \
                 far faster"
            } else {
                ""
            }
        ),
        Some(GpuFailure::Kernel) => format!(
            "the GPU{on} could not compile or run one of the training kernels in {}; try --set \
             train.dtype=f32, or --backend cpu",
            cfg.train.dtype
        ),
        None => format!(
            "a thread of the GPU{on}'s runtime failed, so the run cannot go on; it needed about \
             {planned} and {memory}"
        ),
    };
    let resume = match checkpoint::latest(run_dir) {
        Ok(Some((step, _))) => {
            format!("the run resumes from its checkpoint of step {step} with --resume")
        }
        _ => "no checkpoint was written yet; start the run again".to_string(),
    };
    anyhow::anyhow!("{what}; {resume}. The runtime said: {}", message.trim())
}

/// The GPU adapter as messages name it: `SPIR-V on "NVIDIA H200"`.
pub(crate) fn adapter_name() -> String {
    crate::model::backend::wgpu_adapter().map_or_else(|| "the GPU".into(), |a| a.short())
}

/// Refuse what `--resume` (or its absence) cannot do with `run_dir`: resume a folder without a
/// run or with another config; start a new run over an existing one.
fn check_run_folder(cfg: &RunConfig, run_dir: &Path, resume: bool) -> Result<()> {
    if resume {
        let saved = run_dir.join("run.toml");
        let text = std::fs::read_to_string(&saved)
            .with_context(|| format!("--resume: {} has no run to continue", run_dir.display()))?;
        let prev = RunConfig::parse(&text, &[]).with_context(|| saved.display().to_string())?;
        let changed = prev.differences(cfg);
        let show = |d: &[&(String, String, String)]| {
            d.iter()
                .map(|(key, was, now)| format!("{key} {was} -> {now}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (free, fixed): (Vec<_>, Vec<_>) = changed
            .iter()
            .partition(|(key, _, _)| crate::run_config::RESUMABLE.contains(&key.as_str()));
        if !fixed.is_empty() {
            bail!(
                "--resume: the config differs from the run's own {}: {}. A resumed run keeps what \
                 it trains and its data's order; it may change only {}. Resume with the run's \
                 values, or start a new run with another --out",
                saved.display(),
                show(&fixed),
                crate::run_config::RESUMABLE.join(", ")
            );
        }
        if !free.is_empty() {
            eprintln!(
                "--resume: {} (how a step runs, not what it trains)",
                show(&free)
            );
        }
    } else if checkpoint::latest(run_dir)?.is_some() || run_dir.join("final").exists() {
        bail!(
            "{} already holds a run; pass --resume to continue it, or choose another --out",
            run_dir.display()
        );
    }
    Ok(())
}

/// A run in progress: the model and optimizer, where the data stream stands, and what the loop
/// logs and saves.
struct Trainer<'a> {
    cfg: &'a RunConfig,
    run_dir: &'a Path,
    /// The starting model with its config, tokenizer and spec (a LoRA run's base).
    dm: DecisionModel,
    lspec: Option<LoraSpec>,
    /// The model being trained (autodiff, train mode).
    model: Qwen3,
    opt: AdamW,
    state: TrainerState,
    stream: Stream<'a>,
    valid: &'a [State],
    schedule: Schedule,
    weights: LossWeights,
    /// Whether the base computes in f16, whose products are checked for overflow.
    f16_base: bool,
    /// With recompute, whether the replay reuses the first pass's attention (the memory plan's
    /// choice for the device).
    keep_attention: bool,
    /// On the CPU, how many evaluation batches are scored side by side (the memory plan's
    /// count); `None`: no plan, as many as the free memory holds.
    eval_side_by_side: Option<usize>,
    total_steps: u64,
    /// Parameters: (trainable, total).
    params: (usize, usize),
    /// The step of the newest checkpoint this run wrote or resumed from.
    saved_at: Option<u64>,
    metrics_path: PathBuf,
    bar: Option<indicatif::ProgressBar>,
    /// Report in lines (`Progress::Lines`) where there is no bar.
    lines: bool,
    clock: Clock,
    /// On a GPU, the most device memory the runtime has held after a step or an evaluation.
    gpu_peak: Option<u64>,
}

/// Throughput bookkeeping: the run's start (for `elapsed_s`), the loop's start and tokens then
/// (for the run's tokens/s), and the window since the last logged step.
struct Clock {
    started: Instant,
    loop_started: Instant,
    tokens_at_start: u64,
    window_start: Instant,
    window_tokens: u64,
}

/// What one optimizer step reports.
struct StepStats {
    loss: f32,
    lr: f64,
    grad_norm: f64,
}

/// The run's end on the validation split: metrics at T = 1 and at the fitted temperatures.
struct FinalEval {
    before: Report,
    /// At the fitted temperatures, with the flip rate.
    after: Report,
    flip_rate: Option<f64>,
    temps: Temperatures,
}

impl<'a> Trainer<'a> {
    /// The starting model (fresh, or the checkpoint `resume_from`'s weights, optimizer moments
    /// and data position), the schedule, the data stream and `metrics.jsonl` (emptied for a new
    /// run; for a resumed one, cut back to the checkpoint's step).
    fn set_up(
        cfg: &'a RunConfig,
        run_dir: &'a Path,
        train: &'a [State],
        valid: &'a [State],
        resume_from: Option<(u64, PathBuf)>,
        progress: Progress,
        started: Instant,
    ) -> Result<Self> {
        let plain = crate::model::backend::device(cfg.train.backend)?;
        let dm = initial_model(cfg, train, &plain)?;
        if cfg.model.init == Init::Random {
            decision_prompt::tokenizer::save(dm.tokenizer(), &run_dir.join("tokenizer.json"))?;
        }
        let lspec = match cfg.train.mode {
            Mode::Lora => Some(lora_spec(cfg, &dm)?),
            Mode::Full => None,
        };
        let (mut state, mut model, opt) = match &resume_from {
            Some((step, dir)) => {
                let resumed = load_checkpoint(cfg, &dm, lspec.is_some(), &plain, *step, dir)?;
                eprintln!("resuming {} from step {step}", run_dir.display());
                resumed
            }
            None => {
                let model = match &lspec {
                    Some(spec) => lora::attach(dm.model.clone(), spec, cfg.train.seed),
                    None => dm.model.clone(),
                };
                let opt = AdamW::new(adamw_settings(cfg));
                (TrainerState::new(cfg.train.seed), model, opt)
            }
        };
        // Precision: what the base computes in, the loss scale, and the projections an earlier
        // part of the run moved to f32.
        if let Some(was) = state.dtype.filter(|&d| d != cfg.train.dtype) {
            eprintln!(
                "warning: the run trained with a {was} base until step {}; it continues in {} \
                 on this device",
                state.step, cfg.train.dtype
            );
        }
        state.dtype = Some(cfg.train.dtype);
        let base_dtype = cfg.train.dtype.dtype().expect("resolved");
        if cfg.train.loss_scale.applies(base_dtype) {
            state.loss_scale.get_or_insert_with(Default::default);
        } else {
            state.loss_scale = None;
        }
        crate::model::f16_safety::promote(&mut model, &state.f32_projections)?;
        let f16_base = lspec.is_some() && base_dtype == burn::tensor::DType::F16;
        let mut model = model.train();
        if lspec.is_none() {
            model = model.set_require_grad(true);
        }
        let params = param_counts(&model);

        let total_steps = total_steps(cfg, train.len());
        let metrics_path = run_dir.join("metrics.jsonl");
        if resume_from.is_none() {
            decision_data::atomic::write_atomic(&metrics_path, b"")?;
        } else {
            truncate_metrics(&metrics_path, state.step)?;
        }
        let stream = Stream::new(
            train,
            cfg.train.batch_size,
            cfg.train.seed,
            cfg.data.shuffle_options,
            state.epoch,
            state.position,
        );
        Ok(Self {
            cfg,
            run_dir,
            dm,
            lspec,
            model,
            opt,
            stream,
            valid,
            schedule: Schedule {
                peak: cfg.optim.lr,
                warmup: cfg.optim.warmup_steps,
                total: total_steps,
                min_ratio: cfg.optim.min_lr_ratio,
            },
            weights: LossWeights::new(&cfg.loss),
            f16_base,
            keep_attention: true,
            eval_side_by_side: None,
            total_steps,
            params,
            saved_at: resume_from.map(|(step, _)| step),
            metrics_path,
            bar: progress_bar(progress == Progress::Bar, total_steps, state.step),
            lines: progress == Progress::Lines,
            gpu_peak: None,
            clock: Clock {
                started,
                loop_started: Instant::now(),
                tokens_at_start: state.tokens,
                window_start: Instant::now(),
                window_tokens: 0,
            },
            state,
        })
    }

    /// One optimizer step: `grad_accum` micro-batches of `batch_size` states from the stream,
    /// their gradients summed, clipped by global norm and applied by AdamW at the step's rate.
    fn step(&mut self) -> Result<StepStats> {
        let cfg = self.cfg;
        let mut acc: GradientsAccumulator<Qwen3> = GradientsAccumulator::new();
        let mut loss = 0.0f32;
        let scale = self.state.loss_scale.map_or(1.0, |s| s.scale);
        let plan = PassPlan {
            loss_scale: scale,
            check_products: self.f16_base,
            keep_attention: self.keep_attention,
            ..PassPlan::new(cfg, self.weights)
        };
        for micro in 0..cfg.optim.grad_accum {
            let states: Vec<State> = (0..cfg.train.batch_size)
                .map(|_| self.stream.next_state())
                .collect();
            // A micro-batch whose f16 products overflowed runs again once they compute in f32.
            let shards = loop {
                self.model.device().seed(mix_seed(
                    cfg.train.seed,
                    0xd0 + self.state.step,
                    micro as u64,
                ));
                let shards = crate::micro_batch::passes(&self.model, &self.dm, &states, plan)
                    .into_iter()
                    .collect::<Result<Vec<_>>>()?;
                let mut overflowed: Vec<String> = Vec::new();
                for name in shards.iter().flat_map(|s| &s.overflowed) {
                    if !overflowed.contains(name) {
                        overflowed.push(name.clone());
                    }
                }
                if overflowed.is_empty() {
                    break shards;
                }
                self.compute_in_f32(overflowed)?;
            };
            for out in shards {
                if !out.loss.is_finite() {
                    bail!(
                        "the training loss became {} at step {}; lower [optim] lr or raise warmup",
                        out.loss,
                        self.state.step + 1
                    );
                }
                loss += out.loss;
                acc.accumulate(&self.model, out.grads);
                self.state.tokens += out.tokens;
                self.clock.window_tokens += out.tokens;
            }
        }
        let grads = Gradients::take(&self.model, &mut acc.grads());
        // The gradients carry the loss scale: their norm (one read from the device) says whether
        // they are finite, and divided by the scale it is the true norm.
        let scaled_norm = grads.norm();
        let grad_norm = scaled_norm / scale as f64;
        let lr = self.schedule.lr(self.state.step);
        let apply = match &mut self.state.loss_scale {
            Some(scaler) => scaler.update(scaled_norm.is_finite()),
            None if !scaled_norm.is_finite() => bail!(
                "the gradients became {scaled_norm} at step {}; lower [optim] lr or raise \
                 warmup{}",
                self.state.step + 1,
                if self.f16_base {
                    ", or set `--set train.loss_scale=dynamic`"
                } else {
                    ""
                }
            ),
            None => true,
        };
        if apply {
            // AdamW takes the model by value; the base model stands in meanwhile (it is held
            // for the whole run anyway, so this keeps nothing extra alive).
            let model = std::mem::replace(&mut self.model, self.dm.model.clone());
            self.model = self.opt.update(
                model,
                grads,
                lr,
                clip_factor(grad_norm, cfg.optim.clip) / scale as f64,
            );
        } else {
            let scaler = self
                .state
                .loss_scale
                .expect("a skipped step scales its loss");
            append_metrics(
                &self.metrics_path,
                &serde_json::json!({
                    "kind": "skip", "step": self.state.step + 1,
                    "reason": "gradients not finite under the loss scale",
                    "loss_scale": scaler.scale,
                }),
            )?;
        }
        self.state.step += 1;
        (self.state.epoch, self.state.position) = self.stream.position();
        self.state.losses.push(loss);
        Ok(StepStats {
            loss,
            lr,
            grad_norm,
        })
    }

    /// The f16 products `names` overflowed in the step now running: by `[train] f16_overflow`,
    /// compute those projections in f32 from now on (noted on stderr, in `metrics.jsonl` and in
    /// every checkpoint), or stop.
    fn compute_in_f32(&mut self, names: Vec<String>) -> Result<()> {
        let step = self.state.step + 1;
        if self.cfg.train.f16_overflow == F16Overflow::Stop {
            return Err(crate::model::f16_safety::overflow_error(&names, step));
        }
        crate::model::f16_safety::promote(&mut self.model, &names)?;
        let line = format!(
            "warning: step {step}: the f16 product of {} overflowed (beyond 65 504); computing it \
             in f32 from now on (its weight takes twice the memory)",
            names.join(", ")
        );
        self.warn(line);
        append_metrics(
            &self.metrics_path,
            &serde_json::json!({"kind": "precision", "step": step, "f32_projections": names}),
        )?;
        self.state.f32_projections.extend(names);
        Ok(())
    }

    /// A warning: above the bar, or on its own line.
    fn warn(&self, line: String) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// A line of progress: above the bar, on its own line in `Progress::Lines`, else nothing.
    fn say(&self, line: String) {
        match &self.bar {
            Some(b) => b.println(line),
            None if self.lines => eprintln!("{line}"),
            None => {}
        }
    }

    /// Once set up: what was loaded, in how long, and what the loop will do.
    fn announce(&self) {
        let (trained, total) = self.params;
        let what = match &self.lspec {
            Some(_) => format!(
                "LoRA r{} on {}",
                self.cfg.lora.rank,
                self.cfg.lora.targets.join(", ")
            ),
            None => "every weight".into(),
        };
        let steps = match self.state.step {
            0 => format!("{} steps", self.total_steps),
            done => format!(
                "resumed after step {done}, steps {} to {}",
                done + 1,
                self.total_steps
            ),
        };
        let mut line = format!(
            "set up in {:.1} s: {total} parameters, {} base, {trained} trained ({what}); {steps} \
             of {} x up to {} tokens",
            self.clock.started.elapsed().as_secs_f64(),
            self.cfg.train.dtype,
            self.cfg.train.batch_size,
            self.cfg.data.max_tokens,
        );
        if self.cfg.train.backend != crate::Backend::Cpu {
            line.push_str(
                "; the first step also compiles the GPU's kernels, once per run, and takes longer",
            );
        }
        self.say(line);
    }

    /// The progress bar (or, every `log_every` steps and the last, a line), and a `train` line
    /// in `metrics.jsonl` at the same steps.
    fn log_step(&mut self, s: &StepStats) -> Result<()> {
        let step = self.state.step;
        let gpu = self.sample_gpu_memory();
        if let Some(b) = &self.bar {
            let tps = (self.state.tokens - self.clock.tokens_at_start) as f64
                / self.clock.loop_started.elapsed().as_secs_f64().max(1e-9);
            b.set_position(step);
            b.set_message(format!(
                "loss {:.4}  lr {:.2e}  {tps:.0} tok/s",
                s.loss, s.lr
            ));
        }
        if step.is_multiple_of(self.cfg.train.log_every.max(1)) || step == self.total_steps {
            let window = self.clock.window_start.elapsed().as_secs_f64();
            let mut line = serde_json::json!({
                "kind": "train", "step": step, "epoch": self.state.epoch, "loss": s.loss,
                "lr": s.lr, "grad_norm": s.grad_norm, "tokens": self.state.tokens,
                "tokens_per_s": self.clock.window_tokens as f64 / window.max(1e-9),
                "elapsed_s": self.clock.started.elapsed().as_secs_f64(),
                "dtype": self.cfg.train.dtype.to_string(),
            });
            if let Some(scaler) = self.state.loss_scale {
                line["loss_scale"] = scaler.scale.into();
            }
            if let Some(m) = &gpu {
                line["gpu_reserved_bytes"] = m.reserved.into();
                line["gpu_in_use_bytes"] = m.in_use.into();
            }
            append_metrics(&self.metrics_path, &line)?;
            if self.bar.is_none() {
                let mut said = format!(
                    "step {step}/{}  loss {:.4}  lr {:.2e}  {:.0} tokens/s  {:.1} s",
                    self.total_steps,
                    s.loss,
                    s.lr,
                    line["tokens_per_s"].as_f64().unwrap_or(0.0),
                    line["elapsed_s"].as_f64().unwrap_or(0.0),
                );
                if let Some(scaler) = self.state.loss_scale {
                    said.push_str(&format!("  loss scale {}", scaler.scale));
                }
                if let Some(m) = &gpu {
                    said.push_str(&format!("  GPU {} held", gib(m.reserved)));
                }
                self.say(said);
            }
            self.clock.window_tokens = 0;
            self.clock.window_start = Instant::now();
        }
        Ok(())
    }

    /// What the GPU runtime holds now (`None` on the CPU), kept in the run's peak.
    fn sample_gpu_memory(&mut self) -> Option<crate::model::backend::GpuMemory> {
        let m = crate::model::backend::gpu_memory(&self.model.device().inner())?;
        self.gpu_peak = Some(self.gpu_peak.unwrap_or(0).max(m.reserved));
        Some(m)
    }

    /// Every `eval_every` steps, except at the end (the final evaluation covers that).
    fn eval_due(&self) -> bool {
        let every = self.cfg.train.eval_every;
        every > 0 && self.state.step.is_multiple_of(every) && self.state.step < self.total_steps
    }

    /// Score the validation states (the first `[eval] max_states`) at T = 1: an `eval` line in
    /// `metrics.jsonl`.
    fn evaluate(&mut self) -> Result<()> {
        // The step's freed buffers go back before the evaluation's differently sized ones, and
        // the evaluation's before the next step (see `release_freed`).
        crate::model::host_memory::release_freed();
        let eval_model = DecisionModel {
            model: self.model.valid(),
            ..clone_shell(&self.dm)
        };
        let n = match self.cfg.eval.max_states {
            0 => self.valid.len(),
            m => m.min(self.valid.len()),
        };
        let states = &self.valid[..n];
        let scored = crate::eval::score_states(
            &eval_model,
            states,
            self.cfg.eval.batch_size,
            self.eval_side_by_side,
        )?;
        let r = Report::new(&scored, &|_| 1.0);
        let vloss = crate::eval::mean_loss(&scored, states, self.weights);
        self.sample_gpu_memory();
        drop(eval_model);
        crate::model::host_memory::release_freed();
        let line = serde_json::json!({
            "kind": "eval", "step": self.state.step, "split": "valid", "n": r.overall.n,
            "accuracy": r.overall.accuracy, "nll": r.overall.nll, "brier": r.overall.brier,
            "ece": r.overall.ece, "loss": vloss,
        });
        append_metrics(&self.metrics_path, &line)?;
        self.say(format!(
            "step {}: valid accuracy {:.4}, loss {vloss:.4}",
            self.state.step, r.overall.accuracy
        ));
        Ok(())
    }

    /// Every `checkpoint_every` steps.
    fn checkpoint_due(&self) -> bool {
        let every = self.cfg.train.checkpoint_every;
        every > 0 && self.state.step.is_multiple_of(every)
    }

    /// Save the weights (full) or adapters (LoRA), the optimizer moments, the trainer state and
    /// the config as checkpoint `step-N` (see [`crate::checkpoint`]).
    fn checkpoint(&mut self) -> Result<()> {
        let cfg = self.cfg;
        let c =
            PendingCheckpoint::begin(self.run_dir, self.state.step, cfg.train.keep_checkpoints)?;
        match &self.lspec {
            Some(spec) => {
                lora::save_peft(&self.model, spec, &base_ref(cfg), &c.path().join("adapter"))?
            }
            None => {
                let snapshot = DecisionModel::from_parts(
                    self.dm.config.clone(),
                    self.model.valid(),
                    self.dm.prompter.tokenizer.clone(),
                    Some(self.dm.spec.clone()),
                    "checkpoint",
                )?;
                snapshot.save(&c.path().join("model"))?;
            }
        }
        checkpoint::write_optimizer(&c.path().join(checkpoint::OPTIMIZER_FILE), &self.opt)?;
        checkpoint::write_state(c.path(), &self.state)?;
        decision_data::atomic::write_atomic(c.path().join("run.toml"), cfg.to_toml().as_bytes())?;
        c.commit()?;
        self.saved_at = Some(self.state.step);
        Ok(())
    }

    /// The end of the loop: a checkpoint of the last step (unless one was just written), then,
    /// for a run that did all its steps, the final evaluation and temperatures, `final/`, the
    /// plots, the `final` metrics line and `summary.json`.
    fn finish(mut self) -> Result<TrainSummary> {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if self.saved_at != Some(self.state.step) {
            self.checkpoint()?;
        }
        let loop_s = self.clock.loop_started.elapsed().as_secs_f64();
        let tokens_per_s =
            (self.state.tokens - self.clock.tokens_at_start) as f64 / loop_s.max(1e-9);
        if self.state.step < self.total_steps {
            let empty = Report::new(&[], &|_| 1.0);
            let nothing = FinalEval {
                before: empty.clone(),
                after: empty,
                flip_rate: None,
                temps: Temperatures::default(),
            };
            return Ok(self.summary(nothing, tokens_per_s, true));
        }

        // The steps' freed buffers go back before the merge and the final evaluation.
        crate::model::host_memory::release_freed();
        let (model, adapter) = match &self.lspec {
            Some(spec) => {
                let adapter = lora::peft(&self.model, spec, &base_ref(self.cfg))?;
                (self.take_merged(), Some(adapter))
            }
            None => (self.model.valid(), None),
        };
        let mut fin = DecisionModel {
            model,
            ..clone_shell(&self.dm)
        };
        let (eval, scored) = self.final_eval(&fin)?;
        self.sample_gpu_memory();
        eval.temps.record_in(&mut fin.spec);
        for w in eval.temps.warnings() {
            eprintln!("warning: {w}");
        }
        let mut points: Vec<String> = self
            .stream
            .states()
            .iter()
            .map(|s| s.point.clone())
            .collect();
        points.sort();
        points.dedup();
        fin.spec.points = points;
        self.publish_final(&fin, adapter.as_ref())?;
        crate::plots::write_run_plots(self.run_dir, &self.metrics_path, &scored, &eval.temps)?;

        let summary = self.summary(eval, tokens_per_s, false);
        append_metrics(
            &self.metrics_path,
            &serde_json::json!({
                "kind": "final", "step": self.state.step,
                "accuracy": summary.valid_after.accuracy, "ece_before": summary.valid_before.ece,
                "ece_after": summary.valid_after.ece, "nll_after": summary.valid_after.nll,
                "flip_rate": summary.flip_rate, "tokens_per_s": tokens_per_s,
            }),
        )?;
        decision_data::atomic::write_json_atomic(self.run_dir.join("summary.json"), &summary)?;
        Ok(summary)
    }

    /// The trained model with its adapters merged, for `final/`. The model being trained and
    /// the base model share the base's weights, so both give up their decoder layers first:
    /// then the merge frees each base projection as it replaces it, and the end of a 4B run
    /// holds one set of projections, not two. Leaves both without layers; nothing runs them
    /// after this.
    fn take_merged(&mut self) -> Qwen3 {
        let layers = std::mem::take(&mut self.model.model.layers);
        self.dm.model.model.layers.clear();
        let mut trained = self.model.clone();
        trained.model.layers = layers;
        let valid = trained.valid();
        drop(trained);
        lora::merge(valid)
    }

    /// The final model `fin` on every validation state: temperatures fitted per decision point,
    /// metrics before and after them, and the flip rate under `[eval] permutations` other
    /// candidate orders. Also returns the scored states (for the reliability plot).
    fn final_eval(
        &self,
        fin: &DecisionModel,
    ) -> Result<(FinalEval, Vec<crate::metrics::ScoredState>)> {
        let cfg = self.cfg;
        let scored = crate::eval::score_states(
            fin,
            self.valid,
            cfg.eval.batch_size,
            self.eval_side_by_side,
        )?;
        let temps = calibration::fit(&scored, cfg.eval.min_states_per_point);
        let before = Report::new(&scored, &|_| 1.0);
        let mut after = Report::new(&scored, &|s| temps.for_point(&s.point));
        let flip_rate = if cfg.eval.permutations > 0 {
            Some(crate::eval::flip_rate(
                fin,
                self.valid,
                cfg.eval.permutations,
                cfg.train.seed,
                cfg.eval.batch_size,
                self.eval_side_by_side,
            )?)
        } else {
            None
        };
        after.flip_rate = flip_rate;
        let eval = FinalEval {
            before,
            after,
            flip_rate,
            temps,
        };
        Ok((eval, scored))
    }

    /// Write `final/` as checkpoints are written: into a hidden staging folder, every file
    /// synced, then renamed into place (see [`checkpoint::publish_dir`]), so a kill during the
    /// finish leaves the old `final/` or none, never half of one. LoRA runs add `adapter/`
    /// (taken from the model before the merge).
    fn publish_final(&self, fin: &DecisionModel, adapter: Option<&PeftAdapter>) -> Result<()> {
        let final_dir = self.run_dir.join("final");
        let staged = self.run_dir.join(".final.tmp");
        let aside = self.run_dir.join(".final.old");
        if staged.exists() {
            std::fs::remove_dir_all(&staged)
                .with_context(|| format!("removing {}", staged.display()))?;
        }
        fin.save_as(&staged, self.cfg.train.dtype.into())?;
        if let Some(adapter) = adapter {
            adapter.write_peft(&staged.join("adapter"))?;
        }
        checkpoint::sync_tree(&staged)?;
        checkpoint::publish_dir(&staged, &final_dir, &aside)
            .with_context(|| format!("publishing {}", final_dir.display()))
    }

    fn summary(&self, eval: FinalEval, tokens_per_s: f64, interrupted: bool) -> TrainSummary {
        TrainSummary {
            schema: "decision-train-summary/1".into(),
            name: self.cfg.name.clone(),
            steps: self.state.step,
            tokens: self.state.tokens,
            tokens_per_s,
            wall_s: self.clock.started.elapsed().as_secs_f64(),
            trainable_params: self.params.0,
            total_params: self.params.1,
            valid_before: eval.before.overall,
            valid_after: eval.after.overall,
            report_after: eval.after,
            flip_rate: eval.flip_rate,
            temperatures: eval.temps,
            final_train_loss: self.state.losses.last().copied(),
            interrupted,
            gpu_memory_peak_bytes: self.gpu_peak,
        }
    }
}

/// The trainer state, model (weights, or adapters on `dm`'s base) and optimizer saved in
/// checkpoint `dir` of step `step`.
fn load_checkpoint(
    cfg: &RunConfig,
    dm: &DecisionModel,
    lora: bool,
    plain: &Device,
    step: u64,
    dir: &Path,
) -> Result<(TrainerState, Qwen3, AdamW)> {
    let state = checkpoint::read_state(dir)?;
    if state.step != step {
        bail!(
            "{}: trainer state says step {}, folder says {step}",
            dir.display(),
            state.step
        );
    }
    let model = if lora {
        lora::load_peft(dm.model.clone(), &dir.join("adapter"))?.0
    } else {
        let files = crate::model::weights::weight_files(&dir.join("model"))?;
        crate::model::weights::load_model(
            &dm.config,
            &files,
            &dir.display().to_string(),
            plain,
            dm.dtype(),
        )?
    };
    let opt = checkpoint::read_optimizer(
        &dir.join(checkpoint::OPTIMIZER_FILE),
        adamw_settings(cfg),
        state.step,
        plain,
    )?;
    Ok((state, model, opt))
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
                    trains: cfg.train.mode == Mode::Full,
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
            let literal = decision_prompt::Template::parse(&spec.template)?.literal_text();
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
            let opts = decision_prompt::tokenizer::WordLevelOptions {
                min_count: cfg.model.min_token_count,
                max_vocab: None,
            };
            let tok = decision_prompt::tokenizer::build_word_level(corpus, &required, &opts)?;
            let (qcfg, std) = cfg.model.random_arch(tok.get_vocab_size(true))?;
            device.seed(mix_seed(cfg.train.seed, 0x1417, 0));
            let model = crate::model::qwen3::init_random(&qcfg, std, device);
            DecisionModel::from_parts(qcfg, model, tok, Some(spec), "random init")
        }
    }
}

/// The run's LoRA settings, `[lora] trainable_tokens` resolved to ids by the base's tokenizer.
fn lora_spec(cfg: &RunConfig, dm: &DecisionModel) -> Result<LoraSpec> {
    let tok = dm.tokenizer();
    let tokens = cfg
        .lora
        .trainable_tokens
        .iter()
        .map(|t| {
            tok.token_to_id(t).with_context(|| {
                let pieces = tok
                    .encode(t.as_str(), false)
                    .map(|e| e.get_tokens().to_vec())
                    .unwrap_or_default();
                format!(
                    "[lora] trainable_tokens: {t:?} is not one token of the base model's \
                     vocabulary; it encodes as {pieces:?}; list vocabulary entries instead"
                )
            })
        })
        .collect::<Result<Vec<u32>>>()?;
    Ok(LoraSpec {
        rank: cfg.lora.rank,
        alpha: cfg.lora.alpha,
        dropout: cfg.lora.dropout,
        targets: cfg.lora.targets.clone(),
        tokens,
    })
}

fn adamw_settings(cfg: &RunConfig) -> AdamWSettings {
    AdamWSettings {
        beta1: cfg.optim.beta1,
        beta2: cfg.optim.beta2,
        eps: cfg.optim.eps,
        weight_decay: cfg.optim.weight_decay,
    }
}

/// The base a LoRA run's adapters name (`base_model_name_or_path`).
fn base_ref(cfg: &RunConfig) -> String {
    cfg.model.source.clone().unwrap_or_default()
}

/// Steps the run makes in total.
fn total_steps(cfg: &RunConfig, n_train: usize) -> u64 {
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
fn param_counts(model: &crate::model::qwen3::Qwen3) -> (usize, usize) {
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
    let b = decision_data::progress::bar(Some(total), "steps");
    b.set_position(at);
    Some(b)
}
