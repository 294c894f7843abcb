//! Optimisation: AdamW with PyTorch's update rule and defaults set explicitly, the learning-rate
//! schedule (linear warmup then cosine decay), and clipping by the global gradient norm.
//!
//! Burn's own `AdamWConfig` defaults to eps 1e-5 and weight decay 1e-4, keys its state by
//! parameter id (which changes when a model is loaded again) and clips per parameter. This
//! optimizer instead:
//! * keeps its moments keyed by the parameter's module path (`layers.0.self_attn.q_proj.weight`),
//!   so a checkpoint restores them onto a freshly loaded model;
//! * applies weight decay only to parameters of rank ≥ 2 (matrices and embeddings), never to
//!   norm weights or biases (rank 1);
//! * updates only parameters that received a gradient: a frozen LoRA base has no gradient and
//!   therefore no optimizer state at all;
//! * clips all gradients together by their global L2 norm, as `torch.nn.utils.clip_grad_norm_`.
//!
//! The update is PyTorch's `AdamW`: `p ← p·(1 − lr·wd) − lr · m̂ / (√v̂ + eps)` with bias-corrected
//! moments `m̂ = m / (1 − β1^t)`, `v̂ = v / (1 − β2^t)`.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

use crate::model::reduce;

/// AdamW hyper-parameters (from `[optim]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AdamWSettings {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// The learning-rate schedule: linear warmup from 0 to `peak` over `warmup` steps, then cosine
/// decay to `peak · min_ratio` at `total`. Same formula as `transformers`'
/// `get_cosine_schedule_with_warmup` (which has `min_ratio = 0`): the multiplier at optimizer
/// step `s` (0-based) is `s / warmup` during warmup, then
/// `min_ratio + (1 − min_ratio) · ½(1 + cos(π · (s − warmup) / (total − warmup)))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Schedule {
    pub peak: f64,
    pub warmup: u64,
    pub total: u64,
    pub min_ratio: f64,
}

impl Schedule {
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * step as f64 / self.warmup.max(1) as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.peak * (self.min_ratio + (1.0 - self.min_ratio) * cosine)
    }
}

/// The first and second moments of parameters updated together (a chunk of [`Gradients`]), laid
/// end to end in the chunk's order; `members` names each parameter by path, with its length.
#[derive(Clone)]
pub(crate) struct Moments {
    members: Vec<(String, usize)>,
    exp_avg: Tensor<1>,
    exp_avg_sq: Tensor<1>,
}

impl Moments {
    /// Each member's moments on their own (slices of these).
    fn split(self) -> Vec<Moments> {
        if self.members.len() == 1 {
            return vec![self];
        }
        let lens: Vec<usize> = self.members.iter().map(|(_, len)| *len).collect();
        let (m, v) = (
            pieces(&self.exp_avg, &lens),
            pieces(&self.exp_avg_sq, &lens),
        );
        self.members
            .into_iter()
            .zip(m.into_iter().zip(v))
            .map(|(member, (exp_avg, exp_avg_sq))| Moments {
                members: vec![member],
                exp_avg,
                exp_avg_sq,
            })
            .collect()
    }

    fn holds(&self, paths: &[&str]) -> bool {
        self.members
            .iter()
            .any(|(p, _)| paths.contains(&p.as_str()))
    }
}

/// The AdamW optimizer state: step count and moments by parameter path.
#[derive(Clone)]
pub(crate) struct AdamW {
    pub settings: AdamWSettings,
    /// Number of updates applied so far (`t` in the bias correction).
    pub step: u64,
    /// By chunk of parameters updated together, in no order.
    moments: Vec<Moments>,
}

impl AdamW {
    pub fn new(settings: AdamWSettings) -> Self {
        Self {
            settings,
            step: 0,
            moments: Vec::new(),
        }
    }

    /// The paths of the parameters that have moments, sorted.
    #[cfg(test)]
    pub fn paths(&self) -> Vec<&str> {
        let mut paths: Vec<&str> = self
            .moments
            .iter()
            .flat_map(|m| m.members.iter().map(|(p, _)| p.as_str()))
            .collect();
        paths.sort_unstable();
        paths
    }

