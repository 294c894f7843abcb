//! Option scoring: left-padded batches, the label-token logits at the answer slot, divided by
//! the state's temperature, softmax over the state's own candidates.

use anyhow::{Result, bail};
use burn::tensor::DType;

use crate::model::qwen3::{Batch, Qwen3};
use decision_prompt::Encoded;

/// One state's result. `probs` and `logits` are aligned with the state's candidates.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    pub probs: Vec<f64>,
    /// Label logits divided by the temperature.
    pub logits: Vec<f64>,
    pub pick_index: usize,
    pub confidence: f64,
    pub temperature: f64,
}

pub use decision_prompt::score::softmax_t;

/// The raw (untempered) label logits of each state, in one forward pass over a left-padded batch.
pub fn label_logits(model: &Qwen3, states: &[&Encoded], pad_id: u32) -> Vec<Vec<f64>> {
    if states.is_empty() {
        return Vec::new();
    }
    // The union of the label tokens in this batch; each state reads its own columns.
    let mut union: Vec<u32> = Vec::new();
    for e in states {
        for &t in &e.option_token_ids {
            if !union.contains(&t) {
                union.push(t);
            }
        }
    }
    let rows: Vec<&[u32]> = states.iter().map(|e| e.input_ids.as_slice()).collect();
    let batch = Batch::left_padded_on(&rows, pad_id, &model.device());
    let logits = model.answer_logits(&batch, &union);
    let data = logits.into_data().convert_dtype(DType::F32);
    let flat: Vec<f32> = data.try_into_vec().expect("f32 logits");
    let width = union.len();
    states
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let row = &flat[i * width..(i + 1) * width];
            e.option_token_ids
                .iter()
                .map(|t| row[union.iter().position(|u| u == t).expect("in union")] as f64)
                .collect()
        })
        .collect()
}

/// Turn raw label logits into [`Scores`] with temperature `t`.
pub(crate) fn scores_from_logits(raw: &[f64], t: f64) -> Scores {
    let (probs, logits) = softmax_t(raw, t);
    let (pick_index, confidence) =
        probs
            .iter()
            .cloned()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (i, p)| {
                if p > best.1 { (i, p) } else { best }
            });
    Scores {
        probs,
        logits,
        pick_index,
        confidence,
        temperature: t,
    }
}

/// Refuse label logits that are not all finite. A model whose weights are finite can still
/// overflow on the way (activations past f16's 65504, or past f32's range): its NaN or infinite
/// logits have a NaN softmax, which JSON writes as `confidence: null` beside a pick, and shadow
/// receipts that `decision fit` rejects. `name(i)` says which state row `i` is (its id and where
/// it was read), for the message; the error also counts the rows affected.
pub fn check_finite(logits: &[Vec<f64>], name: &dyn Fn(usize) -> String) -> Result<()> {
    let mut bad = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.iter().any(|x| !x.is_finite()))
        .map(|(i, _)| i);
    let Some(first) = bad.next() else {
        return Ok(());
    };
    let count = 1 + bad.count();
    bail!(
        "the model produced non-finite logits (NaN or infinity) for {}: {:?}; {count} of {} \
         states are affected. Its weights are finite (checked at load), so its activations \
         overflow: weights too large for the compute dtype (f16 ends at 65504) or a diverged \
         training run. Refusing to write picks without a confidence",
        name(first),
        logits[first],
        logits.len()
    )
}

/// Order in which to batch states: by prompt length, so a batch wastes little on padding.
/// Results do not depend on it (each row is independent of the rest of its batch).
pub(crate) fn length_order(encoded: &[Encoded]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..encoded.len()).collect();
    order.sort_by_key(|&i| (encoded[i].input_ids.len(), i));
    order
}

/// Without a memory plan (`decision score`, `decision eval`), how many batches of `batch_size`
/// run side by side: one per thread, or as many as the host memory still `free` holds
/// (`crate::plan::eval_batch_bytes` of the longest prompt, the model's widths and dtype), said
/// on stderr where that is fewer. At the 4B a batch of 32 rows of 1000 tokens holds 5.5 GB, so
/// one per thread on 16 cores would need 88 GB.
fn batches_that_fit(
    model: &Qwen3,
    encoded: &[Encoded],
    batch_size: usize,
    threads: usize,
    free: Option<(u64, String)>,
) -> usize {
    let (Some(layer), Some((free, what))) = (model.model.layers.first(), free) else {
        return threads;
    };
    let hidden = model.model.embed_tokens.weight.dims()[1] as u64;
    let intermediate = layer.mlp.gate_proj.dims()[1] as u64;
    let width = model.dtype().size() as u64;
    let longest = encoded.iter().map(|e| e.input_ids.len()).max().unwrap_or(0);
    let rows = batch_size.max(1).min(encoded.len()).max(1);
    let batch = crate::plan::eval_batch_bytes(hidden, intermediate, width, (rows * longest) as u64);
    let n = crate::plan::batches_that_fit(batch, free, threads);
    if n < threads {
        let batches = if n == 1 { "batch" } else { "batches" };
        eprintln!(
            "[score] {n} {batches} of {rows} rows side by side, not {threads}: each holds up to {} \
             and {what} is {}{}",
            crate::plan::gib(batch),
            crate::plan::gib(free),
            if batch > free {
                "; a smaller --batch-size would fit"
            } else {
                ""
            }
        );
    }
    n
}

