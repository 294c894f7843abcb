//! The training target and loss of contracts section 2.
//!
//! For one state with answer `a` and (optionally) a teacher vector `t` aligned with the
//! candidates:
//!
//! * target `q`: one-hot on `a`; when the teacher is present **and its arg-max is the answer**,
//!   `q = (1 - λ) · onehot + λ · t` with `λ = teacher_blend`. "Arg-max is the answer" means the
//!   answer's teacher probability is the largest (a tie for first place counts as agreeing);
//!   a teacher that ranks another candidate first is ignored and the target stays one-hot.
//! * loss: `CE(q, p) + β · Σ_i (p_i − onehot_i)²` with `β = brier_weight`. The Brier term is the
//!   multi-class Brier score: the **sum over the offered classes** (not the mean), so it lies in
//!   `[0, 2]`. It is always measured against the one-hot answer, never against the blended target.
//!
//! `p = softmax(option_logits)`; a batch mixes states with different option counts, so the logits
//! of absent options are pushed to `-1e9` before the softmax and their targets are zero.
//!
//! Optionally (`[loss] lm_weight`, off by default) `+ μ · next-token CE` over the prompt's real
//! tokens, for growing a base from scratch.
//!
//! [`state_loss`] is the plain-float reference of the decision loss (used by the tests and by
//! evaluation); [`batch_loss`] is the same computation on tensors, differentiable; and
//! [`training_loss`] assembles every term of a training micro-batch from the model's output.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use crate::model::qwen3::{Batch, Qwen3, in_f32};
use crate::run_config::LossSection;

/// Logit given to an absent option slot in a padded batch: its probability underflows to zero.
pub(crate) const ABSENT_LOGIT: f32 = -1e9;

/// The loss hyper-parameters (`[loss]` in the run config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LossWeights {
    /// `β`: weight of the multi-class Brier term.
    pub brier_weight: f32,
    /// `λ`: share of the teacher in the target when the teacher agrees with the answer.
    pub teacher_blend: f32,
    /// `μ`: weight of the auxiliary next-token term ([`next_token_loss`]; 0 = off).
    pub lm_weight: f32,
}

impl LossWeights {
    /// The weights of the run config's `[loss]` section.
    pub fn new(c: &LossSection) -> Self {
        Self {
            brier_weight: c.brier_weight,
            teacher_blend: c.teacher_blend,
            lm_weight: c.lm_weight,
        }
    }
}

/// The target distribution `q` over the candidates (in the order given).
pub fn target(n: usize, answer: usize, teacher: Option<&[f32]>, teacher_blend: f32) -> Vec<f32> {
    assert!(
        answer < n,
        "answer index {answer} out of range for {n} candidates"
    );
    let mut q = vec![0.0f32; n];
    q[answer] = 1.0;
    if let Some(t) = teacher {
        assert_eq!(
            t.len(),
            n,
            "teacher vector length differs from the candidate count"
        );
        if teacher_blend > 0.0 && decision_data::stats::teacher_agrees(answer, t) {
            for (qi, &ti) in q.iter_mut().zip(t) {
                *qi = (1.0 - teacher_blend) * *qi + teacher_blend * ti;
            }
        }
    }
    q
}

/// Numerically stable softmax of plain logits, in f64.
pub fn softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = logits.iter().map(|&z| (z as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// Multi-class Brier score Σ_i (p_i − onehot_i)², in [0, 2].
pub(crate) fn brier(probs: &[f64], answer: usize) -> f64 {
    probs
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let y = if i == answer { 1.0 } else { 0.0 };
            (p - y) * (p - y)
        })
        .sum()
}

/// Reference loss of one state from its option logits (temperature 1), in f64.
pub(crate) fn state_loss(
    logits: &[f32],
    answer: usize,
    teacher: Option<&[f32]>,
    w: LossWeights,
) -> f64 {
    let p = softmax(logits);
    let q = target(logits.len(), answer, teacher, w.teacher_blend);
    let ce: f64 = q
        .iter()
        .zip(&p)
        .filter(|(qi, _)| **qi > 0.0)
        .map(|(&qi, &pi)| -(qi as f64) * pi.ln())
        .sum();
    ce + w.brier_weight as f64 * brier(&p, answer)
}