    /// Apply one update with learning rate `lr` to every parameter `grads` holds a gradient for,
    /// scaling each gradient by `grad_scale` first (the clipping factor from [`clip_factor`]).
    /// Returns the updated module.
    ///
    /// A chunk of [`Gradients`] is updated as one tensor: its parameters laid end to end (a
    /// concatenation), its moments (kept laid out as the chunk is), and the update's arithmetic,
    /// all element by element as PyTorch's, so the result is the same to the bit whatever the
    /// chunks. The updated parameters are slices of the chunk's result (views on a GPU, where a
    /// parameter's bytes start at the device's alignment). On a GPU that is two launches a chunk
    /// where a tensor at a time took one a tensor. A chunk is updated when the module's walk
    /// reaches its first parameter, so that beside the parameters only one chunk's old values
    /// are alive, as a tensor at a time kept one tensor's.
    pub fn update<M: Module>(
        &mut self,
        module: M,
        grads: Gradients,
        lr: f64,
        grad_scale: f64,
    ) -> M {
        self.step += 1;
        let chunk_of: HashMap<ParamId, usize> = grads
            .chunks
            .iter()
            .enumerate()
            .flat_map(|(i, c)| c.members.iter().map(move |m| (m.id, i)))
            .collect();
        let mut values = Values {
            wanted: &chunk_of,
            found: HashMap::new(),
        };
        module.visit(&mut values);
        let values = values.found;
        module.map(&mut Step {
            opt: self,
            chunks: grads.chunks.into_iter().map(Some).collect(),
            chunk_of,
            values,
            updated: HashMap::new(),
            lr,
            grad_scale,
        })
    }

    /// Update `chunk` from its parameters' `values`: the updated values by parameter, and the
    /// moments kept.
    fn update_chunk(
        &mut self,
        chunk: Chunk,
        values: &mut HashMap<ParamId, Tensor<1>>,
        lr: f64,
        grad_scale: f64,
    ) -> Vec<(ParamId, Tensor<1>)> {
        let s = self.settings;
        let t = self.step as i32;
        let bc1 = 1.0 - s.beta1.powi(t);
        let bc2 = 1.0 - s.beta2.powi(t);
        let p = laid_end_to_end(
            chunk
                .members
                .iter()
                .map(|m| values.remove(&m.id).expect("a gradient's parameter"))
                .collect(),
        );
        let mut g = chunk.flat;
        if grad_scale != 1.0 {
            g = g.mul_scalar(grad_scale);
        }
        let (exp_avg, exp_avg_sq) = match self.take_moments(&chunk.members, &g) {
            Some((m, v)) => (
                m.mul_scalar(s.beta1) + g.clone().mul_scalar(1.0 - s.beta1),
                v.mul_scalar(s.beta2) + g.square().mul_scalar(1.0 - s.beta2),
            ),
            None => (
                g.clone().mul_scalar(1.0 - s.beta1),
                g.square().mul_scalar(1.0 - s.beta2),
            ),
        };
        let denom = exp_avg_sq.clone().div_scalar(bc2).sqrt().add_scalar(s.eps);
        let step = exp_avg.clone().div_scalar(bc1).div(denom).mul_scalar(lr);
        let decayed = if chunk.decays && s.weight_decay != 0.0 {
            p.mul_scalar(1.0 - lr * s.weight_decay)
        } else {
            p
        };
        let lens: Vec<usize> = chunk.members.iter().map(|m| m.len).collect();
        let updated = chunk
            .members
            .iter()
            .map(|m| m.id)
            .zip(pieces(&(decayed - step), &lens))
            .collect();
        self.moments.push(Moments {
            members: chunk.members.into_iter().map(|m| (m.path, m.len)).collect(),
            exp_avg,
            exp_avg_sq,
        });
        updated
    }

    /// The moments of `members`, laid end to end in their order: the chunk stored as it is
    /// where the last update had the same members, else gathered from the chunks that hold them
    /// (after a resume, which restores moments a parameter at a time, or where the chunks
    /// changed), zeros for a member without any. `None` where no member has moments yet (the
    /// first update). `g`: the chunk's gradients, for the zeros' dtype and device.
    fn take_moments(
        &mut self,
        members: &[Member],
        g: &Tensor<1>,
    ) -> Option<(Tensor<1>, Tensor<1>)> {
        let same = |m: &Moments| {
            m.members
                .iter()
                .map(|(p, _)| p.as_str())
                .eq(members.iter().map(|m| m.path.as_str()))
        };
        if let Some(i) = self.moments.iter().position(same) {
            let m = self.moments.swap_remove(i);
            return Some((m.exp_avg, m.exp_avg_sq));
        }
        let paths: Vec<&str> = members.iter().map(|m| m.path.as_str()).collect();
        let (holding, others): (Vec<Moments>, Vec<Moments>) = std::mem::take(&mut self.moments)
            .into_iter()
            .partition(|m| m.holds(&paths));
        self.moments = others;
        if holding.is_empty() {
            return None;
        }
        let mut own = HashMap::new();
        for part in holding.into_iter().flat_map(Moments::split) {
            if part.holds(&paths) {
                own.insert(part.members[0].0.clone(), (part.exp_avg, part.exp_avg_sq));
            } else {
                self.moments.push(part);
            }
        }
        let mut at = 0;
        let (m, v): (Vec<Tensor<1>>, Vec<Tensor<1>>) = members
            .iter()
            .map(|member| {
                let found = own.remove(&member.path).unwrap_or_else(|| {
                    let zeros = g.clone().narrow(0, at, member.len).zeros_like();
                    (zeros.clone(), zeros)
                });
                at += member.len;
                found
            })
            .unzip();
        Some((laid_end_to_end(m), laid_end_to_end(v)))
    }

