//! Lowering of each graph-description op to ONNX nodes (opset 18 decomposed, opset 23 fused).

use std::collections::{HashMap, HashSet};

use anyhow::{Result, bail};

use super::pb::{self, attribute_proto::AttributeType};
use super::{LoweredWeight, elem_type, ir_version};
use crate::graph::{ConstId, DType, Dim, Graph, Op, ValueId, ValueType};

pub(crate) struct Lowered {
    /// The model with its small constants inline; weights are added by the caller.
    pub model: pb::ModelProto,
    pub weights: Vec<LoweredWeight>,
}

struct Ctx<'g> {
    g: &'g Graph,
    opset: i64,
    nodes: Vec<pb::NodeProto>,
    small: Vec<pb::TensorProto>,
    small_by_key: HashMap<String, String>,
    weights: Vec<LoweredWeight>,
    weight_names: HashMap<ConstId, (String, bool)>,
    names: Vec<String>,
    used: HashSet<String>,
    memo: HashMap<(ValueId, &'static str), String>,
}

fn attr_int(name: &str, i: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: Some(i),
        ..Default::default()
    }
}

fn attr_float(name: &str, f: f32) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f: Some(f),
        ..Default::default()
    }
}

fn attr_ints(name: &str, ints: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: ints.to_vec(),
        ..Default::default()
    }
}

fn value_info(name: &str, ty: &ValueType) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{Dimension, dimension::Value as D};
    let dims = ty
        .shape
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => D::DimValue(*n as i64),
                sym => D::DimParam(sym.symbol().expect("symbolic").into()),
            }),
        })
        .collect();
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: elem_type(ty.dtype),
                shape: Some(pb::TensorShapeProto { dim: dims }),
            })),
        }),
        doc_string: String::new(),
    }
}

impl<'g> Ctx<'g> {
    fn unique(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut n = 1;
        while !self.used.insert(name.clone()) {
            n += 1;
            name = format!("{base}#{n}");
        }
        name
    }