/// Mean loss over a batch, differentiable.
///
/// * `logits`: `[batch, options]`, the label-token logits at the answer slot; slots beyond a
///   state's option count may hold anything, `absent` masks them;
/// * `absent`: `[batch, options]`, 0 for an offered option and [`ABSENT_LOGIT`] for a padded slot;
/// * `q`: `[batch, options]`, the targets from [`target`] (zero in padded slots);
/// * `onehot`: `[batch, options]`, 1 at the answer.
///
/// Returns a one-element tensor.
pub(crate) fn batch_loss(
    logits: Tensor<2>,
    absent: Tensor<2>,
    q: Tensor<2>,
    onehot: Tensor<2>,
    brier_weight: f32,
) -> Tensor<1> {
    let log_p = log_softmax(logits + absent, 1);
    let p = log_p.clone().exp();
    let ce = (q * log_p).sum_dim(1).neg();
    let loss = if brier_weight != 0.0 {
        ce + (p - onehot).square().sum_dim(1).mul_scalar(brier_weight)
    } else {
        ce
    };
    loss.mean()
}

/// The optional auxiliary term (`[loss] lm_weight`, off by default): mean next-token
/// cross-entropy over the real tokens of the prompts. `logits` `[b, s-1, vocab]` predict
/// `next` `[b, s-1]`; `mask` `[b, s-1]` is 1 where both the position and its successor are real
/// tokens (left padding is skipped).
pub(crate) fn next_token_loss(
    logits: Tensor<3>,
    next: Tensor<2, Int>,
    mask: Tensor<2>,
) -> Tensor<1> {
    let log_p = log_softmax(logits, 2);
    let picked = log_p.gather(2, next.unsqueeze_dim(2)).squeeze_dim::<2>(2);
    let count = mask.clone().sum().clamp_min(1.0);
    (picked * mask).sum().neg() / count
}

/// Host-side tensors for [`batch_loss`] built from per-state targets.
pub(crate) struct LossTargets {
    pub absent: Vec<f32>,
    pub q: Vec<f32>,
    pub onehot: Vec<f32>,
    pub batch: usize,
    pub options: usize,
}

impl LossTargets {
    /// `states`: for each state its option count, answer index and teacher (already in the
    /// presented candidate order).
    pub fn build(states: &[(usize, usize, Option<Vec<f32>>)], teacher_blend: f32) -> Self {
        let batch = states.len();
        let options = states.iter().map(|s| s.0).max().unwrap_or(0);
        let mut absent = vec![ABSENT_LOGIT; batch * options];
        let mut q = vec![0.0; batch * options];
        let mut onehot = vec![0.0; batch * options];
        for (b, (n, answer, teacher)) in states.iter().enumerate() {
            let row = b * options;
            let t = target(*n, *answer, teacher.as_deref(), teacher_blend);
            for i in 0..*n {
                absent[row + i] = 0.0;
                q[row + i] = t[i];
            }
            onehot[row + answer] = 1.0;
        }
        Self {
            absent,
            q,
            onehot,
            batch,
            options,
        }
    }

    /// Upload as `(absent, q, onehot)` tensors on `device`.
    pub fn tensors(&self, device: &burn::tensor::Device) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
        let shape = [self.batch, self.options];
        let t = |v: &Vec<f32>| Tensor::<2>::from_data(TensorData::new(v.clone(), shape), device);
        (t(&self.absent), t(&self.q), t(&self.onehot))
    }
}

/// One training micro-batch as the loss sees it: the padded prompts, the targets, and the label
/// tokens whose logits are the options' logits.
pub(crate) struct MicroBatch {
    pub batch: Batch,
    pub targets: LossTargets,
    /// The first `options` label tokens (`A`, `B`, …) of the model's decision config.
    pub label_ids: Vec<u32>,
    /// Prompt tokens in the micro-batch (for tokens/s).
    pub tokens: u64,
}

/// The training loss of `mb` from `decoded`, the last decoder layer's output `[b, s, hidden]`
/// (before the final norm): the decision loss ([`batch_loss`]) on the label-token logits at the
/// answer slot (the last position), plus `lm_weight ·` [`next_token_loss`] when that is on. In
/// f32 whatever the model's dtype; a one-element tensor.
pub(crate) fn training_loss(
    model: &Qwen3,
    decoded: Tensor<3>,
    mb: &MicroBatch,
    w: LossWeights,
) -> Tensor<1> {
    let [b, s, h] = decoded.dims();
    let (last, lm) = if w.lm_weight > 0.0 {
        let hidden = model.model.norm.forward(decoded);
        let last = hidden.clone().narrow(1, s - 1, 1).reshape([b, h]);
        (last, Some(lm_term(model, hidden, &mb.batch)))
    } else {
        let last = decoded.narrow(1, s - 1, 1).reshape([b, h]);
        (model.model.norm.forward(last), None)
    };
    let logits = in_f32(model.token_logits(last, &mb.label_ids));
    let (absent, q, onehot) = mb.targets.tensors(&logits.device());
    let loss = batch_loss(logits, absent, q, onehot, w.brier_weight);
    match lm {
        Some(lm) => loss + lm.mul_scalar(w.lm_weight),
        None => loss,
    }
}