    /// Moments as named host tensors (`<path>.exp_avg`, `<path>.exp_avg_sq`), all at once.
    #[cfg(test)]
    pub fn export(&self) -> std::collections::BTreeMap<String, Vec<f32>> {
        self.named_moments()
            .map(|(name, t)| (name, to_vec(&t)))
            .collect()
    }

    /// Names (`<path>.exp_avg`, `<path>.exp_avg_sq`) and shapes of the moments, in the order
    /// [`AdamW::moment_tensors`] yields them.
    pub fn moment_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.named_moments()
            .map(|(name, t)| (name, t.dims().to_vec()))
            .collect()
    }

    /// The moments as named host tensors, each read from the device when the iterator reaches
    /// it (for checkpoints, without a host copy of them all).
    pub fn moment_tensors(&self) -> impl Iterator<Item = crate::model::weights::HfTensor> + '_ {
        self.named_moments()
            .map(|(name, t)| crate::model::weights::HfTensor {
                name,
                shape: t.dims().to_vec(),
                data: to_vec(&t),
            })
    }

    /// Every parameter's two moments, by path in order (a member's slice of its chunk's).
    fn named_moments(&self) -> impl Iterator<Item = (String, Tensor<1>)> + '_ {
        let mut parts: Vec<Moments> = self
            .moments
            .iter()
            .cloned()
            .flat_map(Moments::split)
            .collect();
        parts.sort_unstable_by(|a, b| a.members[0].0.cmp(&b.members[0].0));
        parts.into_iter().flat_map(|m| {
            let path = &m.members[0].0;
            [
                (format!("{path}.exp_avg"), m.exp_avg),
                (format!("{path}.exp_avg_sq"), m.exp_avg_sq),
            ]
        })
    }

    /// Restore moments written by [`AdamW::export`] or [`AdamW::moment_tensors`], each moved to
    /// the device as it arrives (a parameter at a time; the next update lays them out in its
    /// chunks).
    pub fn import(
        settings: AdamWSettings,
        step: u64,
        tensors: impl IntoIterator<Item = anyhow::Result<(String, Vec<f32>)>>,
        device: &burn::tensor::Device,
    ) -> anyhow::Result<Self> {
        let mut moments: HashMap<String, (Option<Tensor<1>>, Option<Tensor<1>>)> = HashMap::new();
        for item in tensors {
            let (name, data) = item?;
            let n = data.len();
            let t = Tensor::<1>::from_data(burn::tensor::TensorData::new(data, [n]), device);
            if let Some(p) = name.strip_suffix(".exp_avg_sq") {
                moments.entry(p.to_string()).or_default().1 = Some(t);
            } else if let Some(p) = name.strip_suffix(".exp_avg") {
                moments.entry(p.to_string()).or_default().0 = Some(t);
            } else {
                anyhow::bail!("optimizer state: unexpected tensor `{name}`");
            }
        }
        let mut out = Vec::new();
        for (path, (m, v)) in moments {
            match (m, v) {
                (Some(exp_avg), Some(exp_avg_sq)) if exp_avg.dims() == exp_avg_sq.dims() => {
                    let len = exp_avg.dims()[0];
                    out.push(Moments {
                        members: vec![(path, len)],
                        exp_avg,
                        exp_avg_sq,
                    });
                }
                (Some(_), Some(_)) => {
                    anyhow::bail!("optimizer state: the two moments of `{path}` differ in length")
                }
                _ => anyhow::bail!("optimizer state: `{path}` lacks one of its two moments"),
            }
        }
        Ok(Self {
            settings,
            step,
            moments: out,
        })
    }
}

fn to_vec(t: &Tensor<1>) -> Vec<f32> {
    t.to_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 tensor data")
}

/// `t` cut into consecutive pieces of `lens` elements: `t` itself where there is one piece, else
/// slices of it (views on a GPU where a piece's bytes start at the device's alignment).
fn pieces(t: &Tensor<1>, lens: &[usize]) -> Vec<Tensor<1>> {
    if lens.len() == 1 {
        return vec![t.clone()];
    }
    let mut at = 0;
    lens.iter()
        .map(|&len| {
            at += len;
            t.clone().narrow(0, at - len, len)
        })
        .collect()
}

