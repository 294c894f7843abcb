//! The memory plan of a training run (`decision train --plan`): what the weights, the trainable
//! state and one micro-batch's activations take, before anything is loaded; and the refusal of
//! a run whose plan exceeds the device.
//!
//! Activations (f32 at every weight dtype) are counted per token and layer from what Burn's
//! autodiff keeps for the backward pass of our layer (`crate::model::qwen3`): norms, projections (and,
//! for a bf16 / f16 base, their inputs cast to it), RoPE copies, the shared key/value
//! heads, the SwiGLU products, and, without recomputation, the attention scores of every layer.
//! With recomputation (`crate::recompute`) only each layer's input stays (in f16 on an f16
//! base), plus one layer's tape and three blocks of attention scores, or in their place a piece
//! of a layer's second half's tape where that is larger. The counts are element
//! counts times the dtype's width; `RUNTIME` covers the process itself (code, tokenizer,
//! allocator slack). The plan was checked against the measured peak RSS at three sizes (README,
//! "Memory at real sizes").

use std::fmt::Write as _;

use anyhow::{Result, bail};
use burn::tensor::Device;

use crate::model::backend::{self, Backend, Precision};
use crate::model::config::Qwen3Config;
use crate::run_config::{Mode, RunConfig};

/// What an untaped forward pass (an evaluation, `decision score`) holds at its widest point, the
/// MLP of a layer with `hidden` and `intermediate` widths, for `tokens` tokens of a batch: per
/// token the layer's input, its norm and the residual, three intermediate-sized products alive at
/// once (f32), and a 16-bit base's copies of the two products' inputs in its dtype (`width`
/// bytes). Measured with `decision score` at the 0.6B shape: 57 KB a token (docs/results.md).
pub(crate) fn eval_batch_bytes(hidden: u64, intermediate: u64, width: u64, tokens: u64) -> u64 {
    let cast = if width == 4 {
        0
    } else {
        (hidden + intermediate) * width
    };
    tokens * ((3 * hidden + 3 * intermediate) * 4 + cast)
}

/// How many scoring batches of `batch_bytes` each to run side by side on the CPU: one per
/// thread, or as many as `free` bytes hold where that is fewer (at least one).
pub(crate) fn batches_that_fit(batch_bytes: u64, free: u64, threads: usize) -> usize {
    let fit = free / batch_bytes.max(1);
    (fit.min(threads as u64) as usize).max(1)
}

/// Rows of `tokens` tokens that one scoring batch on a GPU holds in `free` bytes: at most
/// `batch_size`, at least one. Per row, `eval_batch_bytes`; beside them the attention's three
/// blocks of scores (`heads x tokens²` a row, each block at most `score_block` scores); and no
/// MLP activation `[rows, tokens, intermediate]` in f32 past the `largest` buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gpu_rows_that_fit(
    hidden: u64,
    intermediate: u64,
    heads: u64,
    width: u64,
    tokens: u64,
    batch_size: usize,
    free: u64,
    largest: u64,
    score_block: u64,
) -> usize {
    let need = |rows| {
        gpu_eval_batch_bytes(
            hidden,
            intermediate,
            heads,
            width,
            rows,
            tokens,
            score_block,
        )
    };
    (1..=batch_size.max(1) as u64)
        .rev()
        .find(|&rows| need(rows) <= free && rows * tokens * intermediate * 4 <= largest)
        .unwrap_or(1) as usize
}

/// A scoring batch of `rows` x `tokens` on a GPU: [`eval_batch_bytes`] and the attention core's
/// three blocks of f32 scores (`Attention::core`: `heads x tokens²` a row, at most `score_block`
/// a block).
fn gpu_eval_batch_bytes(
    hidden: u64,
    intermediate: u64,
    heads: u64,
    width: u64,
    rows: u64,
    tokens: u64,
    score_block: u64,
) -> u64 {
    eval_batch_bytes(hidden, intermediate, width, rows * tokens)
        + 3 * 4 * score_block.min(rows * heads * tokens * tokens)
}

/// The host memory a scoring pass may still take, and where that figure comes from: with
/// `DECISION_DEVICE_MEMORY`, that budget less what the process holds now (the loaded model among
/// it); otherwise the system's `MemAvailable`. `None` where neither can be read.
pub(crate) fn host_memory_free() -> Option<(u64, String)> {
    if let Some(budget) = memory_from_env() {
        let budget = budget.ok()?;
        return Some((
            budget.saturating_sub(crate::model::host_memory::resident()?),
            "DECISION_DEVICE_MEMORY, less what the process holds".into(),
        ));
    }
    Some((meminfo("MemAvailable")?, "the RAM available".into()))
}

/// A field of `/proc/meminfo` (`MemTotal`, `MemAvailable`), in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Tokens per row a run of `cfg` pads its batches to at most: `[data] max_tokens`, rounded up to
/// the length a GPU runs at (`crate::model::qwen3::run_length`).
fn run_tokens(cfg: &RunConfig) -> u64 {
    let gpu = cfg.train.backend != crate::Backend::Cpu;
    crate::model::qwen3::run_length(cfg.data.max_tokens, gpu) as u64
}

/// The process besides its tensors: binary, tokenizer, states, thread pool. Measured: a tiny
/// run at batch 1 peaked at 133 MB with 92 MB of planned tensors.
pub(crate) const RUNTIME: u64 = 48 << 20;

/// Bytes of the parts of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Tokens per row the plan assumes (`[data] max_tokens`, rounded up to a multiple of 16 on a
    /// GPU: batches pad to their longest row, and on a GPU to that multiple).
    pub seq: usize,
    pub batch: usize,
    /// Shards of the micro-batch whose activations are alive at once (1 without sharding).
    pub shards_alive: usize,
    pub params: u64,
    pub trainable_params: u64,
    /// The model's weights in their dtype (the whole model in full fine-tuning).
    pub weights: u64,
    /// Trainable weights' gradients (accumulated and one micro-batch's) and AdamW's two moments,
    /// and the adapters themselves in LoRA mode.
    pub trainable_state: u64,
    /// One micro-batch's activations with recomputation (with `attention_kept` when
    /// `keep_attention`).
    pub activations_recompute: u64,
    /// What a LoRA run on the CPU keeps of each layer's attention for the replay by hand (its
    /// output and row sums; `crate::recompute`), all layers, shards alive included; 0 elsewhere.
    pub attention_kept: u64,
    /// Whether the replay reuses that kept attention: true unless [`MemoryPlan::fitted`] found
    /// that dropping it is what lets the run fit its device.
    pub keep_attention: bool,
    /// A replay through the tape: the pieces of tokens its layers' second halves run in, and
    /// one piece's tape (`[train] replay_piece_mib`); 0 pieces elsewhere.
    pub replay_pieces: usize,
    pub replay_piece_tape: u64,
    /// One micro-batch's activations without it.
    pub activations_taped: u64,
    pub recompute: bool,
    /// The end of a run besides the weights: one projection's merge at a time (LoRA), the
    /// trainable state, and the largest tensor's host copies while `final/` is saved.
    pub finish: u64,
    /// An evaluation's working memory beside the trainable state: `eval_alive` batches of
    /// `[eval] batch_size` rows, no tape.
    pub evaluation: u64,
    /// The rows of one evaluation batch the plan counts.
    pub eval_rows: usize,
    /// Evaluation batches alive at once: one per thread on the CPU (fewer where
    /// [`MemoryPlan::fitted`] found that only fewer fit), one on a GPU.
    pub eval_alive: usize,
    /// The batches side by side before [`MemoryPlan::fitted`]: one per thread, at most as many
    /// as `max_states` makes.
    pub eval_threads: usize,
    pub total: u64,
    /// The largest single tensor the run allocates, and what it is: on a GPU each tensor is one
    /// buffer, and an adapter caps a buffer's size ([`MemoryPlan::check_buffers`]).
    pub largest_buffer: (u64, String),
}