/// On a GPU, where batches go one at a time, the rows a batch takes: `batch_size`, or as many as
/// the device's memory beside what the runtime holds already (`crate::plan::gpu_rows_that_fit`;
/// `DECISION_DEVICE_MEMORY` stands for the device's memory where set), said on stderr where that
/// is fewer. The logits are the same whatever the rows.
fn gpu_rows_that_fit(model: &Qwen3, encoded: &[Encoded], batch_size: usize) -> usize {
    let device = model.device();
    let (Some(layer), Some(held), Some(largest)) = (
        model.model.layers.first(),
        crate::model::backend::gpu_memory(&device),
        crate::model::backend::largest_buffer(&device),
    ) else {
        return batch_size;
    };
    // A device that does not report its memory still has a largest buffer.
    let limit = crate::plan::device_limit(crate::Backend::Wgpu, &device)
        .ok()
        .flatten();
    let free = limit
        .as_ref()
        .map_or(u64::MAX, |l| l.bytes.saturating_sub(held.reserved));
    let longest = encoded.iter().map(|e| e.input_ids.len()).max().unwrap_or(0);
    let longest = crate::model::qwen3::run_length(longest, true) as u64;
    let (hidden, intermediate) = (
        model.model.embed_tokens.weight.dims()[1] as u64,
        layer.mlp.gate_proj.dims()[1] as u64,
    );
    let rows = crate::plan::gpu_rows_that_fit(
        hidden,
        intermediate,
        layer.self_attn.num_heads as u64,
        model.dtype().size() as u64,
        longest,
        batch_size,
        free,
        largest,
        crate::model::qwen3::score_budget(&device) as u64,
    );
    if rows < batch_size.min(encoded.len()) {
        let of = if rows == 1 {
            "1 row".to_string()
        } else {
            format!("{rows} rows")
        };
        let room = match &limit {
            Some(l) => format!(
                "{} ({}) has {} free beside the {} the runtime holds",
                l.what,
                crate::plan::gib(l.bytes),
                crate::plan::gib(free),
                crate::plan::gib(held.reserved)
            ),
            None => format!(
                "the adapter's buffers hold at most {}",
                crate::plan::gib(largest)
            ),
        };
        eprintln!(
            "[score] batches of {of}, not {batch_size}: the prompts run to {longest} tokens, and \
             {room}"
        );
    }
    rows
}