/// `parts` as one tensor: the part itself where there is one, else their concatenation.
fn laid_end_to_end(parts: Vec<Tensor<1>>) -> Tensor<1> {
    if parts.len() == 1 {
        parts.into_iter().next().expect("one part")
    } else {
        Tensor::cat(parts, 0)
    }
}

/// The flat values of the parameters `wanted` names, without the autodiff graph.
struct Values<'a> {
    wanted: &'a HashMap<ParamId, usize>,
    found: HashMap<ParamId, Tensor<1>>,
}

impl ModuleVisitor for Values<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.wanted.contains_key(&param.id) {
            let v = param.val().inner();
            let n = v.shape().num_elements();
            self.found.insert(param.id, v.reshape([n]));
        }
    }
}

/// [`AdamW::update`]'s walk over the module: a chunk is updated where its first parameter is
/// met, and each updated value put in its parameter's place, in its shape, trainable as it was.
struct Step<'a> {
    opt: &'a mut AdamW,
    /// The chunks not yet updated.
    chunks: Vec<Option<Chunk>>,
    chunk_of: HashMap<ParamId, usize>,
    /// The flat values of the parameters whose chunk is not yet updated.
    values: HashMap<ParamId, Tensor<1>>,
    /// Updated values not yet put in place.
    updated: HashMap<ParamId, Tensor<1>>,
    lr: f64,
    grad_scale: f64,
}

impl ModuleMapper for Step<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if let Some(chunk) = self
            .chunk_of
            .get(&param.id)
            .and_then(|&i| self.chunks[i].take())
        {
            let done = self
                .opt
                .update_chunk(chunk, &mut self.values, self.lr, self.grad_scale);
            self.updated.extend(done);
        }
        let Some(value) = self.updated.remove(&param.id) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let mut updated = Tensor::from_inner(value.reshape(tensor.shape()));
        if tensor.is_require_grad() {
            updated = updated.require_grad();
        }
        Param::from_mapped_value(id, updated, mapper)
    }
}

/// A module's gradients, taken out of Burn's `GradientsParams` and laid end to end in chunks
/// (see [`Chunks`]): what the global norm ([`Gradients::norm`]) and AdamW ([`AdamW::update`])
/// read, a chunk as one tensor. On a GPU Burn's fusion concatenates a chunk in one launch, its
/// norm takes one or two more, and its update two (the parameters' concatenation, the
/// arithmetic), where a tensor at a time took three for the norm (a square, and a sum over each
/// of its two axes) and one for the update. On the CPU each tensor is a chunk of its own.
pub(crate) struct Gradients {
    chunks: Vec<Chunk>,
}

struct Chunk {
    members: Vec<Member>,
    /// The members' gradients end to end (a member's own, flattened, where it is alone).
    flat: Tensor<1>,
    /// Whether AdamW's weight decay applies: parameters of rank ≥ 2.
    decays: bool,
}

struct Member {
    id: ParamId,
    path: String,
    len: usize,
}

impl Gradients {
    /// Take every gradient `grads` holds for `module`'s parameters, in the module's order, in
    /// chunks sized for its device.
    pub fn take<M: Module>(module: &M, grads: &mut GradientsParams) -> Self {
        let bindings = module
            .devices()
            .first()
            .and_then(|d| crate::model::backend::max_bindings(&d.clone().inner()));
        Self::take_in(module, grads, Chunks::for_bindings(bindings))
    }

    fn take_in<M: Module>(module: &M, grads: &mut GradientsParams, limits: Chunks) -> Self {
        struct Gather<'a> {
            grads: &'a mut GradientsParams,
            limits: Chunks,
            path: Vec<String>,
            /// Per chunk: its elements, members, gradients and whether it decays.
            open: Vec<(usize, Vec<Member>, Vec<Tensor<1>>, bool)>,
        }
        impl ModuleVisitor for Gather<'_> {
            fn enter_module(&mut self, name: &str, _container_type: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _name: &str, _container_type: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let Some(g) = self.grads.remove::<D>(param.id) else {
                    return;
                };
                let n = g.shape().num_elements();
                let g = g.inner().reshape([n]);
                let member = Member {
                    id: param.id,
                    path: self.path.join("."),
                    len: n,
                };
                let decays = D >= 2;
                let Chunks { tensors, elements } = self.limits;
                match self.open.last_mut() {
                    Some((len, members, parts, d))
                        if members.len() < tensors
                            && *len + n <= elements
                            && *d == decays
                            && parts[0].dtype() == g.dtype() =>
                    {
                        *len += n;
                        members.push(member);
                        parts.push(g);
                    }
                    _ => self.open.push((n, vec![member], vec![g], decays)),
                }
            }
        }
        let mut gather = Gather {
            grads,
            limits,
            path: Vec::new(),
            open: Vec::new(),
        };
        module.visit(&mut gather);
        let chunks = gather
            .open
            .into_iter()
            .map(|(_, members, parts, decays)| Chunk {
                members,
                flat: laid_end_to_end(parts),
                decays,
            })
            .collect();
        Self { chunks }
    }

    /// The global L2 norm of the gradients, in f32: each chunk's squares summed in f32
    /// ([`reduce::sum`]: in rows, and then over them), every chunk's sum queued before the
    /// first addition so that the additions fuse, then one read.
    pub fn norm(&self) -> f64 {
        let sums: Vec<Tensor<1>> = self
            .chunks
            .iter()
            .map(|c| reduce::sum(c.flat.clone().cast(burn::tensor::DType::F32).square()))
            .collect();
        match sums.into_iter().reduce(|a, b| a + b) {
            Some(s) => (s.into_scalar::<f32>() as f64).sqrt(),
            None => 0.0,
        }
    }
}