    /// Emit one node; returns its (first) output name.
    fn emit(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        output: &str,
        attrs: Vec<pb::AttributeProto>,
    ) -> String {
        self.nodes.push(pb::NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_string()],
            name: output.to_string(),
            op_type: op_type.into(),
            attribute: attrs,
            domain: String::new(),
        });
        output.to_string()
    }

    /// Emit a node with a fresh output named `{base}/{suffix}`.
    fn tmp(
        &mut self,
        base: &str,
        suffix: &str,
        op_type: &str,
        inputs: &[&str],
        attrs: Vec<pb::AttributeProto>,
    ) -> String {
        let out = self.unique(&format!("{base}/{suffix}"));
        self.emit(op_type, inputs, &out, attrs)
    }

    fn small_const(&mut self, key: String, dims: Vec<i64>, dtype: DType, raw: Vec<u8>) -> String {
        if let Some(name) = self.small_by_key.get(&key) {
            return name.clone();
        }
        let name = self.unique(&format!("const/{key}"));
        self.small.push(pb::TensorProto {
            dims,
            data_type: elem_type(dtype),
            name: name.clone(),
            raw_data: raw,
            ..Default::default()
        });
        self.small_by_key.insert(key, name.clone());
        name
    }

    /// A 1-D int64 constant (shapes, axes, slice bounds).
    fn ints(&mut self, v: &[i64]) -> String {
        let key = format!("i64{v:?}").replace(' ', "");
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.small_const(key, vec![v.len() as i64], DType::I64, raw)
    }

    fn int_scalar(&mut self, v: i64) -> String {
        self.small_const(
            format!("i64_{v}"),
            vec![],
            DType::I64,
            v.to_le_bytes().to_vec(),
        )
    }

    /// A float scalar in `dtype` (f32 or f16).
    fn float_scalar(&mut self, v: f32, dtype: DType) -> String {
        let raw = match dtype {
            DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        };
        self.small_const(format!("{}_{v:e}", dtype.name()), vec![], dtype, raw)
    }

    /// The initializer holding a weight, transposed for MatMul when `transposed`.
    fn weight(&mut self, id: ConstId, transposed: bool) -> Result<String> {
        if let Some((name, t)) = self.weight_names.get(&id) {
            if *t != transposed {
                bail!(
                    "constant `{}` is needed both transposed and not",
                    self.g.constant(id).name
                );
            }
            return Ok(name.clone());
        }
        let c = self.g.constant(id);
        if !c.is_weight() {
            // Builder-made constants are small: inline.
            let raw = self.g.const_bytes(id)?;
            let dims = c.shape.iter().map(|d| *d as i64).collect();
            let name = self.small_const(c.name.clone(), dims, c.dtype, raw);
            self.weight_names.insert(id, (name.clone(), transposed));
            return Ok(name);
        }
        let mut dims: Vec<i64> = c.shape.iter().map(|d| *d as i64).collect();
        if transposed {
            if dims.len() != 2 {
                bail!("constant `{}` is not a matrix", c.name);
            }
            dims.swap(0, 1);
        }
        let name = self.unique(&c.name);
        self.weights.push(LoweredWeight {
            tensor: pb::TensorProto {
                dims,
                data_type: elem_type(c.dtype),
                name: name.clone(),
                ..Default::default()
            },
            source: id,
            transposed,
        });
        self.weight_names.insert(id, (name.clone(), transposed));
        Ok(name)
    }

    fn name(&self, v: ValueId) -> String {
        self.names[v.0].clone()
    }

    fn ty(&self, v: ValueId) -> &'g ValueType {
        self.g.value(v)
    }

    fn cast(&mut self, base: &str, x: &str, from: DType, to: DType) -> String {
        if from == to {
            return x.to_string();
        }
        self.tmp(
            base,
            &format!("cast_{}", to.name()),
            "Cast",
            &[x],
            vec![attr_int("to", elem_type(to) as i64)],
        )
    }

    fn lower_node(&mut self, name: &str, op: &Op, out: &str) -> Result<()> {
        let g = self.g;
        match *op {
            Op::Embedding { table, ids } => {
                let t = self.weight(table, false)?;
                let i = self.name(ids);
                self.emit("Gather", &[&t, &i], out, vec![attr_int("axis", 0)]);
            }
            Op::Linear { x, weight, bias } => {
                let w = self.weight(weight, true)?;
                let xi = self.name(x);
                match bias {
                    None => {
                        self.emit("MatMul", &[&xi, &w], out, vec![]);
                    }
                    Some(b) => {
                        let m = self.tmp(name, "matmul", "MatMul", &[&xi, &w], vec![]);
                        let bn = self.weight(b, false)?;
                        self.emit("Add", &[&m, &bn], out, vec![]);
                    }
                }
            }
            Op::RmsNorm { x, weight, eps } => {
                let w = self.weight(weight, false)?;
                let xi = self.name(x);
                if self.opset >= 23 {
                    let attrs = vec![
                        attr_int("axis", -1),
                        attr_float("epsilon", eps),
                        attr_int("stash_type", 1),
                    ];
                    self.emit("RMSNormalization", &[&xi, &w], out, attrs);
                } else {
                    let two = self.float_scalar(2.0, DType::F32);
                    let sq = self.tmp(name, "pow", "Pow", &[&xi, &two], vec![]);
                    let axes = self.ints(&[-1]);
                    let mean = self.tmp(
                        name,
                        "mean",
                        "ReduceMean",
                        &[&sq, &axes],
                        vec![attr_int("keepdims", 1)],
                    );
                    let e = self.float_scalar(eps, DType::F32);
                    let var = self.tmp(name, "add_eps", "Add", &[&mean, &e], vec![]);
                    let rms = self.tmp(name, "sqrt", "Sqrt", &[&var], vec![]);
                    let normed = self.tmp(name, "div", "Div", &[&xi, &rms], vec![]);
                    self.emit("Mul", &[&normed, &w], out, vec![]);
                }
            }
            Op::Cast { x, to } => {
                let xi = self.name(x);
                self.emit(
                    "Cast",
                    &[&xi],
                    out,
                    vec![attr_int("to", elem_type(to) as i64)],
                );
            }
            Op::SplitHeads { x, heads, head_dim } => {
                let shape = self.ints(&[0, 0, heads as i64, head_dim as i64]);
                let xi = self.name(x);
                let r = self.tmp(name, "reshape", "Reshape", &[&xi, &shape], vec![]);
                self.emit(
                    "Transpose",
                    &[&r],
                    out,
                    vec![attr_ints("perm", &[0, 2, 1, 3])],
                );
            }
            Op::MergeHeads { x } => {
                let ty = self.ty(x);
                let (heads, d) = match (ty.shape.get(1).and_then(|d| d.fixed()), ty.last_fixed()) {
                    (Some(h), Some(d)) => (h, d),
                    _ => bail!("{name}: merge_heads needs fixed head and width dimensions"),
                };
                let xi = self.name(x);
                let t = self.tmp(
                    name,
                    "transpose",
                    "Transpose",
                    &[&xi],
                    vec![attr_ints("perm", &[0, 2, 1, 3])],
                );
                let shape = self.ints(&[0, 0, (heads * d) as i64]);
                self.emit("Reshape", &[&t, &shape], out, vec![]);
            }
            Op::PositionIds { mask } => {
                let m = self.name(mask);
                let axis = self.int_scalar(1);
                let c = self.tmp(name, "cumsum", "CumSum", &[&m, &axis], vec![]);
                let one = self.int_scalar(1);
                let p = self.tmp(name, "minus_one", "Sub", &[&c, &one], vec![]);
                let zero = self.int_scalar(0);
                self.emit("Max", &[&p, &zero], out, vec![]);
            }
            Op::RopeAngles {
                positions,
                inv_freq,
            } => {
                let f = self.weight(inv_freq, false)?;
                let p = self.name(positions);
                let pf = self.cast(name, &p, DType::I64, DType::F32);
                let axes = self.ints(&[-1]);
                let u = self.tmp(name, "unsqueeze", "Unsqueeze", &[&pf, &axes], vec![]);
                self.emit("Mul", &[&u, &f], out, vec![]);
            }
            Op::Cos { x } => {
                let xi = self.name(x);
                self.emit("Cos", &[&xi], out, vec![]);
            }
            Op::Sin { x } => {
                let xi = self.name(x);
                self.emit("Sin", &[&xi], out, vec![]);
            }
            Op::Rope { x, cos, sin } => {
                let xi = self.name(x);
                let (c, s) = (self.name(cos), self.name(sin));
                if self.opset >= 23 {
                    self.emit(
                        "RotaryEmbedding",
                        &[&xi, &c, &s],
                        out,
                        vec![attr_int("interleaved", 0)],
                    );
                } else {
                    let d = self.ty(x).last_fixed().expect("fixed head width") as i64;
                    let cf = self.full_table(cos)?;
                    let sf = self.full_table(sin)?;
                    let axes = self.ints(&[-1]);
                    let (zero, half, end) = (self.ints(&[0]), self.ints(&[d / 2]), self.ints(&[d]));
                    let x1 = self.tmp(name, "x1", "Slice", &[&xi, &zero, &half, &axes], vec![]);
                    let x2 = self.tmp(name, "x2", "Slice", &[&xi, &half, &end, &axes], vec![]);
                    let neg = self.tmp(name, "neg_x2", "Neg", &[&x2], vec![]);
                    let rot = self.tmp(
                        name,
                        "rotate_half",
                        "Concat",
                        &[&neg, &x1],
                        vec![attr_int("axis", -1)],
                    );
                    let a = self.tmp(name, "x_cos", "Mul", &[&xi, &cf], vec![]);
                    let b = self.tmp(name, "rot_sin", "Mul", &[&rot, &sf], vec![]);
                    self.emit("Add", &[&a, &b], out, vec![]);
                }
            }
            Op::AttentionBias { mask, masked } => {
                let m = self.name(mask);
                let one = self.ints(&[1]);
                let seq1 = self.tmp(
                    name,
                    "seq_len",
                    "Shape",
                    &[&m],
                    vec![attr_int("start", 1), attr_int("end", 2)],
                );
                let zero_axis = self.ints(&[0]);
                let seq = self.tmp(name, "seq", "Squeeze", &[&seq1, &zero_axis], vec![]);
                let (z, o) = (self.int_scalar(0), self.int_scalar(1));
                let idx = self.tmp(name, "range", "Range", &[&z, &seq, &o], vec![]);
                let rows = self.tmp(name, "rows", "Unsqueeze", &[&idx, &one], vec![]);
                let cols = self.tmp(name, "cols", "Unsqueeze", &[&idx, &zero_axis], vec![]);
                let future = self.tmp(name, "future", "Greater", &[&cols, &rows], vec![]);
                let pad = self.tmp(name, "padding", "Equal", &[&m, &z], vec![]);
                let one_two = self.ints(&[1, 2]);
                let pad4 = self.tmp(name, "padding_4d", "Unsqueeze", &[&pad, &one_two], vec![]);
                let blocked = self.tmp(name, "blocked", "Or", &[&future, &pad4], vec![]);
                let neg = self.float_scalar(masked, DType::F32);
                let zero = self.float_scalar(0.0, DType::F32);
                self.emit("Where", &[&blocked, &neg, &zero], out, vec![]);
            }
            Op::Attention {
                q,
                k,
                v,
                bias,
                scale,
            } => {
                let dt = self.ty(q).dtype;
                let hq = self.ty(q).shape[1].fixed().expect("fixed heads") as i64;
                let hkv = self.ty(k).shape[1].fixed().expect("fixed heads") as i64;
                let d = self.ty(q).last_fixed().expect("fixed head width") as i64;
                let (qi, ki, vi) = (self.name(q), self.name(k), self.name(v));
                let bi = self.name(bias);
                if self.opset >= 23 {
                    let mask = self.cast_memo(bias, &bi, DType::F32, dt, "bias_cast");
                    let mut attrs = vec![attr_int("is_causal", 0), attr_float("scale", scale)];
                    if dt != DType::F32 {
                        attrs.push(attr_int("softmax_precision", elem_type(DType::F32) as i64));
                    }
                    self.emit("Attention", &[&qi, &ki, &vi, &mask], out, attrs);
                } else {
                    let (kr, vr) = if hq == hkv {
                        (ki, vi)
                    } else {
                        let rep = hq / hkv;
                        let axis = self.ints(&[2]);
                        let shape = self.ints(&[1, 1, rep, 1, 1]);
                        let target = self.ints(&[0, hq, -1, d]);
                        let mut out = Vec::new();
                        for (label, t) in [("k", ki), ("v", vi)] {
                            let u = self.tmp(
                                name,
                                &format!("{label}_unsqueeze"),
                                "Unsqueeze",
                                &[&t, &axis],
                                vec![],
                            );
                            let e = self.tmp(
                                name,
                                &format!("{label}_expand"),
                                "Expand",
                                &[&u, &shape],
                                vec![],
                            );
                            out.push(self.tmp(
                                name,
                                &format!("{label}_repeat"),
                                "Reshape",
                                &[&e, &target],
                                vec![],
                            ));
                        }
                        let vr = out.pop().expect("v");
                        (out.pop().expect("k"), vr)
                    };
                    let kt = self.tmp(
                        name,
                        "k_t",
                        "Transpose",
                        &[&kr],
                        vec![attr_ints("perm", &[0, 1, 3, 2])],
                    );
                    let qk = self.tmp(name, "qk", "MatMul", &[&qi, &kt], vec![]);
                    let sc = self.float_scalar(scale, dt);
                    let scores = self.tmp(name, "scores", "Mul", &[&qk, &sc], vec![]);
                    let scores = self.cast(name, &scores, dt, DType::F32);
                    let biased = self.tmp(name, "biased", "Add", &[&scores, &bi], vec![]);
                    let probs = self.tmp(
                        name,
                        "softmax",
                        "Softmax",
                        &[&biased],
                        vec![attr_int("axis", -1)],
                    );
                    let probs = self.cast(&format!("{name}/probs"), &probs, DType::F32, dt);
                    self.emit("MatMul", &[&probs, &vr], out, vec![]);
                }
            }
            Op::Silu { x } => {
                let xi = self.name(x);
                let s = self.tmp(name, "sigmoid", "Sigmoid", &[&xi], vec![]);
                self.emit("Mul", &[&xi, &s], out, vec![]);
            }
            Op::Mul { a, b } => {
                let (ai, bi) = (self.name(a), self.name(b));
                self.emit("Mul", &[&ai, &bi], out, vec![]);
            }
            Op::Add { a, b } => {
                let (ai, bi) = (self.name(a), self.name(b));
                self.emit("Add", &[&ai, &bi], out, vec![]);
            }
            Op::LastPosition { x } => {
                let xi = self.name(x);
                let (start, end, axes) =
                    (self.ints(&[-1]), self.ints(&[i64::MAX]), self.ints(&[1]));
                let s = self.tmp(name, "slice", "Slice", &[&xi, &start, &end, &axes], vec![]);
                self.emit("Squeeze", &[&s, &axes], out, vec![]);
            }
            Op::OptionLogits { hidden, table, ids } => {
                let t = self.weight(table, false)?;
                let (h, i) = (self.name(hidden), self.name(ids));
                let rows = self.tmp(
                    name,
                    "label_rows",
                    "Gather",
                    &[&t, &i],
                    vec![attr_int("axis", 0)],
                );
                let rows = self.cast(name, &rows, g.constant(table).dtype, DType::F32);
                let axis = self.ints(&[2]);
                let col = self.tmp(name, "hidden_col", "Unsqueeze", &[&h, &axis], vec![]);
                let dot = self.tmp(name, "dot", "MatMul", &[&rows, &col], vec![]);
                self.emit("Squeeze", &[&dot, &axis], out, vec![]);
            }
            Op::DivScalar { x, divisor } => {
                let xi = self.name(x);
                let dt = self.ty(x).dtype;
                let t = self.float_scalar(divisor, dt);
                self.emit("Div", &[&xi, &t], out, vec![]);
            }
            Op::Softmax { x } => {
                let xi = self.name(x);
                self.emit("Softmax", &[&xi], out, vec![attr_int("axis", -1)]);
            }
        }
        Ok(())
    }

    /// `concat(t, t)` on the last axis, unsqueezed to broadcast over heads: `[b, 1, s, d]`, built
    /// once per RoPE table.
    fn full_table(&mut self, t: ValueId) -> Result<String> {
        if let Some(n) = self.memo.get(&(t, "full")) {
            return Ok(n.clone());
        }
        let base = self.name(t);
        let c = self.tmp(
            &base,
            "full",
            "Concat",
            &[&base, &base],
            vec![attr_int("axis", -1)],
        );
        let axis = self.ints(&[1]);
        let u = self.tmp(&base, "per_head", "Unsqueeze", &[&c, &axis], vec![]);
        self.memo.insert((t, "full"), u.clone());
        Ok(u)
    }

    fn cast_memo(
        &mut self,
        v: ValueId,
        name: &str,
        from: DType,
        to: DType,
        key: &'static str,
    ) -> String {
        if from == to {
            return name.to_string();
        }
        if let Some(n) = self.memo.get(&(v, key)) {
            return n.clone();
        }
        let c = self.cast(name, name, from, to);
        self.memo.insert((v, key), c.clone());
        c
    }
}