/// The raw label logits of every state, in input order: batches of `batch_size` states of
/// similar length; `progress` is told how many states each finished round of batches held.
///
/// On the CPU one forward pass keeps about one core busy on small shapes, so a round runs as
/// many batches side by side as the thread pool has threads, or `side_by_side` where the memory
/// plan fits fewer, or (`None`: no plan) as many as the free memory holds. On a GPU batches go one
/// after another, and without a plan each takes no more rows than the free memory holds. Each
/// row's logits do not depend on its batch, so the result is the same.
pub(crate) fn logits_in_batches(
    model: &Qwen3,
    encoded: &[Encoded],
    pad_id: u32,
    batch_size: usize,
    side_by_side: Option<usize>,
    progress: &mut dyn FnMut(usize),
) -> Vec<Vec<f64>> {
    use rayon::prelude::*;
    let order = length_order(encoded);
    let parallel = model.device() == burn::tensor::Device::flex();
    // A memory plan (`side_by_side`) has sized the batches already.
    let batch_size = if parallel || side_by_side.is_some() {
        batch_size.max(1)
    } else {
        gpu_rows_that_fit(model, encoded, batch_size.max(1))
    };
    let chunks: Vec<&[usize]> = order.chunks(batch_size).collect();
    let threads = rayon::current_num_threads().max(1);
    let round = match (parallel, side_by_side) {
        (false, _) => 1,
        (true, Some(n)) => threads.min(n).max(1),
        (true, None) => batches_that_fit(
            model,
            encoded,
            batch_size,
            threads,
            crate::plan::host_memory_free(),
        ),
    };
    let score = |chunk: &&[usize]| {
        let batch: Vec<&Encoded> = chunk.iter().map(|&i| &encoded[i]).collect();
        label_logits(model, &batch, pad_id)
    };
    let mut out: Vec<Vec<f64>> = vec![Vec::new(); encoded.len()];
    for group in chunks.chunks(round) {
        #[cfg(test)]
        tests::SIDE_BY_SIDE.with(|s| s.borrow_mut().push(group.len()));
        let results: Vec<Vec<Vec<f64>>> = if parallel {
            group.par_iter().map(score).collect()
        } else {
            group.iter().map(score).collect()
        };
        for (chunk, rows) in group.iter().zip(results) {
            for (&i, l) in chunk.iter().zip(rows) {
                out[i] = l;
            }
        }
        progress(group.iter().map(|c| c.len()).sum());
        // Each thread allocates from an arena of its own, and keeps what it frees there: a next
        // round that runs on other threads than the last would hold its memory on top of what
        // the last round freed. Where memory is what limits the round, it goes back first.
        if parallel && round < threads {
            crate::model::host_memory::release_freed();
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// The batches of each round, as `logits_in_batches` ran them on this thread: how a
        /// caller's test sees how many ran side by side.
        pub(crate) static SIDE_BY_SIDE: std::cell::RefCell<Vec<usize>> = const {
            std::cell::RefCell::new(Vec::new())
        };
    }

    /// A tiny random model, and 8 states of 5 to 7 prompt tokens and 3 options.
    fn tiny_model_and_eight_states() -> (Qwen3, Vec<Encoded>) {
        let device = burn::tensor::Device::flex();
        let model =
            crate::model::qwen3::init_random(&crate::trainer_tests::tiny_config(32), 0.2, &device);
        let encoded = (0..8u32)
            .map(|i| Encoded {
                input_ids: (0..5 + i % 3).map(|t| (t * 7 + i) % 30 + 2).collect(),
                option_token_ids: vec![20, 21, 22],
                truncated: false,
                dropped_context_bytes: 0,
            })
            .collect();
        (model, encoded)
    }

    /// A round holds one batch per thread, or `side_by_side`: `progress` hears each round's
    /// states; the logits are the same either way.
    #[test]
    fn batches_run_side_by_side_one_per_thread_or_as_many_as_fit() {
        let (model, encoded) = tiny_model_and_eight_states();
        let four = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let run = |side_by_side: Option<usize>| {
            four.install(|| {
                let mut rounds = Vec::new();
                let logits = logits_in_batches(&model, &encoded, 0, 2, side_by_side, &mut |n| {
                    rounds.push(n)
                });
                (rounds, logits)
            })
        };
        let (all, logits) = run(None);
        assert_eq!(all, [8], "four batches of two, one per thread");
        for (cap, rounds) in [(1, vec![2, 2, 2, 2]), (3, vec![6, 2]), (9, vec![8])] {
            let (r, l) = run(Some(cap));
            assert_eq!(r, rounds, "at most {cap} side by side");
            for (a, b) in l.iter().flatten().zip(logits.iter().flatten()) {
                assert!((a - b).abs() < 1e-5, "{a} {b}");
            }
        }
    }

    /// Without a plan, as many batches side by side as the free memory holds: a batch here is
    /// 2 rows of the longest prompt (7 tokens) at the tiny model's widths (16, 24) in f32, 6 720
    /// bytes (`plan::eval_batch_bytes`, whose per-token count docs/results.md measured).
    #[test]
    fn without_a_plan_batches_run_side_by_side_as_the_free_memory_holds() {
        let (model, encoded) = tiny_model_and_eight_states();
        let batch = 2 * 7 * (3 * 16 + 3 * 24) * 4;
        let fit = |free: Option<u64>| {
            batches_that_fit(&model, &encoded, 2, 4, free.map(|f| (f, "a test".into())))
        };
        assert_eq!(fit(None), 4, "memory unknown: one per thread");
        assert_eq!(fit(Some(100 * batch)), 4, "no more than one per thread");
        assert_eq!(fit(Some(3 * batch - 1)), 2);
        assert_eq!(fit(Some(3 * batch)), 3);
        assert_eq!(fit(Some(0)), 1, "one batch runs whatever the memory");
    }

    #[test]
    fn softmax_with_temperature() {
        let (p, l) = softmax_t(&[2.0, 0.0], 2.0);
        assert_eq!(l, vec![1.0, 0.0]);
        let e = 1f64.exp();
        assert!((p[0] - e / (e + 1.0)).abs() < 1e-12);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let s = scores_from_logits(&[0.0, 3.0, 1.0], 1.0);
        assert_eq!(s.pick_index, 1);
        assert_eq!(s.confidence, s.probs[1]);
        // Huge logits do not overflow.
        let (p, _) = softmax_t(&[1000.0, 999.0], 1.0);
        assert!(p.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn non_finite_logits_are_refused_naming_the_first_state() {
        let name = |i: usize| format!("state \"s{i}\"");
        check_finite(&[vec![1.0, -3.0], vec![1e300, -1e300]], &name).unwrap();
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let rows = vec![vec![0.0, 1.0], vec![2.0, bad], vec![bad, bad]];
            let e = format!("{:#}", check_finite(&rows, &name).unwrap_err());
            assert!(e.contains("non-finite logits"), "{e}");
            assert!(
                e.contains("state \"s1\"") && e.contains("2 of 3 states"),
                "{e}"
            );
        }
    }
}