/// How [`Gradients`] groups the gradients: consecutive tensors of one dtype, all decayed or
/// none, up to these limits.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Chunks {
    /// Tensors a chunk concatenates.
    tensors: usize,
    /// Elements a chunk holds, which bounds the copy (64 MiB of f32); a larger tensor is a chunk
    /// of its own and is not copied.
    elements: usize,
}

impl Chunks {
    /// The most tensors a chunk concatenates on any device: as many as Metal's kernels take (they
    /// bind 28). NVIDIA's Vulkan binds thousands, untried in one kernel.
    const MOST: usize = 26;

    /// For a device whose kernels bind `bindings` buffers (`None`: the CPU backend). Burn's
    /// fusion counts a concatenation of n tensors as n + 2 bindings (the result and the
    /// kernel's metadata) and writes it in one kernel only where they fit, else a launch per
    /// tensor; so n = `bindings` - 2, no more than [`Chunks::MOST`]. (The update counts 8
    /// whatever the chunk: the values, gradients and two moments, their three results and the
    /// metadata.) On the CPU there are no launches to save and a concatenation is a copy: a
    /// tensor a chunk.
    fn for_bindings(bindings: Option<u32>) -> Self {
        let tensors = match bindings {
            None => 1,
            Some(n) => (n as usize).saturating_sub(2).clamp(1, Self::MOST),
        };
        Self {
            tensors,
            elements: 16 << 20,
        }
    }
}