pub(crate) fn lower(g: &Graph, opset: i64) -> Result<Lowered> {
    let n_values = g
        .nodes()
        .iter()
        .map(|n| n.output.0 + 1)
        .chain(g.inputs().iter().map(|(_, v)| v.0 + 1))
        .max()
        .unwrap_or(0);
    let mut ctx = Ctx {
        g,
        opset,
        nodes: Vec::new(),
        small: Vec::new(),
        small_by_key: HashMap::new(),
        weights: Vec::new(),
        weight_names: HashMap::new(),
        names: vec![String::new(); n_values],
        used: HashSet::new(),
        memo: HashMap::new(),
    };
    for (name, v) in g.inputs().iter().chain(g.outputs()) {
        if !ctx.used.insert(name.clone()) {
            bail!("interface name `{name}` used twice");
        }
        ctx.names[v.0] = name.clone();
    }
    for node in g.nodes() {
        if ctx.names[node.output.0].is_empty() {
            ctx.names[node.output.0] = ctx.unique(&node.name);
        }
    }
    for node in g.nodes() {
        let out = ctx.names[node.output.0].clone();
        ctx.lower_node(&node.name, &node.op, &out)?;
    }
    let facts = g.facts();
    let graph = pb::GraphProto {
        node: ctx.nodes,
        name: "decision".into(),
        initializer: ctx.small,
        doc_string: format!(
            "{} decision model: left-padded input_ids/attention_mask and option_token_ids -> \
             option_logits (label logits at the last position divided by T = {}) and option_probs \
             (their softmax). MatMul weights are stored as [in, out].",
            facts.architecture, facts.temperature
        ),
        input: g
            .inputs()
            .iter()
            .map(|(n, v)| value_info(n, g.value(*v)))
            .collect(),
        output: g
            .outputs()
            .iter()
            .map(|(n, v)| value_info(n, g.value(*v)))
            .collect(),
    };
    let meta = |k: &str, v: String| pb::StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    let model = pb::ModelProto {
        ir_version: ir_version(opset),
        producer_name: "decision-export".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        domain: String::new(),
        model_version: 1,
        doc_string: String::new(),
        graph: Some(graph),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        metadata_props: vec![
            meta("architecture", facts.architecture.into()),
            meta("temperature", facts.temperature.to_string()),
            meta("weights_dtype", facts.dtype.name().into()),
        ],
    };
    Ok(Lowered {
        model,
        weights: ctx.weights,
    })
}
