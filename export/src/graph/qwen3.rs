//! Builds the [`Graph`] of a Qwen3 decision model from its config and named weights, exactly as
//! transformers' `Qwen3ForCausalLM` computes the last position's logits, restricted to the offered
//! labels. No tracing: each layer is written out here.

use std::sync::Arc;

use anyhow::{Result, bail};

use super::{
    Const, ConstId, ConstSource, DType, Dim, Graph, MASKED, ModelFacts, Node, Op, ValueId,
    ValueType,
};
use crate::Qwen3Config;
use decision_train::model::weights::WeightSource;

/// How to build the graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphOptions {
    /// Storage and compute type of the weights and the residual stream ([`DType::F32`] or
    /// [`DType::F16`]); norms, softmax and the option logits stay f32 either way.
    pub dtype: DType,
    /// The temperature the option logits are divided by.
    pub temperature: f32,
}

impl Default for GraphOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            temperature: 1.0,
        }
    }
}

/// The weight names (and shapes) a Qwen3 checkpoint with this config must hold: training's list.
pub use decision_train::model::weights::expected_tensors as expected_weights;

struct Builder {
    values: Vec<ValueType>,
    consts: Vec<Const>,
    nodes: Vec<Node>,
    dtype: DType,
}

impl Builder {
    fn ty(&self, v: ValueId) -> &ValueType {
        &self.values[v.0]
    }

    fn fresh(&mut self, ty: ValueType) -> ValueId {
        self.values.push(ty);
        ValueId(self.values.len() - 1)
    }

    fn node(&mut self, name: impl Into<String>, op: Op, ty: ValueType) -> ValueId {
        let output = self.fresh(ty);
        self.nodes.push(Node {
            name: name.into(),
            op,
            output,
        });
        output
    }

    fn weight(&mut self, name: &str, shape: Vec<usize>, dtype: DType) -> ConstId {
        self.consts.push(Const {
            name: name.to_string(),
            dtype,
            shape,
            source: ConstSource::Weight(name.to_string()),
        });
        ConstId(self.consts.len() - 1)
    }

    fn cast(&mut self, name: &str, x: ValueId, to: DType) -> ValueId {
        if self.ty(x).dtype == to {
            return x;
        }
        let shape = self.ty(x).shape.clone();
        self.node(
            format!("{name}.cast_{}", to.name()),
            Op::Cast { x, to },
            ValueType::new(to, shape),
        )
    }

    /// RMSNorm in f32; the result is cast back to `back_to` (when given).
    fn rms_norm(
        &mut self,
        name: &str,
        x: ValueId,
        weight: &str,
        eps: f32,
        back_to: Option<DType>,
    ) -> ValueId {
        let width = self.ty(x).last_fixed().expect("norm over a fixed axis");
        let w = self.weight(weight, vec![width], DType::F32);
        let x32 = self.cast(name, x, DType::F32);
        let shape = self.ty(x).shape.clone();
        let y = self.node(
            name,
            Op::RmsNorm {
                x: x32,
                weight: w,
                eps,
            },
            ValueType::new(DType::F32, shape),
        );
        match back_to {
            Some(t) => self.cast(name, y, t),
            None => y,
        }
    }

    fn linear(&mut self, name: &str, x: ValueId, prefix: &str, out: usize, bias: bool) -> ValueId {
        let ty = self.ty(x).clone();
        let input = ty.last_fixed().expect("linear over a fixed axis");
        let weight = self.weight(&format!("{prefix}.weight"), vec![out, input], self.dtype);
        let bias = bias.then(|| self.weight(&format!("{prefix}.bias"), vec![out], self.dtype));
        let mut shape = ty.shape.clone();
        *shape.last_mut().expect("rank ≥ 1") = Dim::Fixed(out);
        self.node(
            name,
            Op::Linear { x, weight, bias },
            ValueType::new(ty.dtype, shape),
        )
    }