/// The factor that brings the global norm down to `max_norm` (1 when already below), as
/// `clip_grad_norm_`: `min(1, max_norm / (norm + 1e-6))`. `max_norm <= 0` disables clipping.
pub(crate) fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0.0 || !norm.is_finite() {
        return 1.0;
    }
    (max_norm / (norm + 1e-6)).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn schedule_warmup_then_cosine() {
        let s = Schedule {
            peak: 1e-3,
            warmup: 10,
            total: 110,
            min_ratio: 0.0,
        };
        assert_eq!(s.lr(0), 0.0);
        assert!((s.lr(5) - 5e-4).abs() < 1e-15);
        assert!((s.lr(10) - 1e-3).abs() < 1e-15);
        assert!((s.lr(60) - 5e-4).abs() < 1e-12); // half-way through the cosine
        assert!(s.lr(110).abs() < 1e-15);
        let floor = Schedule {
            min_ratio: 0.1,
            ..s
        };
        assert!((floor.lr(110) - 1e-4).abs() < 1e-15);
        assert!((floor.lr(500) - 1e-4).abs() < 1e-15);
    }

    #[test]
    fn clip_factor_as_torch() {
        assert_eq!(clip_factor(0.5, 1.0), 1.0);
        assert!((clip_factor(4.0, 1.0) - 1.0 / (4.0 + 1e-6)).abs() < 1e-12);
        assert_eq!(clip_factor(4.0, 0.0), 1.0);
    }

    /// PyTorch's AdamW defaults (betas 0.9 and 0.999, eps 1e-8) with `weight_decay`.
    fn torch_defaults(weight_decay: f64) -> AdamWSettings {
        AdamWSettings {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }

    #[derive(Module, Debug)]
    struct Toy {
        w: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
    }

    fn toy(device: &Device) -> Toy {
        let w = Tensor::<2>::from_data([[1.0f32, -2.0], [0.5, 3.0]], device).require_grad();
        let b = Tensor::<1>::from_data([0.25f32, -0.5], device).require_grad();
        Toy {
            w: Param::from_tensor(w),
            b: Param::from_tensor(b),
        }
    }

    /// Two AdamW steps on `loss = Σ (x·W + b)` against the update computed by hand
    /// (the same numbers `torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8,
    /// weight_decay=0.1)` gives, with decay on `W` only).
    #[test]
    fn adamw_matches_hand_computation_and_skips_decay_on_rank_one() {
        let device = Device::flex().autodiff();
        let mut model = toy(&device);
        let mut opt = AdamW::new(torch_defaults(0.1));
        let x = Tensor::<2>::from_data([[1.0f32, 2.0]], &device);
        let lr = 0.1;
        // Hand computation for each element with constant gradient g:
        // step 1: m = 0.1 g, v = 0.001 g²; m̂ = g, v̂ = g²; update = lr · g/(|g| + eps)
        // step 2: m = 0.19 g, v = 0.001999 g²; m̂ = g, v̂ = g²; same update.
        // dL/dW[i][j] = x[i] (=1 for row 0, 2 for row 1), dL/db = 1.
        let mut w = [[1.0f64, -2.0], [0.5, 3.0]];
        let mut b = [0.25f64, -0.5];
        for _ in 0..2 {
            let y = x.clone().matmul(model.w.val()) + model.b.val().unsqueeze::<2>();
            let mut grads = GradientsParams::from_grads(y.sum().backward(), &model);
            let grads = Gradients::take(&model, &mut grads);
            model = opt.update(model, grads, lr, 1.0);
            for (i, row) in w.iter_mut().enumerate() {
                let g = [1.0, 2.0][i];
                for wij in row.iter_mut() {
                    *wij = *wij * (1.0 - lr * 0.1) - lr * g / (g + 1e-8);
                }
            }
            for bi in b.iter_mut() {
                *bi -= lr * 1.0 / (1.0 + 1e-8);
            }
        }
        let got_w = model.w.val().into_data().try_to_vec::<f32>().unwrap();
        let got_b = model.b.val().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(got_w.len(), w.iter().map(|r| r.len()).sum::<usize>());
        assert_eq!(got_b.len(), b.len());
        for (g, e) in got_w.iter().zip(w.iter().flatten()) {
            assert!((*g as f64 - e).abs() < 1e-6, "W {g} vs {e}");
        }
        for (g, e) in got_b.iter().zip(b.iter()) {
            assert!((*g as f64 - e).abs() < 1e-6, "b {g} vs {e}");
        }
        assert_eq!(opt.step, 2);
        assert_eq!(opt.paths(), ["b", "w"]);
        // parameters stay trainable after the update
        assert!(model.w.val().is_require_grad());
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

    /// Three steps of torch.optim.AdamW + clip_grad_norm_ on fixed gradients
    /// (scripts/train_reference.py); weights agree to 1e-5.
    #[test]
    fn adamw_and_clipping_match_torch() {
        let f = &fixture()["adamw"];
        let device = Device::flex().autodiff();
        let w0 = Tensor::<2>::from_data(TensorData::new(floats(&f["w0"]), [3, 4]), &device)
            .require_grad();
        let b0 =
            Tensor::<1>::from_data(TensorData::new(floats(&f["b0"]), [4]), &device).require_grad();
        let mut model = Toy {
            w: Param::from_tensor(w0),
            b: Param::from_tensor(b0),
        };
        let betas = floats(&f["betas"]);
        let mut opt = AdamW::new(AdamWSettings {
            beta1: betas[0] as f64,
            beta2: betas[1] as f64,
            eps: f["eps"].as_f64().unwrap(),
            weight_decay: f["weight_decay"].as_f64().unwrap(),
        });
        let clip = f["clip"].as_f64().unwrap();
        for (i, g) in f["grads"].as_array().unwrap().iter().enumerate() {
            let mut grads = GradientsParams::new();
            let inner = Device::flex();
            grads.register(
                model.w.id,
                Tensor::<2>::from_data(TensorData::new(floats(&g["w"]), [3, 4]), &inner),
            );
            grads.register(
                model.b.id,
                Tensor::<1>::from_data(TensorData::new(floats(&g["b"]), [4]), &inner),
            );
            let grads = Gradients::take(&model, &mut grads);
            let norm = grads.norm();
            let want_norm = f["norms"][i].as_f64().unwrap();
            assert!(
                (norm - want_norm).abs() < 1e-4 * want_norm,
                "norm {norm} vs {want_norm}"
            );
            let lr = f["lrs"][i].as_f64().unwrap();
            model = opt.update(model, grads, lr, clip_factor(norm, clip));
        }
        let w = model.w.val().into_data().try_to_vec::<f32>().unwrap();
        let b = model.b.val().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(
            (w.len(), b.len()),
            (floats(&f["w"]).len(), floats(&f["b"]).len())
        );
        for (g, e) in w
            .iter()
            .zip(floats(&f["w"]))
            .chain(b.iter().zip(floats(&f["b"])))
        {
            assert!((g - e).abs() < 1e-5, "{g} vs torch {e}");
        }
    }

    #[test]
    fn schedule_matches_transformers() {
        let f = &fixture()["schedule"];
        let s = Schedule {
            peak: 1.0,
            warmup: f["warmup"].as_u64().unwrap(),
            total: f["total"].as_u64().unwrap(),
            min_ratio: 0.0,
        };
        // transformers lets the cosine rise again past `total`; we hold the floor, so compare
        // up to `total`.
        for (step, m) in f["multipliers"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .take(s.total as usize + 1)
        {
            let m = m.as_f64().unwrap();
            assert!(
                (s.lr(step as u64) - m).abs() < 1e-9,
                "step {step}: {} vs {m}",
                s.lr(step as u64)
            );
        }
    }

    #[derive(Module, Debug)]
    struct Many {
        ws: Vec<Param<Tensor<2>>>,
        half: Param<Tensor<1>>,
        last: Param<Tensor<1>>,
    }

    /// 13 matrices (the eighth 61 x 100, the others a few elements), an f16 vector and an f32
    /// one, all trainable.
    fn many(device: &Device) -> Many {
        use burn::tensor::DType;
        let value = |i: usize, j: usize| ((i * 7 + j * 3) % 11) as f32 * 0.25 - 1.2;
        let ws: Vec<Param<Tensor<2>>> = (0..13)
            .map(|i| {
                // the eighth, 6 100 elements, is reduced as [2, 3 050]
                let [r, c] = if i == 7 {
                    [61, 100]
                } else {
                    [1 + i % 3, 2 + i % 5]
                };
                let data: Vec<f32> = (0..r * c).map(|j| value(i, j)).collect();
                let t = Tensor::<2>::from_data(TensorData::new(data, [r, c]), device);
                Param::from_tensor(t.require_grad())
            })
            .collect();
        let vector = |n: usize, k: usize, dtype: DType| {
            let data: Vec<f32> = (0..n).map(|j| value(k, j)).collect();
            let t = Tensor::<1>::from_data(TensorData::new(data, [n]), device).cast(dtype);
            Param::from_tensor(t.require_grad())
        };
        Many {
            ws,
            half: vector(9, 20, DType::F16),
            last: vector(5, 21, DType::F32),
        }
    }

    /// `Σ w³ / 3` over every tensor: each gradient is the tensor squared.
    fn cubes(model: &Many) -> GradientsParams {
        use burn::tensor::DType;
        let cube = |t: Tensor<1>| t.clone().square().mul(t).sum();
        let mut loss = cube(model.half.val().cast(DType::F32)) + cube(model.last.val());
        for w in &model.ws {
            let n = w.shape().num_elements();
            loss = loss + cube(w.val().reshape([n]));
        }
        GradientsParams::from_grads(loss.div_scalar(3.0).backward(), model)
    }

    /// The norm over chunks of every size equals the one summed on the host in f64, whichever way
    /// the tensors are grouped: by count, by elements, a tensor larger than a chunk alone, and an
    /// f16 gradient, which starts a chunk of its own and is squared in f32; chunks reduced in one
    /// axis and in two.
    #[test]
    fn grad_norm_over_chunks_equals_the_hosts() {
        use burn::tensor::DType;
        let device = Device::flex().autodiff();
        let model = many(&device);
        let mut want = 0.0f64;
        let mut add = |t: Tensor<1>| {
            let v = t.cast(DType::F32).into_data().convert::<f64>();
            want += v.iter::<f64>().map(|x| x * x * x * x).sum::<f64>();
        };
        for w in &model.ws {
            let n = w.shape().num_elements();
            add(w.val().reshape([n]));
        }
        add(model.half.val());
        add(model.last.val());
        let want = want.sqrt();
        for (tensors, elements) in [(6, 16 << 20), (4, 1 << 20), (100, 12), (1, 1), (3, 0)] {
            let grads =
                Gradients::take_in(&model, &mut cubes(&model), Chunks { tensors, elements });
            let got = grads.norm();
            assert!(
                (got - want).abs() < 1e-6 * want,
                "{tensors} tensors, {elements} elements a chunk: {got} vs {want}"
            );
        }
        let got = Gradients::take(&model, &mut cubes(&model)).norm();
        assert!((got - want).abs() < 1e-6 * want);
    }

    /// A chunk takes as many tensors as a kernel binds, less its result and metadata: 13 on
    /// llvmpipe's OpenGL (15 bound), 26 through Metal (28), no more than 26 through NVIDIA's
    /// Vulkan; one on the CPU.
    #[test]
    fn chunks_fit_the_devices_bindings() {
        let tensors = |b| Chunks::for_bindings(b).tensors;
        assert_eq!(
            [
                None,
                Some(0),
                Some(3),
                Some(7),
                Some(15),
                Some(28),
                Some(1 << 20)
            ]
            .map(tensors),
            [1, 1, 1, 5, 13, 26, 26]
        );
    }

    /// AdamW's updates and moments are the same to the bit however the gradients are chunked,
    /// whether the chunks change from step to step, and across a resume (moments exported and
    /// imported a parameter at a time) into other chunks; a parameter whose first gradient comes
    /// at the second step joins a chunk whose other members have moments. The reference takes
    /// a tensor at a time, as the update did before it took chunks.
    #[test]
    fn adamw_is_the_same_whatever_the_chunks() {
        let run = |chunks: &[(usize, usize)], resume_after: Option<usize>| {
            let device = Device::flex().autodiff();
            let mut model = many(&device);
            let mut opt = AdamW::new(torch_defaults(0.1));
            for (step, &(tensors, elements)) in chunks.iter().enumerate() {
                let mut grads = cubes(&model);
                // the f16 vector is left alone (its moments would come back in f32 on a resume)
                grads.remove::<1>(model.half.id);
                if step == 0 {
                    grads.remove::<1>(model.last.id);
                }
                let grads = Gradients::take_in(&model, &mut grads, Chunks { tensors, elements });
                model = opt.update(model, grads, 0.05, 0.7);
                if resume_after == Some(step) {
                    let moments = opt.export().into_iter().map(Ok);
                    opt = AdamW::import(opt.settings, opt.step, moments, &Device::flex()).unwrap();
                }
            }
            let mut values: Vec<Vec<f32>> = model
                .ws
                .iter()
                .map(|w| w.val().into_data().try_to_vec::<f32>().unwrap())
                .collect();
            values.push(model.last.val().into_data().try_to_vec::<f32>().unwrap());
            (values, opt.export())
        };
        let (want, moments) = run(&[(1, 1); 3], None);
        assert_eq!(moments.len(), 2 * 14, "{:?}", moments.keys());
        for (chunks, resume_after) in [
            ([(6, 16 << 20); 3], None),
            ([(6, 16 << 20), (4, 40), (100, 12)], None),
            ([(100, 1 << 20), (100, 1 << 20), (3, 0)], Some(0)),
            ([(2, 1 << 20), (5, 7000), (100, 1 << 20)], Some(1)),
        ] {
            let (got, got_moments) = run(&chunks, resume_after);
            assert!(got == want, "{chunks:?}, resumed after {resume_after:?}");
            assert!(
                got_moments == moments,
                "{chunks:?}, resumed after {resume_after:?}"
            );
        }
    }

    #[test]
    fn global_norm_and_state_round_trip() {
        let device = Device::flex().autodiff();
        let model = toy(&device);
        let x = Tensor::<2>::from_data([[1.0f32, 2.0]], &device);
        let y = x.matmul(model.w.val()) + model.b.val().unsqueeze::<2>();
        let mut grads = GradientsParams::from_grads(y.sum().backward(), &model);
        // grads: W = [[1,1],[2,2]], b = [1,1] -> norm² = 1+1+4+4+1+1 = 12
        let grads = Gradients::take(&model, &mut grads);
        let n = grads.norm();
        assert!((n - 12f64.sqrt()).abs() < 1e-6);
        let mut opt = AdamW::new(torch_defaults(0.0));
        let _ = opt.update(model, grads, 0.01, clip_factor(n, 1.0));
        let exported = opt.export();
        assert_eq!(exported.len(), 4);
        // clipped gradient of b is 1/√12 per element; exp_avg = 0.1 · that
        let m_b = &exported["b.exp_avg"];
        assert!((m_b[0] as f64 - 0.1 / 12f64.sqrt()).abs() < 1e-6);
        let back = AdamW::import(
            opt.settings,
            opt.step,
            exported.clone().into_iter().map(Ok),
            &Device::flex(),
        )
        .unwrap();
        assert_eq!(back.export(), exported);
        // the streamed form: the same names, shapes and values
        let shapes = back.moment_shapes();
        let streamed: std::collections::BTreeMap<String, Vec<f32>> = back
            .moment_tensors()
            .zip(&shapes)
            .map(|(t, (name, shape))| {
                assert_eq!((&t.name, &t.shape), (name, shape));
                (t.name, t.data)
            })
            .collect();
        assert_eq!(streamed, exported);
        let _ = TensorData::new(vec![0.0f32], [1]);
    }
}