/// Rows per shard of a micro-batch, and how many shards run at once on `threads` threads.
fn shards(cfg: &RunConfig, threads: usize) -> (u64, u64) {
    let b = cfg.train.batch_size.max(1);
    let n = cfg.train.shards.clamp(1, b);
    let rows = b.div_ceil(n);
    (rows as u64, n.min(threads.max(1)) as u64)
}

/// Bytes per weight of the base. `auto` is planned as a half-width dtype, what it resolves to
/// wherever the device computes one ([`resolve_dtype`] resolves it before a run plans).
fn width(cfg: &RunConfig) -> u64 {
    match (cfg.train.mode, cfg.train.dtype) {
        (Mode::Full, _) | (_, Precision::F32) => 4,
        _ => 2,
    }
}

/// `cfg` with `[train] dtype` as `device` will run it: `auto` becomes the narrowest float the
/// device computes (bf16, else f16, else f32; f32 for full fine-tuning, which trains in f32). An
/// explicit dtype the device lacks is an error naming those it computes and what each would
/// plan to.
pub(crate) fn resolve_dtype(cfg: &RunConfig, device: &Device) -> Result<RunConfig> {
    let mut out = cfg.clone();
    let supported = backend::supported_precisions(device);
    match cfg.train.dtype {
        Precision::Auto if cfg.train.mode == Mode::Full => out.train.dtype = Precision::F32,
        Precision::Auto => out.train.dtype = supported[0],
        p if supported.contains(&p) => {}
        p => {
            let planned = architecture(cfg).map(|arch| {
                supported
                    .iter()
                    .map(|&q| {
                        let mut c = cfg.clone();
                        c.train.dtype = q;
                        format!("--set train.dtype={q} plans {}", gib(plan(&c, &arch).total))
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            let choices = match planned {
                Ok(list) => list,
                Err(_) => supported
                    .iter()
                    .map(|q| format!("--set train.dtype={q}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            bail!(
                "{}: {choices}; or `dtype = \"auto\"` takes the narrowest of them",
                backend::unsupported(cfg.train.backend, p, &supported)
            );
        }
    }
    Ok(out)
}

/// Plan `cfg` for the architecture `arch`.
pub fn plan(cfg: &RunConfig, arch: &Qwen3Config) -> MemoryPlan {
    let (h, d) = (arch.hidden_size as u64, arch.head_dim as u64);
    let (nh, layers) = (
        arch.num_attention_heads as u64,
        arch.num_hidden_layers as u64,
    );
    let qd = nh * d;
    let kvd = arch.num_key_value_heads as u64 * d;
    let i = arch.intermediate_size as u64;
    let v = arch.vocab_size as u64;
    let params: u64 = crate::model::weights::expected_tensors(arch)
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum();
    let w = width(cfg);
    let s = run_tokens(cfg);
    // A micro-batch runs as shards side by side on the thread pool: each holds its own rows'
    // activations, and as many are alive as there are threads to run them.
    let threads = rayon::current_num_threads().max(1);
    let (b, alive) = shards(cfg, threads);
    let tokens = b * s;

    let trainable_params = match cfg.train.mode {
        Mode::Full => params,
        Mode::Lora => {
            let r = cfg.lora.rank as u64;
            let dims = |t: &str| match t {
                "q_proj" => h + qd,
                "k_proj" | "v_proj" => h + kvd,
                "o_proj" => qd + h,
                _ => h + i,
            };
            layers * cfg.lora.targets.iter().map(|t| r * dims(t)).sum::<u64>()
                + cfg.lora.trainable_tokens.len() as u64 * h
        }
    };
    let tokens_train = cfg.train.mode == Mode::Lora && !cfg.lora.trainable_tokens.is_empty();
    let weights = params * w;
    // f32 gradients, two AdamW moments, and the adapters' own f32 weights in LoRA mode. The
    // gradients: one f32 copy more than the sets alive at once, which are one (a micro-batch's),
    // or two while micro-batches are summed (the sum and the next one's), or one per shard
    // running. Measured (docs/results.md, "A checkpoint's host copies"): a full fine-tune of
    // 67 M parameters held one 268 MB copy more with `grad_accum = 2` than with 1, and about as
    // much with two shards as with one.
    let own = if cfg.train.mode == Mode::Lora { 4 } else { 0 };
    let grad_sets = alive.max(if cfg.optim.grad_accum > 1 { 2 } else { 1 });
    let trainable_state = trainable_params * (4 * (1 + grad_sets) + 8 + own);

    // Per token, per layer, what the tape keeps (bytes): each RMSNorm keeps its f32 input and
    // normalised value and its output; RoPE its input, the rotated copy and the concatenation;
    // the shared key/value heads a copy per query head; SwiGLU four intermediate-sized tensors.
    // Activations are f32 whatever the weights' dtype (`crate::model::qwen3::in_f32`); a bf16 / f16 base
    // casts each projection's input to its dtype for the product, and the tape keeps that copy.
    let a = 4;
    let cast = |n: u64| if w == 4 { 0 } else { n * w };
    let norm = |n: u64| n * (4 + 4 + a);
    let attn_in = norm(h) + norm(qd) + norm(kvd) + 3 * qd * a + 3 * kvd * a + kvd * a + cast(3 * h);
    let attn_out = 2 * qd * a + h * a + cast(qd);
    let mlp = norm(h) + 4 * i * a + h * a + cast(2 * h + i);
    let layer = attn_in + attn_out + mlp;
    let scores_taped = 3 * nh * s * a;
    let taped = tokens * layers * (layer + 2 * qd * a + scores_taped);

    // The attention core's working memory: on the CPU, the host copies the tiles read (q, k, v,
    // the output and its gradient; `crate::model::flash`) and each row's log-sum-exp; elsewhere, three
    // blocks of scores.
    let scores = if cfg.train.backend == Backend::Cpu {
        tokens * (3 * qd + 2 * kvd) * 4 + b * nh * s * 4
    } else {
        let chunk = crate::recompute::query_chunk(
            b as usize,
            nh as usize,
            s as usize,
            crate::recompute::SCORE_BLOCK,
        ) as u64;
        3 * b * nh * chunk * s * 4
    };
    // Saved layer inputs; one layer's tape; the f32 q, k, v, heads and their gradients of the
    // hand-made attention core; its working memory; the gradient flowing between layers.
    let core = (2 * qd + 2 * kvd) * 4 * 2;
    // On a GPU an f16 base's core computes its products in f16
    // (`crate::model::blocked_attention::Products`), from f16 copies of q, k, v and the heads'
    // gradient.
    let f16_base = w == 2 && cfg.train.dtype == Precision::F16;
    let core = if cfg.train.backend != Backend::Cpu && f16_base {
        core + (2 * qd + 2 * kvd) * 2
    } else {
        core
    };
    // On the CPU a bf16 base's replay (`crate::replay`) holds the layer's frozen weights ready
    // for its products, one layer at a time: widened to f32, or `W` and `Wᵀ` packed in bf16 for
    // AVX512_BF16; four bytes a weight either way.
    // (An f16 base replays through the tape, with neither: `crate::replay::applies`.)
    let by_hand = cfg.train.backend == Backend::Cpu
        && cfg.train.mode == Mode::Lora
        && cfg.train.dtype != Precision::F16;
    let widened = if by_hand && w != 4 {
        (2 * h * qd + 2 * h * kvd + 3 * h * i) * 4
    } else {
        0
    };
    // A LoRA run on the CPU over an f32 or bf16 base replays by hand, and keeps every layer's
    // attention output (f32) and row sums from the first pass (`crate::recompute`).
    let attention_kept = if by_hand {
        tokens * layers * (qd + nh) * 4
    } else {
        0
    };
    // A LoRA replay through the tape (a GPU's, or an f16 base's on the CPU) keeps less than
    // `layer`: Burn keeps a product's input only for a tracked weight, so the frozen base's
    // products keep nothing (an f16 base's casts included), and the adapters keep their f32
    // inputs: the normed layer input, the heads' outputs, the post-attention norm's output, the
    // SwiGLU product. Besides those, q and k before their norms, the residual, SwiGLU's two
    // partial derivatives (`crate::model::qwen3::silu_mul_taped`), and two intermediate-sized
    // gradients that the MLP's backward holds beside them. Checked against what Burn's GPU
    // runtime reserved on llvmpipe (docs/results.md). The layer's second half (after the
    // attention core) replays in pieces of tokens, one piece's tape alive at a time
    // (`crate::recompute::finish_pieces`, within `[train] replay_piece_mib`), and never beside
    // the core's blocks of scores: the core's forward frees its blocks before the half replays,
    // and the half's last piece is freed before the core's backward computes them again
    // (`crate::recompute::loss_and_grads`), so the plan counts the larger of the two. On
    // llvmpipe the memory Burn's pool reserved grew by less than that larger one when the tape
    // grew past the scores, far less than their sum (docs/results.md, "The replay's tape in the
    // scores' place"). Where that half replays by hand (`crate::finish_by_hand`: its base
    // frozen) it holds the same tensors off the tape, in the same pieces; the reserved memory
    // measured the same (docs/results.md, "The replay's second half by hand").
    let (replay_layer, finish_tape, replay_pieces) = if cfg.train.mode == Mode::Lora && !by_hand {
        use crate::recompute::{finish_bytes_per_token, finish_pieces};
        let dims = [h, qd, i].map(|n| n as usize);
        let budget = cfg.train.replay_piece_bytes();
        let rows = finish_pieces(b as usize, s as usize, dims, true, budget) as u64;
        let per_token = finish_bytes_per_token(dims) as u64;
        let pieces = s.div_ceil(rows.max(1)) as usize;
        ((h + qd + kvd) * a, b * rows * per_token, pieces)
    } else {
        (layer, 0, 0)
    };
    // Each layer's input, kept for the replay: f32, or on an f16 base in f16 with each token's
    // scale (`crate::recompute::Keep::Scaled`). On a GPU also the attention's rows' largest
    // scores from the first pass, which the replay reads (`blocked_attention::RowMax`): f32, a
    // query head a token.
    let maxima = if cfg.train.backend == Backend::Cpu {
        0
    } else {
        nh * 4
    };
    let kept = if f16_base { h * 2 + 4 } else { h * a } + maxima;
    let recompute = tokens * layers * kept
        + tokens * (replay_layer + core + 3 * h * 4)
        + finish_tape.max(scores)
        + widened
        + attention_kept;
    // The head: label logits are tiny; the next-token term multiplies the whole vocabulary.
    // With trainable tokens a tied head is rebuilt with their rows for that product: an f32 copy
    // and one in the weights' dtype.
    let head = if cfg.loss.lm_weight > 0.0 {
        3 * tokens * v * 4 + if tokens_train { v * h * (4 + w) } else { 0 }
    } else {
        tokens * h * 4 * 2
    };
    let activations_taped = alive * (taped + head);
    let activations_recompute = alive * (recompute + head);
    let largest = crate::model::weights::largest_tensor(arch)
        .1
        .iter()
        .product::<usize>() as u64;
    // The merge replaces one projection at a time (`crate::model::lora::merge`; the trainer first drops
    // its other handles on the base): the adapters' product, the base cast up and their sum in
    // f32, then the sum in the base's dtype.
    // Trainable tokens are written into a copy of the embedding (the base model still holds the
    // original).
    let proj = (h * qd).max(h * i);
    let merged = if cfg.train.mode == Mode::Lora {
        let rows = if tokens_train { v * h * w } else { 0 };
        (proj * (3 * 4 + w)).max(rows)
    } else {
        0
    };
    // `final/` is written in the weights' dtype, one tensor at a time
    // (`crate::model::weights::hf_tensors`): an f32 host copy of the largest tensor and its
    // bytes. Those are host memory: on a GPU the device holds only a projection's transposed
    // copy for the read.
    let finish = merged
        + trainable_state
        + if cfg.train.backend == Backend::Cpu {
            largest * (4 + w)
        } else {
            proj * w
        };
    let largest_buffer = largest_buffer(cfg, arch, b, w, tokens_train);
    // Evaluation (every `eval_every` steps and at the end), untaped, `[eval] batch_size` rows
    // at a time (no more than `max_states`; `eval_batch_bytes`). On the CPU a batch per thread runs
    // side by side (`crate::model::score::logits_in_batches`), its attention in small tiles; on
    // a GPU one batch at a time, with the attention core's blocks of scores (`Attention::core`:
    // three of at most SCORE_BLOCK).
    let eval_rows = match cfg.eval.max_states {
        0 => cfg.eval.batch_size,
        m => cfg.eval.batch_size.min(m),
    }
    .max(1);
    let rows = eval_rows as u64;
    let eval_layer = eval_batch_bytes(h, i, w, rows * s);
    let (eval_alive, evaluation) = if cfg.train.backend == Backend::Cpu {
        let batches = match cfg.eval.max_states {
            0 => u64::MAX,
            m => (m as u64).div_ceil(rows),
        };
        let alive = (threads as u64).min(batches);
        (alive, alive * eval_layer)
    } else {
        let block = crate::recompute::SCORE_BLOCK as u64;
        (1, gpu_eval_batch_bytes(h, i, nh, w, rows, s, block))
    };
    let mut p = MemoryPlan {
        seq: s as usize,
        batch: cfg.train.batch_size,
        shards_alive: alive as usize,
        params,
        trainable_params,
        weights,
        trainable_state,
        activations_recompute,
        activations_taped,
        attention_kept: alive * attention_kept,
        keep_attention: true,
        replay_pieces,
        replay_piece_tape: finish_tape,
        recompute: cfg.train.recompute,
        finish,
        evaluation,
        eval_rows,
        eval_alive: eval_alive as usize,
        eval_threads: eval_alive as usize,
        total: 0,
        largest_buffer,
    };
    p.total = p.total_with(p.activations(), p.evaluation);
    p
}

/// The largest single tensor a run allocates on its device, named: the largest weight in its
/// dtype, one `[rows, s, intermediate]` MLP activation (f32), the next-token logits where
/// `lm_weight` asks for them, a tied head rebuilt for trainable tokens (f32), and without
/// recompute one layer's attention scores. With recompute the attention core's blocks of scores
/// shrink to what the device allocates (`crate::recompute::query_chunk`), so they never are.
fn largest_buffer(
    cfg: &RunConfig,
    arch: &Qwen3Config,
    rows: u64,
    w: u64,
    tokens_train: bool,
) -> (u64, String) {
    let s = run_tokens(cfg);
    let (h, i, v) = (
        arch.hidden_size as u64,
        arch.intermediate_size as u64,
        arch.vocab_size as u64,
    );
    let (name, shape) = crate::model::weights::largest_tensor(arch);
    let dtype = if w == 4 { "f32" } else { "a 16-bit float" };
    let mut all = vec![
        (
            shape.iter().product::<usize>() as u64 * w,
            format!("the weight {name} {shape:?} in {dtype}"),
        ),
        (
            rows * s * i * 4,
            format!("an MLP activation [{rows}, {s}, {i}] in f32"),
        ),
    ];
    if cfg.loss.lm_weight > 0.0 {
        all.push((
            rows * s * v * 4,
            format!("the next-token logits [{rows}, {s}, {v}] in f32"),
        ));
    }
    if tokens_train {
        all.push((
            v * h * 4,
            format!("the head with trainable tokens [{v}, {h}] in f32"),
        ));
    }
    if !cfg.train.recompute {
        let nh = arch.num_attention_heads as u64;
        all.push((
            rows * nh * s * s * 4,
            format!("one layer's attention scores [{rows}, {nh}, {s}, {s}] in f32"),
        ));
    }
    all.into_iter().max_by_key(|(b, _)| *b).unwrap_or_default()
}

/// `bytes` in MiB below a GiB, else in GiB, two decimals: a buffer's size.
pub(crate) fn size(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        gib(bytes)
    }
}

/// Where the replay's second half in smaller pieces would lower `cfg`'s plan (its one piece's
/// tape past the attention's blocks of scores, whose place it takes): a `[train]
/// replay_piece_mib` that cuts the piece about in half, and the plan's total with it.
pub(crate) fn smaller_replay_pieces(cfg: &RunConfig, arch: &Qwen3Config) -> Option<(usize, u64)> {
    let now = plan(cfg, arch);
    if !cfg.train.recompute || now.replay_pieces == 0 {
        return None;
    }
    // Half the setting, where that cuts the piece; else half the piece.
    let tape_mib = now.replay_piece_tape.div_ceil(1 << 20) as usize;
    let half = cfg.train.replay_piece_mib / 2;
    let mut smaller = cfg.clone();
    smaller.train.replay_piece_mib = if half < tape_mib { half } else { tape_mib / 2 }.max(1);
    let then = plan(&smaller, arch);
    (then.total < now.total).then_some((smaller.train.replay_piece_mib, then.total))
}

/// `bytes` in GiB, two decimals, as the plan prints sizes.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl MemoryPlan {
    /// A micro-batch's activations, as the run keeps them (with or without recompute).
    fn activations(&self) -> u64 {
        if self.recompute {
            self.activations_recompute
        } else {
            self.activations_taped
        }
    }

    /// The weights, the runtime, and the larger phase: a training step with `activations`, an
    /// evaluation holding `evaluation`, or the end of the run.
    fn total_with(&self, activations: u64, evaluation: u64) -> u64 {
        RUNTIME
            + self.weights
            + (self.trainable_state + activations.max(evaluation)).max(self.finish)
    }

    /// This plan for a device of `dev`'s memory. Where it does not fit:
    /// - an evaluation on the CPU that runs a batch per thread side by side runs as many as
    ///   fit, the largest number that does (evaluations are rare; this costs none of a step);
    /// - where it still does not fit but would without the attention kept for the replay, the
    ///   replay recomputes the attention core instead (a sixth of a step's work at 2048 tokens)
    ///   and the plan no longer counts it.
    pub fn fitted(mut self, dev: &DeviceMemory) -> Self {
        if self.total > dev.bytes && self.eval_alive > 1 {
            let per_batch = self.evaluation / self.eval_alive as u64;
            let activations = self.activations();
            let fits = (1..self.eval_alive)
                .rev()
                .find(|&k| self.total_with(activations, per_batch * k as u64) <= dev.bytes);
            if let Some(k) = fits {
                self.eval_alive = k;
                self.evaluation = per_batch * k as u64;
                self.total = self.total_with(activations, self.evaluation);
            }
        }
        if self.total > dev.bytes && self.recompute && self.attention_kept > 0 {
            let activations = self.activations_recompute - self.attention_kept;
            let total = self.total_with(activations, self.evaluation);
            // Where another phase (an evaluation) is what does not fit, recomputing would cost
            // the replay its speed and fit nothing.
            if total <= dev.bytes {
                self.activations_recompute = activations;
                self.total = total;
                self.keep_attention = false;
            }
        }
        self
    }

    /// Refuse a run whose largest tensor is larger than the largest buffer the device allocates
    /// (`limit`, of `adapter`): it would fail at its first step whatever the memory free, where
    /// a smaller batch, shorter prompts or a narrower dtype may fit.
    pub fn check_buffers(
        &self,
        cfg: &RunConfig,
        limit: u64,
        adapter: &str,
        computes: &[Precision],
    ) -> Result<()> {
        let (bytes, what) = &self.largest_buffer;
        if *bytes <= limit {
            return Ok(());
        }
        let half = computes.iter().find(|p| **p != Precision::F32);
        let advice = match half {
            _ if !what.starts_with("the weight") => format!(
                "lower --set train.batch_size (now {}, raising optim.grad_accum keeps the \
                 effective batch) or --set data.max_tokens (now {})",
                cfg.train.batch_size, cfg.data.max_tokens
            ),
            Some(p) if cfg.train.mode == Mode::Lora && width(cfg) == 4 && bytes / 2 <= limit => {
                format!("--set train.dtype={p} halves it")
            }
            _ => "this adapter cannot hold the model (a GPU's own Vulkan or Metal driver allows \
                  far larger buffers); --backend cpu runs it"
                .to_string(),
        };
        bail!(
            "{what} takes {}, more than the largest buffer {adapter} allocates ({}); {advice}",
            size(*bytes),
            size(limit)
        )
    }

    /// The table `--plan` prints.
    pub fn render(&self, cfg: &RunConfig, device: Option<&DeviceMemory>) -> String {
        let mut o = String::new();
        let dtype = if width(cfg) == 2 {
            cfg.train.dtype.to_string()
        } else {
            "f32".into()
        };
        let _ = writeln!(
            o,
            "memory plan: {} parameters ({} trainable), micro-batch {} x {} tokens{}, {dtype} weights",
            self.params,
            self.trainable_params,
            self.batch,
            self.seq,
            if cfg.train.shards > 1 {
                format!(
                    " ({} shards, {} at a time)",
                    cfg.train.shards, self.shards_alive
                )
            } else {
                String::new()
            }
        );
        let row = |o: &mut String, what: &str, b: u64| {
            let _ = writeln!(o, "  {what:<44} {:>12}", gib(b));
        };
        row(&mut o, "weights", self.weights);
        row(
            &mut o,
            "trainable state (weights, grads, AdamW)",
            self.trainable_state,
        );
        let (on, off) = if self.recompute {
            ("", " (not used)")
        } else {
            (" (not used)", "")
        };
        row(
            &mut o,
            &format!("activations with recompute{on}"),
            self.activations_recompute,
        );
        if self.recompute && self.replay_pieces > 0 {
            row(
                &mut o,
                &match self.replay_pieces {
                    1 => "  of which the replay's one piece".to_string(),
                    n => format!("  of which 1 of {n} replay pieces"),
                },
                self.replay_piece_tape,
            );
            let _ = writeln!(
                o,
                "    ([train] replay_piece_mib: fewer pieces hold more and launch less)"
            );
        }
        if self.recompute && self.attention_kept > 0 {
            if self.keep_attention {
                row(
                    &mut o,
                    "  of which attention kept for the replay",
                    self.attention_kept,
                );
            } else {
                let _ = writeln!(
                    o,
                    "  attention recomputed in the replay: keeping it ({}) would not fit",
                    gib(self.attention_kept)
                );
            }
        }
        row(
            &mut o,
            &format!("activations without recompute{off}"),
            self.activations_taped,
        );
        if self.evaluation > 0 {
            row(
                &mut o,
                &if self.eval_alive > 1 {
                    format!(
                        "evaluation ({} x {} rows, no tape), instead",
                        self.eval_alive, self.eval_rows
                    )
                } else {
                    format!("evaluation ({} rows, no tape), instead", self.eval_rows)
                },
                self.evaluation,
            );
            if self.eval_alive < self.eval_threads {
                let _ = writeln!(
                    o,
                    "    {} batches side by side, not {}: more would not fit",
                    self.eval_alive, self.eval_threads
                );
            }
        }
        row(&mut o, "runtime", RUNTIME);
        row(&mut o, "at the end: merge and save, instead", self.finish);
        row(
            &mut o,
            "total (weights, runtime, the larger phase)",
            self.total,
        );
        if let Some(dev) = device {
            let _ = writeln!(
                o,
                "  {:<44} {:>12}",
                format!("device ({})", dev.what),
                gib(dev.bytes)
            );
        }
        o
    }

    /// Refuse a plan (as [`MemoryPlan::fitted`] made it for `dev`) over the device's memory,
    /// suggesting settings that fit.
    pub fn check(&self, cfg: &RunConfig, arch: &Qwen3Config, dev: &DeviceMemory) -> Result<()> {
        if self.total <= dev.bytes {
            return Ok(());
        }
        let mut fits = Vec::new();
        let effective = cfg.train.batch_size * cfg.optim.grad_accum;
        for (dtype, recompute) in [(cfg.train.dtype, true), (dev.narrowest, true)] {
            for bs in [cfg.train.batch_size, 8, 4, 2, 1] {
                if bs > cfg.train.batch_size {
                    continue;
                }
                let mut c = cfg.clone();
                c.train.batch_size = bs;
                c.train.shards = c.train.shards.min(bs);
                c.optim.grad_accum = effective.div_ceil(bs);
                c.train.recompute = recompute;
                if c.train.mode == Mode::Lora {
                    c.train.dtype = dtype;
                }
                let mut p = plan(&c, arch).fitted(dev);
                // An evaluation batch larger than the training one may be what does not fit.
                let mut eval = String::new();
                if p.total > dev.bytes / 10 * 9 && p.evaluation > 0 && c.eval.batch_size > bs {
                    c.eval.batch_size = bs;
                    p = plan(&c, arch).fitted(dev);
                    eval = format!(" --set eval.batch_size={bs}");
                }
                // Suggest only what leaves a tenth of the device free: a plan is an estimate.
                if p.total <= dev.bytes / 10 * 9 {
                    fits.push(format!(
                        "--set train.batch_size={bs} --set optim.grad_accum={} --set train.recompute=true{}{eval} ({})",
                        c.optim.grad_accum,
                        if c.train.mode == Mode::Lora && dtype != Precision::F32 {
                            format!(" --set train.dtype={dtype}")
                        } else {
                            String::new()
                        },
                        gib(p.total)
                    ));
                    break;
                }
            }
        }
        fits.dedup();
        let advice = if fits.is_empty() {
            "no batch size fits; shorten [data] max_tokens or use a smaller model".to_string()
        } else {
            format!("this would fit: {}", fits.join("; or "))
        };
        bail!(
            "the run needs about {} but the device ({}) has {}; {advice}. `decision train --plan` \
             prints the whole plan",
            gib(self.total),
            dev.what,
            gib(dev.bytes)
        )
    }
}

/// How much memory a run may use on its device, and the narrowest float it computes.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceMemory {
    pub bytes: u64,
    pub what: String,
    /// The narrowest float precision the device computes: what a suggestion may set `[train]
    /// dtype` to.
    pub narrowest: Precision,
}

/// The memory of `backend`'s device: RAM (`MemTotal`) on the CPU, as far as this system says;
/// on a GPU the largest device-local heap, where its runtime reports one (Vulkan does). `None`
/// where it cannot be known.
pub(crate) fn device_memory(backend: Backend, device: &Device) -> Option<DeviceMemory> {
    let narrowest = backend::supported_precisions(device)[0];
    match backend {
        Backend::Cpu => Some(DeviceMemory {
            bytes: meminfo("MemTotal")?,
            what: "RAM".into(),
            narrowest,
        }),
        Backend::Wgpu => {
            let adapter = backend::wgpu_adapter()?;
            Some(DeviceMemory {
                bytes: adapter.memory?,
                what: format!("{:?}'s memory", adapter.name),
                narrowest,
            })
        }
    }
}

/// The architecture a run trains, from its config alone (the source's `config.json`, or
/// `[model.arch]` for a random init), without loading any weights.
pub fn architecture(cfg: &RunConfig) -> Result<Qwen3Config> {
    match cfg.model.init {
        crate::run_config::Init::Pretrained => {
            let src = cfg.model.source.as_deref().unwrap_or_default();
            let dir = crate::model::hub::resolve(src, &crate::model::hub::HubEnv::from_env())?;
            Qwen3Config::from_file(&dir.dir.join("config.json"))
        }
        // The word-level vocabulary is built from the data later; it is small.
        crate::run_config::Init::Random => Ok(cfg.model.random_arch(4096)?.0),
    }
}

/// What a pretrained run's source holds besides its weights, checked as the run will use it:
/// the architecture, and the tokenizer with the run's prompt (`decision.json`, or the defaults
/// for the tokenizer), whose labels must each be one token. `None` for a random init (its
/// word-level vocabulary is built from the data). Reads no weights.
pub(crate) fn describe_source(cfg: &RunConfig, arch: &Qwen3Config) -> Result<Option<String>> {
    if !matches!(cfg.model.init, crate::run_config::Init::Pretrained) {
        return Ok(None);
    }
    let src = cfg.model.source.as_deref().unwrap_or_default();
    let md = crate::model::hub::resolve(src, &crate::model::hub::HubEnv::from_env())?;
    let tied = if arch.tie_word_embeddings {
        "embedding tied to the head"
    } else {
        "embedding and head apart"
    };
    let mut o = format!(
        "model: {} ({}): {} layers, hidden {}, vocabulary {} rows ({tied})\n",
        md.origin,
        md.dir.display(),
        arch.num_hidden_layers,
        arch.hidden_size,
        arch.vocab_size
    );
    let tok_path = md.dir.join("tokenizer.json");
    if !tok_path.is_file() {
        o.push_str("tokenizer: none in the source (a run needs its tokenizer.json)\n");
        return Ok(Some(o));
    }
    let tok = decision_prompt::tokenizer::load(&tok_path)?;
    let spec_path = md.dir.join(decision_prompt::spec::FILE);
    let (mut spec, which) = if spec_path.is_file() {
        (
            decision_prompt::DecisionSpec::from_file(&spec_path)?,
            "decision.json",
        )
    } else {
        (crate::default_spec(&tok), "the defaults")
    };
    spec.max_options = cfg.data.max_options;
    spec.max_tokens = cfg.data.max_tokens;
    let added = tok.get_added_tokens_decoder().len();
    let total = tok.get_vocab_size(true);
    let prompter = crate::model::decision_model::prompter_for(arch, tok, &spec, &md.origin)?;
    let template = match decision_prompt::tokenizer::chat_markers(&prompter.tokenizer) {
        (true, true) => "Qwen's chat template, non-thinking",
        (true, false) => "Qwen's chat template",
        (false, _) => "the plain template",
    };
    let ids = &prompter.label_token_ids;
    let _ = writeln!(
        o,
        "tokenizer: {total} tokens ({} + {added} added); prompt from {which}: {template}; \
         labels {}..{}: {} single tokens (ids {}..{})",
        total - added,
        spec.labels[0],
        spec.labels[ids.len() - 1],
        ids.len(),
        ids.iter().min().copied().unwrap_or_default(),
        ids.iter().max().copied().unwrap_or_default(),
    );
    Ok(Some(o))
}

/// The device memory to plan against: `DECISION_DEVICE_MEMORY` (GiB) when set, else what the
/// system reports for the backend's `device`.
pub(crate) fn device_limit(backend: Backend, device: &Device) -> Result<Option<DeviceMemory>> {
    match memory_from_env() {
        Some(bytes) => Ok(Some(DeviceMemory {
            bytes: bytes?,
            what: "DECISION_DEVICE_MEMORY".into(),
            narrowest: backend::supported_precisions(device)[0],
        })),
        None => Ok(device_memory(backend, device)),
    }
}

/// Refuses a `DECISION_DEVICE_MEMORY` that is not a size in GiB, before work that reads it where
/// it cannot say so (the scoring commands' batches).
pub(crate) fn check_memory_env() -> Result<()> {
    memory_from_env().transpose().map(|_| ())
}

/// `DECISION_DEVICE_MEMORY` in bytes, where set: a size in GiB.
fn memory_from_env() -> Option<Result<u64>> {
    let v = std::env::var("DECISION_DEVICE_MEMORY").ok()?;
    Some(
        v.trim()
            .parse()
            .ok()
            .filter(|g: &f64| *g > 0.0)
            .map(|gib| (gib * (1u64 << 30) as f64) as u64)
            .ok_or_else(|| {
                anyhow::anyhow!("DECISION_DEVICE_MEMORY={v:?}: expected a size in GiB, e.g. 24")
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(batch: usize, shards: usize) -> RunConfig {
        let sets = [
            format!("train.batch_size={batch}"),
            format!("train.shards={shards}"),
        ];
        let text = include_str!("../../configs/tiny.toml");
        RunConfig::parse(text, &sets).unwrap()
    }

    /// configs/shapes/qwen3-4b.json.
    fn four_b_arch() -> Qwen3Config {
        Qwen3Config::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../configs/shapes/qwen3-4b.json"),
        )
        .unwrap()
    }

    /// configs/qwen3-4b-lora.toml with `sets`, and its plan.
    fn four_b(sets: &[&str]) -> (RunConfig, MemoryPlan) {
        let text = include_str!("../../configs/qwen3-4b-lora.toml");
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let cfg = RunConfig::parse(text, &sets).unwrap();
        let p = plan(&cfg, &four_b_arch());
        (cfg, p)
    }

    /// A GPU pads each batch to a multiple of 16 tokens, so its plan counts `max_tokens` rounded
    /// up to one; the CPU pads to the longest row, and its plan counts `max_tokens`.
    #[test]
    fn a_gpu_plans_the_length_its_batches_are_padded_to() {
        let (_, gpu) = four_b(&[
            "train.backend=wgpu",
            "train.dtype=f16",
            "data.max_tokens=1000",
        ]);
        let (_, round) = four_b(&[
            "train.backend=wgpu",
            "train.dtype=f16",
            "data.max_tokens=1008",
        ]);
        let (_, cpu) = four_b(&["train.backend=cpu", "data.max_tokens=1000"]);
        assert_eq!(gpu.seq, 1008);
        assert_eq!(cpu.seq, 1000);
        assert_eq!(gpu.total, round.total);
    }

    /// Scoring on a GPU without a plan (`decision score`, `decision eval`) takes as many rows a
    /// batch as the free memory holds, counted as the plan counts the 4B config's evaluation (4
    /// rows of 2048 tokens, f16 on Vulkan): that evaluation's bytes hold its 4 rows and no more.
    #[test]
    fn scoring_on_a_gpu_takes_the_rows_a_batch_that_fit() {
        let (cfg, p) = four_b(&["train.backend=wgpu", "train.dtype=f16"]);
        let a = four_b_arch();
        assert_eq!(cfg.eval.batch_size, 4);
        let block = crate::recompute::SCORE_BLOCK as u64;
        let fit = |batch: usize, free: u64, largest: u64| {
            gpu_rows_that_fit(
                a.hidden_size as u64,
                a.intermediate_size as u64,
                a.num_attention_heads as u64,
                2,
                cfg.data.max_tokens as u64,
                batch,
                free,
                largest,
                block,
            )
        };
        let big = 4 << 30;
        assert_eq!(fit(32, p.evaluation, big), 4);
        assert_eq!(fit(32, p.evaluation - 1, big), 3);
        assert_eq!(fit(3, p.evaluation, big), 3, "no more than asked for");
        assert_eq!(fit(32, 0, big), 1, "one row runs whatever the memory");
        // an MLP activation of a row is 2048 x 9728 x 4 bytes (76 MiB): 128 MiB buffers take one
        assert_eq!(fit(32, 1 << 40, 128 << 20), 1);
        assert_eq!(fit(32, 1 << 40, big), 32);
    }

    /// On the CPU an evaluation runs a batch per thread side by side. Where that is what does not
    /// fit, it runs as many as fit instead, before the replay gives up the attention it keeps.
    #[test]
    fn an_evaluation_on_the_cpu_runs_as_many_batches_side_by_side_as_fit() {
        let eight = rayon::ThreadPoolBuilder::new()
            .num_threads(8)
            .build()
            .unwrap();
        let (cfg, p) = eight.install(|| four_b(&["train.backend=cpu"]));
        let arch = four_b_arch();
        assert_eq!((p.eval_alive, p.eval_threads), (8, 8));
        let per_batch = p.evaluation / 8;
        assert!(
            p.evaluation > p.activations_recompute,
            "evaluation is the larger phase"
        );
        let dev = |bytes: u64| DeviceMemory {
            bytes,
            what: "a test machine".into(),
            narrowest: Precision::Bf16,
        };
        // the fewest batches that still outweigh the training step's activations (5 at the 4B)
        let k = (p.activations_recompute / per_batch + 1) as usize;
        assert!(k > 1 && k < 8);
        // room for k batches: k run, the attention stays kept, and the plan says why
        let room = p.total - (8 - k as u64) * per_batch;
        let f = p.clone().fitted(&dev(room));
        assert_eq!((f.eval_alive, f.evaluation), (k, k as u64 * per_batch));
        assert!(f.keep_attention);
        assert_eq!(f.total, room);
        assert!(f.check(&cfg, &arch, &dev(room)).is_ok());
        assert!(f.render(&cfg, Some(&dev(room))).contains(&format!(
            "{k} batches side by side, not 8: more would not fit"
        )));
        // room for the training step alone: the batches that fit within its activations
        let step = p.total - p.evaluation + p.activations_recompute;
        assert_eq!(p.clone().fitted(&dev(step)).eval_alive, k - 1);
        // where the training step itself does not fit, fewer batches fit nothing: unchanged
        let none = p.weights + p.trainable_state + p.activations_recompute / 2;
        let g = p.clone().fitted(&dev(none));
        assert_eq!(g.eval_alive, 8);
        assert!(g.check(&cfg, &arch, &dev(none)).is_err());
        // with room for all, all run
        assert_eq!(p.clone().fitted(&dev(p.total)).eval_alive, 8);
    }

    /// Summing micro-batches, or shards running side by side, holds another f32 set of the
    /// trainable parameters' gradients: a full fine-tune of 67 M parameters peaked one 268 MB
    /// copy higher with `grad_accum = 2` than with 1 (docs/results.md).
    #[test]
    fn summed_gradients_are_planned_as_one_more_copy() {
        let state = |sets: &[&str]| {
            let (_, p) = four_b(sets);
            (p.trainable_state, p.trainable_params)
        };
        let (one, n) = state(&["optim.grad_accum=1"]);
        let (summed, _) = state(&["optim.grad_accum=16"]);
        assert_eq!(one, n * (4 + 4 + 8 + 4));
        assert_eq!(summed - one, n * 4);
        // two shards alive at once on at least two threads
        if rayon::current_num_threads() > 1 {
            let (sharded, _) = state(&["optim.grad_accum=1", "train.shards=2"]);
            assert_eq!(sharded - one, n * 4);
        }
        let (_, full) = four_b(&["optim.grad_accum=1", "train.mode=full"]);
        assert_eq!(full.trainable_state, full.params * (4 + 4 + 8));
    }

    /// Shards run one per thread: the plan holds the rows of the shards alive at once, so four
    /// shards of 32 rows on two threads plan 16 rows of activations, not 32.
    #[test]
    fn shards_alive_at_once_are_planned() {
        assert_eq!(shards(&cfg(32, 1), 2), (32, 1));
        assert_eq!(shards(&cfg(32, 4), 2), (8, 2));
        assert_eq!(shards(&cfg(32, 4), 16), (8, 4));
        // one row per shard, more shards than threads
        assert_eq!(shards(&cfg(3, 3), 2), (1, 2));
        // 10 rows in 4 shards: shards of 3 (the largest is what is alive)
        assert_eq!(shards(&cfg(10, 4), 2), (3, 2));
    }

    /// The 4B job on the CPU (bf16 base, 2 x 2048 tokens, recompute): the attention kept for the
    /// replay is planned where the device has room for it, dropped where that is what makes the
    /// run fit, and a device too small either way is still refused.
    #[test]
    fn the_kept_attention_goes_where_it_does_not_fit() {
        let sets = [
            "train.backend=cpu",
            "train.dtype=bf16",
            "train.batch_size=2",
        ];
        let (cfg, full) = four_b(&sets);
        let arch = four_b_arch();
        // output (2560 columns) and row sums (32 heads) in f32, 4096 tokens, 36 layers
        assert_eq!(full.attention_kept, 4096 * 36 * (4096 + 32) * 4);
        assert!(full.keep_attention && full.total > full.attention_kept + (10 << 30));
        let dev = |bytes: u64| DeviceMemory {
            bytes,
            what: "a test machine".into(),
            narrowest: Precision::Bf16,
        };
        // room for all of it: nothing changes
        let roomy = plan(&cfg, &arch).fitted(&dev(full.total));
        assert!(roomy.keep_attention);
        assert_eq!(roomy.total, full.total);
        assert!(roomy.check(&cfg, &arch, &dev(full.total)).is_ok());
        // a byte short: the replay computes the attention again, and the run fits
        let tight = dev(full.total - 1);
        assert!(full.check(&cfg, &arch, &tight).is_err());
        let fitted = plan(&cfg, &arch).fitted(&tight);
        assert!(!fitted.keep_attention);
        assert_eq!(fitted.total, full.total - full.attention_kept);
        assert!(fitted.check(&cfg, &arch, &tight).is_ok());
        let shown = fitted.render(&cfg, Some(&tight));
        assert!(
            shown.contains("attention recomputed in the replay"),
            "{shown}"
        );
        // too small even without it: refused, and the attention stays kept (dropping it fits
        // nothing)
        let small = dev(fitted.total - 1);
        let refused = plan(&cfg, &arch).fitted(&small);
        assert!(refused.keep_attention && refused.total == full.total);
        assert!(refused.check(&cfg, &arch, &small).is_err());
        // without recompute nothing is kept, and nothing is dropped
        let (taped, whole) = four_b(&[&sets[..], &["train.recompute=false"]].concat());
        let p = plan(&taped, &arch).fitted(&tight);
        assert!(p.keep_attention && p.total == whole.total);
    }

    /// The largest tensor against an adapter's largest buffer: the 4B job's is its embedding
    /// (151936 x 2560) in the base's dtype; llvmpipe's OpenGL buffers (128 MiB) cannot hold it in
    /// any dtype, a 1 GiB one holds it in f16 but not in f32, and an activation over the limit
    /// asks for a smaller batch instead.
    #[test]
    fn a_tensor_over_the_adapters_largest_buffer_is_refused_with_what_to_change() {
        let both = [Precision::F16, Precision::F32];
        let (f16, p16) = four_b(&["train.dtype=f16"]);
        let embedding = 151936 * 2560;
        assert_eq!(p16.largest_buffer.0, embedding * 2);
        assert!(p16.largest_buffer.1.contains("model.embed_tokens.weight"));
        assert!(p16.check_buffers(&f16, 1 << 30, "a GPU", &both).is_ok());
        let (f32, p32) = four_b(&["train.dtype=f32"]);
        assert_eq!(p32.largest_buffer.0, embedding * 4);
        let e = p32
            .check_buffers(&f32, 1 << 30, "a GPU", &both)
            .unwrap_err();
        assert!(
            format!("{e}").contains("--set train.dtype=f16 halves it"),
            "{e}"
        );
        // an adapter without a 16-bit float, or one too small for half of it, cannot run it
        let e = p32
            .check_buffers(&f32, 1 << 30, "a GPU", &[Precision::F32])
            .unwrap_err();
        assert!(format!("{e}").contains("--backend cpu"), "{e}");
        let e = p16
            .check_buffers(&f16, 128 << 20, "llvmpipe", &both)
            .unwrap_err();
        assert!(
            format!("{e}").contains("more than the largest buffer llvmpipe allocates (128.00 MiB)"),
            "{e}"
        );
        // without recompute, one layer's scores [8, 32, 2048, 2048] in f32 (4 GiB) come first
        let (taped, pt) = four_b(&[
            "train.dtype=f16",
            "train.recompute=false",
            "train.batch_size=8",
        ]);
        assert_eq!(pt.largest_buffer.0, 8 * 32 * 2048 * 2048 * 4);
        let e = pt
            .check_buffers(&taped, 2 << 30, "a GPU", &both)
            .unwrap_err();
        assert!(format!("{e}").contains("train.batch_size (now 8"), "{e}");
    }

    /// An f16 base keeps each layer's input for the replay in f16, with a scale per token
    /// (`recompute::Keep::Scaled`): 36 layers x 4096 tokens x (2560 x 2 + 4) bytes, where bf16
    /// (f32's range) keeps them in f32. Nothing else in the plan differs but the attention
    /// core's f16 copies of q, k, v and the heads' gradient, for one layer at a time
    /// (`blocked_attention::Products`): 4096 tokens x (2 x 4096 + 2 x 1024) x 2 bytes.
    #[test]
    fn an_f16_base_keeps_its_layer_inputs_in_half_the_bytes() {
        let (_, half) = four_b(&["train.dtype=f16"]);
        let (_, bf16) = four_b(&["train.dtype=bf16"]);
        let per_token = 2560 * 4 - (2560 * 2 + 4);
        let saved = 36 * 2 * 2048 * per_token - 2 * 2048 * (2 * 4096 + 2 * 1024) * 2;
        assert_eq!(
            bf16.activations_recompute - half.activations_recompute,
            saved
        );
        assert_eq!(bf16.weights, half.weights);
        assert_eq!(bf16.total - half.total, saved);
    }

    /// A GPU's LoRA step at the 4B (f16, 2 x 2048 tokens), term by term: each layer's input in
    /// f16 with its scale; the replay's first half for every token (the normed input, q and k
    /// before their norms); the core's f32 q, k, v, heads and their gradients, and f16 copies
    /// of four; the residual stream's three f32 tensors; the second half's tape, 2 x 2048 tokens
    /// in one piece (`recompute::finish_pieces`), in the place of the three blocks of 512 query
    /// rows, the smaller; the head's input and gradient. The end phase counts the device's side
    /// of the save only.
    #[test]
    fn a_gpu_step_holds_the_second_halfs_tape_or_the_scores() {
        let (_, p) = four_b(&["train.dtype=f16"]);
        let (h, qd, kvd, i, tokens): (u64, u64, u64, u64, u64) = (2560, 4096, 1024, 9728, 2 * 2048);
        let want = tokens * 36 * (h * 2 + 4 + 32 * 4)
            + tokens * (h + qd + kvd) * 4
            + tokens * (2 * qd + 2 * kvd) * (4 * 2 + 2)
            + tokens * 3 * h * 4
            + 2 * 2048 * (qd + 2 * h + 5 * i) * 4
            + tokens * h * 4 * 2;
        assert_eq!(p.activations_recompute, want);
        assert!(2 * 2048 * (qd + 2 * h + 5 * i) * 4 > 3 * 2 * 32 * 512 * 2048 * 4);
        // in pieces of 2 x 512 tokens the scores are the larger
        let (_, pieces) = four_b(&["train.dtype=f16", "train.replay_piece_mib=256"]);
        assert_eq!(
            pieces.activations_recompute,
            want - 2 * 2048 * (qd + 2 * h + 5 * i) * 4 + 3 * 2 * 32 * 512 * 2048 * 4
        );
        assert_eq!(
            p.finish,
            h * i * (3 * 4 + 2) + h * i * 2 + p.trainable_state
        );
        assert_eq!(
            p.total,
            RUNTIME + p.weights + p.trainable_state + p.activations_recompute
        );
        // the CPU writes `final/` through host copies: of the embedding, in f32 and in bf16
        let (_, cpu) = four_b(&["train.backend=cpu"]);
        let embed = 151936 * 2560 * (4 + 2);
        assert!(cpu.finish > embed && p.finish < embed);
    }

    /// `[train] replay_piece_mib` sets the second half's pieces the plan counts: at 1024 (the
    /// 4B config's) its 2 x 2048 tokens replay whole (one piece of 2048 tokens a row), at 512 in
    /// 2 pieces of 1024, at 256 in 4 of 512. A piece's tape takes the place of the attention's
    /// three blocks of scores, so the plan moves by what it holds past them: 0.13 GiB for the
    /// whole, nothing for the smaller pieces.
    #[test]
    fn the_replay_piece_setting_moves_the_plan_by_the_tape_past_the_scores() {
        let per_token: u64 = (4096 + 2 * 2560 + 5 * 9728) * 4;
        let scores = 3 * 2 * 32 * 512 * 2048 * 4;
        let peak = |rows: u64| (2 * rows * per_token).max(scores);
        let (_, default) = four_b(&["train.dtype=f16"]);
        assert_eq!(default.replay_pieces, 1);
        for (mib, rows) in [(1024, 2048), (512, 1024), (256, 512)] {
            let set = format!("train.replay_piece_mib={mib}");
            let (_, p) = four_b(&["train.dtype=f16", set.as_str()]);
            assert_eq!(p.replay_pieces as u64, 2048 / rows, "{mib} MiB");
            assert_eq!(p.replay_piece_tape, 2 * rows * per_token, "{mib} MiB");
            assert_eq!(
                p.activations_recompute + peak(2048),
                default.activations_recompute + peak(rows),
                "{mib} MiB"
            );
        }
        assert!(peak(2048) - scores > (1 << 30) / 8);
        // past what a usize of bytes holds: one piece, as at 1024, not an overflow
        let (_, whole) = four_b(&[
            "train.dtype=f16",
            "train.replay_piece_mib=9223372036854775807",
        ]);
        assert_eq!(whole.activations_recompute, default.activations_recompute);
        let bad = RunConfig::parse(
            include_str!("../../configs/qwen3-4b-lora.toml"),
            &["train.replay_piece_mib=0".to_string()],
        );
        assert!(bad.unwrap_err().to_string().contains("replay_piece_mib"));
    }

    /// A GPU that runs out of memory at the 4B is told the replay in 2 pieces (512 MiB each, in
    /// the scores' place) plans less; in pieces already within the scores, or without
    /// recompute, nothing is gained and nothing is said.
    #[test]
    fn smaller_replay_pieces_are_offered_where_they_lower_the_plan() {
        let arch = four_b_arch();
        let (cfg, p) = four_b(&["train.dtype=f16"]);
        let (_, two) = four_b(&["train.dtype=f16", "train.replay_piece_mib=512"]);
        assert_eq!(smaller_replay_pieces(&cfg, &arch), Some((512, two.total)));
        assert!(two.total < p.total);
        let (cfg, _) = four_b(&["train.dtype=f16", "train.replay_piece_mib=512"]);
        assert_eq!(smaller_replay_pieces(&cfg, &arch), None);
        // a setting far past the tape: half the piece
        let (cfg, _) = four_b(&["train.dtype=f16", "train.replay_piece_mib=100000"]);
        let (mib, total) = smaller_replay_pieces(&cfg, &arch).unwrap();
        assert_eq!((mib, total), (452, two.total));
        let (cfg, _) = four_b(&["train.dtype=f16", "train.recompute=false"]);
        assert_eq!(smaller_replay_pieces(&cfg, &arch), None);
    }

    /// On a GPU an evaluation batch (16 rows of 2048 tokens of the 4B) is a phase of its own:
    /// the untaped layer's f32 tensors and three blocks of scores, beside the trainable state.
    /// Where it is what does not fit, the advice lowers `eval.batch_size` too.
    #[test]
    fn a_gpu_plan_counts_the_evaluation_batch() {
        let arch = four_b_arch();
        let (gpu, p) = four_b(&["train.dtype=f16", "eval.batch_size=16"]);
        let scores = 3 * (crate::recompute::SCORE_BLOCK as u64) * 4;
        assert_eq!(p.eval_rows, 16);
        // per token: three hidden-sized and three intermediate-sized f32 tensors, and the f16
        // copies of the two MLP products' inputs
        let per_token = (3 * 2560 + 3 * 9728) * 4 + (2560 + 9728) * 2;
        assert_eq!(p.evaluation, 16 * 2048 * per_token + scores);
        assert_eq!(p.eval_alive, 1);
        assert!(p.evaluation > p.activations_recompute);
        assert_eq!(
            p.total,
            RUNTIME + p.weights + p.trainable_state + p.evaluation
        );
        assert!(
            p.render(&gpu, None)
                .contains("evaluation (16 rows, no tape), instead")
        );
        // at most max_states rows
        let (_, few) = four_b(&["train.dtype=f16", "eval.batch_size=16", "eval.max_states=4"]);
        assert_eq!(few.eval_rows, 4);
        // on the CPU a batch per thread runs side by side, with no blocks of scores; no more
        // batches than `max_states` makes
        let threads = rayon::current_num_threads() as u64;
        let (cpu_cfg, cpu) = four_b(&["train.dtype=bf16", "train.backend=cpu"]);
        assert_eq!(cpu.eval_rows, 4);
        assert_eq!(cpu.eval_alive as u64, threads);
        assert_eq!(cpu.evaluation, threads * 4 * 2048 * per_token);
        let (_, two) = four_b(&["train.backend=cpu", "eval.max_states=5"]);
        assert_eq!(two.eval_alive as u64, threads.min(2));
        if threads > 1 {
            assert!(cpu.render(&cpu_cfg, None).contains(&format!(
                "evaluation ({threads} x 4 rows, no tape), instead"
            )));
        }
        // a device that holds the training steps but not that evaluation: the advice (a tenth
        // of the device left free) keeps the training batch and evaluates as many rows
        assert!(p.total - p.evaluation + p.activations_recompute < p.total - (1 << 20));
        let dev = DeviceMemory {
            bytes: p.total - (1 << 20),
            what: "a test GPU".into(),
            narrowest: Precision::F16,
        };
        let e = p.check(&gpu, &arch, &dev).unwrap_err();
        assert!(
            format!("{e}").contains(
                "--set train.batch_size=2 --set optim.grad_accum=16 --set train.recompute=true \
                 --set train.dtype=f16 --set eval.batch_size=2 ("
            ),
            "{e}"
        );
    }
}