    fn binary(&mut self, name: &str, a: ValueId, b: ValueId, mul: bool) -> ValueId {
        let ty = self.ty(a).clone();
        debug_assert_eq!(&ty, self.ty(b), "{name}: operand types differ");
        let op = if mul {
            Op::Mul { a, b }
        } else {
            Op::Add { a, b }
        };
        self.node(name, op, ty)
    }
}

/// Build the decision graph of a Qwen3 model: inputs `input_ids`, `attention_mask`,
/// `option_token_ids` (i64, left-padded) → outputs `option_logits` (divided by the temperature) and
/// `option_probs` (their softmax), contracts section 5. The weights are checked against the config
/// first: a missing, unexpected or mis-shaped tensor is an error naming it.
pub fn build_qwen3(
    cfg: &Qwen3Config,
    weights: Arc<dyn WeightSource>,
    opts: GraphOptions,
) -> Result<Graph> {
    if !matches!(opts.dtype, DType::F32 | DType::F16) {
        bail!(
            "weights can be exported as f32 or f16, not {}",
            opts.dtype.name()
        );
    }
    if !(opts.temperature.is_finite() && opts.temperature > 0.0) {
        bail!(
            "the temperature must be a positive number, got {}",
            opts.temperature
        );
    }
    decision_train::model::weights::check_tensors(cfg, weights.as_ref(), "the export")?;
    let dt = opts.dtype;
    let eps = cfg.rms_norm_eps as f32;
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut b = Builder {
        values: Vec::new(),
        consts: Vec::new(),
        nodes: Vec::new(),
        dtype: dt,
    };

    let ids = b.fresh(ValueType::new(DType::I64, vec![Dim::Batch, Dim::Seq]));
    let mask = b.fresh(ValueType::new(DType::I64, vec![Dim::Batch, Dim::Seq]));
    let option_ids = b.fresh(ValueType::new(DType::I64, vec![Dim::Batch, Dim::Options]));

    let embed = b.weight("model.embed_tokens.weight", vec![cfg.vocab_size, h], dt);
    let mut hidden = b.node(
        "embed_tokens",
        Op::Embedding { table: embed, ids },
        ValueType::new(dt, vec![Dim::Batch, Dim::Seq, Dim::Fixed(h)]),
    );

    // Shared by every layer: positions from the mask, RoPE tables, the attention bias.
    let positions = b.node(
        "position_ids",
        Op::PositionIds { mask },
        ValueType::new(DType::I64, vec![Dim::Batch, Dim::Seq]),
    );
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|i| (1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64)) as f32)
        .collect();
    b.consts.push(Const {
        name: "rope.inv_freq".into(),
        dtype: DType::F32,
        shape: vec![d / 2],
        source: ConstSource::Values(inv_freq),
    });
    let inv_freq = ConstId(b.consts.len() - 1);
    let half = ValueType::new(DType::F32, vec![Dim::Batch, Dim::Seq, Dim::Fixed(d / 2)]);
    let angles = b.node(
        "rope.angles",
        Op::RopeAngles {
            positions,
            inv_freq,
        },
        half.clone(),
    );
    let cos = b.node("rope.cos", Op::Cos { x: angles }, half.clone());
    let sin = b.node("rope.sin", Op::Sin { x: angles }, half);
    let cos = b.cast("rope.cos", cos, dt);
    let sin = b.cast("rope.sin", sin, dt);
    let bias = b.node(
        "attention_bias",
        Op::AttentionBias {
            mask,
            masked: MASKED,
        },
        ValueType::new(
            DType::F32,
            vec![Dim::Batch, Dim::Fixed(1), Dim::Seq, Dim::Seq],
        ),
    );

    let heads =
        |n: usize| ValueType::new(dt, vec![Dim::Batch, Dim::Fixed(n), Dim::Seq, Dim::Fixed(d)]);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let n = format!("layers.{l}");
        let x = b.rms_norm(
            &format!("{n}.input_layernorm"),
            hidden,
            &format!("{p}.input_layernorm.weight"),
            eps,
            Some(dt),
        );

        let mut qkv = Vec::new();
        for (proj, nh) in [("q", hq), ("k", hkv), ("v", hkv)] {
            let name = format!("{n}.self_attn.{proj}_proj");
            let y = b.linear(
                &name,
                x,
                &format!("{p}.self_attn.{proj}_proj"),
                nh * d,
                cfg.attention_bias,
            );
            let y = b.node(
                format!("{name}.heads"),
                Op::SplitHeads {
                    x: y,
                    heads: nh,
                    head_dim: d,
                },
                heads(nh),
            );
            let y = if proj == "v" {
                y
            } else {
                let norm = format!("{n}.self_attn.{proj}_norm");
                let y = b.rms_norm(
                    &norm,
                    y,
                    &format!("{p}.self_attn.{proj}_norm.weight"),
                    eps,
                    Some(dt),
                );
                b.node(
                    format!("{n}.self_attn.{proj}_rope"),
                    Op::Rope { x: y, cos, sin },
                    heads(nh),
                )
            };
            qkv.push(y);
        }
        let scale = (d as f64).powf(-0.5) as f32;
        let attn = b.node(
            format!("{n}.self_attn.attention"),
            Op::Attention {
                q: qkv[0],
                k: qkv[1],
                v: qkv[2],
                bias,
                scale,
            },
            heads(hq),
        );
        let merged = b.node(
            format!("{n}.self_attn.merge_heads"),
            Op::MergeHeads { x: attn },
            ValueType::new(dt, vec![Dim::Batch, Dim::Seq, Dim::Fixed(hq * d)]),
        );
        let o = b.linear(
            &format!("{n}.self_attn.o_proj"),
            merged,
            &format!("{p}.self_attn.o_proj"),
            h,
            cfg.attention_bias,
        );
        hidden = b.binary(&format!("{n}.attn_residual"), hidden, o, false);

        let x = b.rms_norm(
            &format!("{n}.post_attention_layernorm"),
            hidden,
            &format!("{p}.post_attention_layernorm.weight"),
            eps,
            Some(dt),
        );
        let i = cfg.intermediate_size;
        let gate = b.linear(
            &format!("{n}.mlp.gate_proj"),
            x,
            &format!("{p}.mlp.gate_proj"),
            i,
            false,
        );
        let up = b.linear(
            &format!("{n}.mlp.up_proj"),
            x,
            &format!("{p}.mlp.up_proj"),
            i,
            false,
        );
        let gate_ty = b.ty(gate).clone();
        let act = b.node(format!("{n}.mlp.act"), Op::Silu { x: gate }, gate_ty);
        let prod = b.binary(&format!("{n}.mlp.gate_up"), act, up, true);
        let down = b.linear(
            &format!("{n}.mlp.down_proj"),
            prod,
            &format!("{p}.mlp.down_proj"),
            h,
            false,
        );
        hidden = b.binary(&format!("{n}.mlp_residual"), hidden, down, false);
    }

    // Only the answer slot matters from here on (the norm is per position, so taking the last
    // position first changes nothing but the cost).
    let last = b.node(
        "last_position",
        Op::LastPosition { x: hidden },
        ValueType::new(dt, vec![Dim::Batch, Dim::Fixed(h)]),
    );
    let normed = b.rms_norm("norm", last, "model.norm.weight", eps, None);
    let table = if cfg.tie_word_embeddings {
        embed
    } else {
        b.weight("lm_head.weight", vec![cfg.vocab_size, h], dt)
    };
    let opt_ty = ValueType::new(DType::F32, vec![Dim::Batch, Dim::Options]);
    let logits = b.node(
        "option_logits.raw",
        Op::OptionLogits {
            hidden: normed,
            table,
            ids: option_ids,
        },
        opt_ty.clone(),
    );
    let scaled = b.node(
        "option_logits",
        Op::DivScalar {
            x: logits,
            divisor: opts.temperature,
        },
        opt_ty.clone(),
    );
    let probs = b.node("option_probs", Op::Softmax { x: scaled }, opt_ty);

    let graph = Graph {
        values: b.values,
        consts: b.consts,
        inputs: vec![
            ("input_ids".into(), ids),
            ("attention_mask".into(), mask),
            ("option_token_ids".into(), option_ids),
        ],
        nodes: b.nodes,
        outputs: vec![
            ("option_logits".into(), scaled),
            ("option_probs".into(), probs),
        ],
        facts: ModelFacts {
            architecture: "Qwen3ForCausalLM",
            config: cfg.clone(),
            dtype: dt,
            temperature: opts.temperature,
        },
        weights,
    };
    graph.validate()?;
    Ok(graph)
}

