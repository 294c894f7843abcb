//! One training micro-batch's forward and backward passes: the states encoded into a padded
//! batch, the loss (`loss::training_loss`), and the gradients, with
//! the micro-batch split into `[train] shards` that run side by side, `[train] recompute`'s
//! layer recomputation, the dynamic loss scale and, on an f16 base, the products' overflow
//! flags (`crate::model::f16_safety`).

use anyhow::Result;
use burn::module::Module;
use burn::optim::GradientsParams;
use decision_data::State;

use crate::loss::{LossTargets, LossWeights, MicroBatch, training_loss};
use crate::model::decision_model::DecisionModel;
use crate::model::f16_safety::ProductChecks;
use crate::model::qwen3::{Batch, Qwen3};
use crate::run_config::RunConfig;

/// What one shard of a micro-batch contributes: its gradients (multiplied by the loss scale),
/// its share of the loss (not), its tokens, and the f16 products that overflowed in its forward
/// pass (their checkpoint paths; then the gradients are not to be used).
pub(crate) struct ShardOut {
    pub grads: GradientsParams,
    pub loss: f32,
    pub tokens: u64,
    pub overflowed: Vec<String>,
}

/// How [`passes`] runs a micro-batch: what it takes of the run config, and the step's state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassPlan {
    pub shards: usize,
    pub grad_accum: usize,
    pub recompute: bool,
    /// With recompute, whether the replay by hand reuses each layer's attention from the first
    /// pass (the memory plan's choice, [`crate::plan::MemoryPlan::fitted`]).
    pub keep_attention: bool,
    /// With recompute through the tape, at most about this many bytes of a layer's second
    /// half's tape at a time (`[train] replay_piece_mib`).
    pub finish_bytes: usize,
    pub weights: LossWeights,
    /// Multiplies the loss before the backward pass (1 without dynamic loss scaling).
    pub loss_scale: f32,
    /// Flag the forward pass's f16 products on the device (an f16 base).
    pub check_products: bool,
}

impl PassPlan {
    pub fn new(cfg: &RunConfig, weights: LossWeights) -> Self {
        Self {
            shards: cfg.train.shards,
            grad_accum: cfg.optim.grad_accum,
            recompute: cfg.train.recompute,
            keep_attention: true,
            finish_bytes: cfg.train.replay_piece_bytes(),
            weights,
            loss_scale: 1.0,
            check_products: false,
        }
    }
}

/// Forward and backward over the micro-batch `states`, in shards on Burn's rayon pool (so that
/// the kernels' own parallel loops nest under the shards instead of competing with them). Each
/// shard's loss carries its share of the batch over the accumulation steps, so the summed
/// gradients are those of the whole micro-batch's contribution to the step.
pub(crate) fn passes(
    model: &Qwen3,
    dm: &DecisionModel,
    states: &[State],
    plan: PassPlan,
) -> Vec<Result<ShardOut>> {
    let n_shards = plan.shards.min(states.len()).max(1);
    let per = states.len().div_ceil(n_shards);
    let pieces: Vec<&[State]> = states.chunks(per).collect();
    let run_shard = |piece: &[State]| {
        let share = piece.len() as f32 / states.len() as f32;
        let scale = share / plan.grad_accum as f32;
        if n_shards == 1 {
            shard_pass(model, dm, piece, plan, scale)
        } else {
            let own = fresh_leaves(model);
            shard_pass(&own, dm, piece, plan, scale)
        }
    };
    if pieces.len() == 1 {
        vec![run_shard(pieces[0])]
    } else {
        use rayon::prelude::*;
        pieces.par_iter().map(|piece| run_shard(piece)).collect()
    }
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
        batch: Batch::left_padded_on(&refs, dm.pad_id, &dm.device),
        targets: LossTargets::build(&tgt, teacher_blend),
        label_ids: dm.prompter.label_token_ids[..kmax].to_vec(),
        tokens,
    })
}

/// The model with every trainable parameter re-rooted as a new autodiff leaf (same values and
/// parameter ids, so its gradients accumulate onto the original's). Shards on parallel threads
/// must not share a tracked node: Burn merges autodiff graphs that do, serialising their backward
/// passes, and a merge racing a backward pass can deadlock on Burn's two graph locks.
fn fresh_leaves(model: &Qwen3) -> Qwen3 {
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

/// Forward and backward over one shard of a micro-batch; the loss ([`training_loss`]) is
/// multiplied by `share` (the shard's share of the batch over the accumulation steps) and the
/// loss scale before the backward pass.
fn shard_pass(
    model: &Qwen3,
    dm: &DecisionModel,
    states: &[State],
    plan: PassPlan,
    share: f32,
) -> Result<ShardOut> {
    let mb = micro_batch(dm, states, plan.weights.teacher_blend)?;
    let scale = share * plan.loss_scale;
    let checks = plan.check_products.then(ProductChecks::new);
    let head = |decoded| training_loss(model, decoded, &mb, plan.weights).mul_scalar(scale);
    let (value, grads) = if plan.recompute {
        crate::recompute::loss_and_grads(
            model,
            &mb.batch,
            head,
            checks.as_ref(),
            plan.keep_attention,
            plan.finish_bytes,
        )
    } else {
        let loss = head(model.decode_checked(&mb.batch, checks.as_ref()));
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
        loss: value / plan.loss_scale,
        tokens: mb.tokens,
        overflowed: checks.map(|c| c.overflowed()).unwrap_or_default(),
    })
}