/// The next-token term of every real prompt token, from the final-normed hidden states.
fn lm_term(model: &Qwen3, hidden: Tensor<3>, batch: &Batch) -> Tensor<1> {
    let [b, s, _] = hidden.dims();
    let device = hidden.device();
    let logits = in_f32(model.logits(hidden.narrow(1, 0, s - 1)));
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
    next_token_loss(logits, next, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: LossWeights = LossWeights {
        brier_weight: 0.5,
        teacher_blend: 0.5,
        lm_weight: 0.0,
    };
    const LN2: f64 = std::f64::consts::LN_2;

    fn close(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b} (tol {tol})");
    }

    #[test]
    fn no_teacher_two_options() {
        // p = [0.5, 0.5], q = [1, 0]: CE = ln 2; Brier = 0.25 + 0.25 = 0.5; total = ln2 + 0.25.
        close(state_loss(&[0.0, 0.0], 0, None, W), LN2 + 0.25, 1e-9);
    }

    #[test]
    fn teacher_agrees_blends_target() {
        // logits [ln 3, 0] -> p = [0.75, 0.25]; teacher [0.8, 0.2] ranks the answer first, so
        // q = 0.5·[1,0] + 0.5·[0.8,0.2] = [0.9, 0.1].
        // CE = -(0.9 ln 0.75 + 0.1 ln 0.25) = 0.9·0.2876821 + 0.1·1.3862944 = 0.3975433
        // Brier vs one-hot = 0.0625 + 0.0625 = 0.125, × 0.5 = 0.0625 -> 0.4600433
        let l = state_loss(&[3f32.ln(), 0.0], 0, Some(&[0.8, 0.2]), W);
        close(l, 0.460_043_3, 1e-6);
        assert_eq!(target(2, 0, Some(&[0.8, 0.2]), 0.5), vec![0.9, 0.1]);
    }

    #[test]
    fn teacher_disagrees_is_ignored() {
        // Same p; teacher [0.3, 0.7] prefers the wrong option: q stays one-hot.
        // CE = -ln 0.75 = 0.2876821; + 0.5 · 0.125 = 0.3501821
        let l = state_loss(&[3f32.ln(), 0.0], 0, Some(&[0.3, 0.7]), W);
        close(l, 0.350_182_1, 1e-6);
        assert_eq!(target(2, 0, Some(&[0.3, 0.7]), 0.5), vec![1.0, 0.0]);
    }

    #[test]
    fn three_options_answer_last() {
        // logits [0, 0, ln 2] -> p = [0.25, 0.25, 0.5]; answer 2.
        // CE = ln 2 = 0.6931472; Brier = 0.0625 + 0.0625 + 0.25 = 0.375; β = 2 -> 0.75.
        let w = LossWeights {
            brier_weight: 2.0,
            teacher_blend: 0.0,
            lm_weight: 0.0,
        };
        close(
            state_loss(&[0.0, 0.0, 2f32.ln()], 2, None, w),
            LN2 + 0.75,
            1e-6,
        );
    }

    #[test]
    fn brier_range_is_zero_to_two() {
        close(brier(&[1.0, 0.0, 0.0], 0), 0.0, 0.0);
        close(brier(&[0.0, 1.0, 0.0], 0), 2.0, 0.0);
    }

    #[test]
    fn a_teacher_tying_the_answer_for_first_is_blended() {
        assert_eq!(target(3, 1, Some(&[0.4, 0.4, 0.2]), 0.5), [0.2, 0.7, 0.1]);
        assert_eq!(target(3, 2, Some(&[0.4, 0.4, 0.2]), 0.5), [0.0, 0.0, 1.0]);
    }

    fn fixture() -> serde_json::Value {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/train/reference.json"
        );
        serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
    }

    fn floats(v: &serde_json::Value) -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    }

    /// Loss values and logit gradients against torch autograd (scripts/train_reference.py).
    /// Tolerance: 1e-5 absolute + 1e-5 relative (f32 here, f64 in the fixture).
    #[test]
    fn matches_torch_values_and_gradients() {
        let device = burn::tensor::Device::flex().autodiff();
        for case in fixture()["loss"].as_array().unwrap() {
            let logits = floats(&case["logits"]);
            let answer = case["answer"].as_u64().unwrap() as usize;
            let teacher = case["teacher"].as_array().map(|_| floats(&case["teacher"]));
            let w = LossWeights {
                brier_weight: case["brier_weight"].as_f64().unwrap() as f32,
                teacher_blend: case["teacher_blend"].as_f64().unwrap() as f32,
                lm_weight: 0.0,
            };
            let want = case["loss"].as_f64().unwrap();
            let tol = |x: f64| 1e-5 + 1e-5 * x.abs();
            let got = state_loss(&logits, answer, teacher.as_deref(), w);
            assert!(
                (got - want).abs() < tol(want),
                "reference loss {got} vs torch {want}"
            );
            let n = logits.len();
            let t = LossTargets::build(&[(n, answer, teacher.clone())], w.teacher_blend);
            let (absent, q, onehot) = t.tensors(&device);
            let x = Tensor::<2>::from_data(
                burn::tensor::TensorData::new(logits.clone(), [1, n]),
                &device,
            )
            .require_grad();
            let loss = batch_loss(x.clone(), absent, q, onehot, w.brier_weight);
            let got: f32 = loss.clone().into_scalar();
            assert!(
                (got as f64 - want).abs() < tol(want),
                "tensor loss {got} vs torch {want}"
            );
            let grads = loss.backward();
            let g = x
                .grad(&grads)
                .unwrap()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            assert_eq!(g.len(), floats(&case["grad"]).len());
            for (gi, wi) in g.iter().zip(floats(&case["grad"])) {
                assert!(
                    (gi - wi).abs() < 1e-5 + 1e-5 * wi.abs(),
                    "grad {g:?} vs torch {:?}",
                    case["grad"]
                );
            }
        }
    }

    #[test]
    fn batch_loss_matches_reference_with_padding() {
        let device = burn::tensor::Device::flex();
        // state 0: 2 options (third slot padded), teacher agrees; state 1: 3 options, no teacher.
        let logits = [[3f32.ln(), 0.0, 7.0], [0.0, 0.0, 2f32.ln()]];
        let states = vec![(2, 0, Some(vec![0.8, 0.2])), (3, 2, None)];
        let t = LossTargets::build(&states, W.teacher_blend);
        let (absent, q, onehot) = t.tensors(&device);
        let x = Tensor::<2>::from_data(logits, &device);
        let got: f32 = batch_loss(x, absent, q, onehot, W.brier_weight).into_scalar();
        let want = (state_loss(&logits[0][..2], 0, Some(&[0.8, 0.2]), W)
            + state_loss(&logits[1], 2, None, W))
            / 2.0;
        close(got as f64, want, 1e-5);
    }

    /// The auxiliary next-token term against torch's cross_entropy over the unmasked positions
    /// (scripts/train_reference.py), value and logit gradient; padding positions get no gradient.
    /// Tolerance: 1e-5 absolute + 1e-5 relative.
    #[test]
    fn next_token_loss_matches_torch() {
        use burn::tensor::{Int, TensorData};
        let device = burn::tensor::Device::flex().autodiff();
        let case = &fixture()["next_token"];
        let logits = floats(&case["logits"]);
        let next: Vec<i64> = case["next"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        let mask = floats(&case["mask"]);
        let x = Tensor::<3>::from_data(TensorData::new(logits, [2, 4, 6]), &device).require_grad();
        let loss = next_token_loss(
            x.clone(),
            Tensor::<2, Int>::from_data(TensorData::new(next, [2, 4]), &device),
            Tensor::<2>::from_data(TensorData::new(mask.clone(), [2, 4]), &device),
        );
        let got: f32 = loss.clone().into_scalar();
        close(got as f64, case["loss"].as_f64().unwrap(), 1e-5);
        let g = x
            .grad(&loss.backward())
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(g.len(), floats(&case["grad"]).len());
        for (i, (gi, wi)) in g.iter().zip(floats(&case["grad"])).enumerate() {
            assert!(
                (gi - wi).abs() < 1e-5 + 1e-5 * wi.abs(),
                "grad[{i}] {gi} vs torch {wi}"
            );
            if mask[i / 6] == 0.0 {
                assert_eq!(*gi, 0.0, "a padding position must get no gradient");
            }
        }
    }
}