#[cfg(test)]
mod tests {
    use super::*;
    use decision_train::model::weights::MemorySource;

    pub(crate) fn tiny_config(tied: bool) -> Qwen3Config {
        Qwen3Config {
            vocab_size: 16,
            hidden_size: 8,
            intermediate_size: 12,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 6,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: tied,
            attention_bias: false,
            max_position_embeddings: 64,
        }
    }

    fn source(cfg: &Qwen3Config) -> MemorySource {
        let mut src = MemorySource::new();
        for (name, shape) in expected_weights(cfg) {
            let n = shape.iter().product();
            src.insert(name, shape, (0..n).map(|i| (i % 7) as f32 * 0.01).collect());
        }
        src
    }

    #[test]
    fn builds_a_typed_program_with_the_contract_interface() {
        let cfg = tiny_config(true);
        let g = build_qwen3(
            &cfg,
            Arc::new(source(&cfg)),
            GraphOptions {
                dtype: DType::F16,
                temperature: 2.0,
            },
        )
        .unwrap();
        let names: Vec<&str> = g.inputs().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["input_ids", "attention_mask", "option_token_ids"]);
        let outs: Vec<&str> = g.outputs().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(outs, ["option_logits", "option_probs"]);
        let probs = g.value(g.outputs()[1].1);
        assert_eq!(
            probs,
            &ValueType::new(DType::F32, vec![Dim::Batch, Dim::Options])
        );
        // Tied: the option logits read the embedding table, and no lm_head constant exists.
        assert!(g.consts().iter().all(|c| c.name != "lm_head.weight"));
        // f16 weights, f32 norms.
        for c in g.consts() {
            let want = if c.name.contains("norm") || c.name.starts_with("rope.") {
                DType::F32
            } else {
                DType::F16
            };
            assert_eq!(c.dtype, want, "{}", c.name);
        }
        // Every RMSNorm reads an f32 value.
        for node in g.nodes() {
            if let Op::RmsNorm { x, .. } = node.op {
                assert_eq!(g.value(x).dtype, DType::F32, "{}", node.name);
            }
        }
        assert_eq!(g.parameter_count(), cfg.parameter_count() as u64);
        let listing = g.to_string();
        assert!(
            listing.contains("attention(")
                && listing.contains("@model.layers.1.mlp.down_proj.weight")
        );
    }

    #[test]
    fn refuses_weights_that_do_not_match_the_config() {
        let cfg = tiny_config(false);
        let mut src = source(&cfg);
        src.insert("model.layers.0.mlp.extra.weight", vec![1], vec![0.0]);
        src.insert(
            "model.layers.1.mlp.up_proj.weight",
            vec![3, 8],
            vec![0.0; 24],
        );
        let err = build_qwen3(&cfg, Arc::new(src), GraphOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unexpected (1): model.layers.0.mlp.extra.weight"),
            "{err}"
        );
        assert!(
            err.contains(
                "mis-shaped (1): model.layers.1.mlp.up_proj.weight: expected [12, 8], found [3, 8]"
            ),
            "{err}"
        );
        assert!(!err.contains("missing"), "{err}");

        let mut partial = MemorySource::new();
        partial.insert("model.embed_tokens.weight", vec![16, 8], vec![0.0; 128]);
        let err = build_qwen3(&cfg, Arc::new(partial), GraphOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing (24): model.layers.0.input_layernorm.weight"),
            "{err}"
        );
        assert!(err.contains("and 4 more"), "{err}");
    }
}
