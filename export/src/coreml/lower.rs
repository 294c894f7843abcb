//! Lowers the [graph description](crate::graph) to a MIL program (Core ML's ML Program), one graph
//! op at a time, into ops of the `CoreML8` opset (iOS 18 / macOS 15).
//!
//! Conventions, as coremltools writes them:
//! - every parameter of every op is bound explicitly, optional ones included (`gather`'s
//!   `batch_dims` and `validate_indices`, `linear`'s `bias`, `slice_by_index`'s masks, …), each to
//!   a `const` op of its own named `<op>_<param>`;
//! - every op carries a `name` attribute equal to its output's name;
//! - float constants of 10 or more elements live in `weight.bin`, smaller ones are immediate
//!   (fp32 as `floats`, fp16 as raw `bytes`, int32 as `ints`);
//! - names are `[A-Za-z0-9_]`: graph names (`layers.0.self_attn.q_proj`) become
//!   `layers_0_self_attn_q_proj`; the interface keeps its contract names.
//!
//! The graph's i64 values (ids, mask, positions) are int32 here (Core ML's integer type); its
//! symbolic `batch` is 1 and `seq` / `options` are unknown dimensions, bounded by the interface's
//! shape ranges.

use std::collections::{HashMap, HashSet};

use anyhow::{Result, bail};

use super::blob::{BlobPlan, BlobSource};
use super::pb::mil_spec as mil;
use crate::graph::{ConstId, DType, Dim, Graph, Op, ValueId, ValueType};

/// The weight file as a program names it.
pub(crate) const WEIGHTS_PATH: &str = "@model_path/weights/weight.bin";
/// The opset of the program's one block.
pub const OPSET: &str = "CoreML8";
/// Float constants with at least this many elements go to `weight.bin` (coremltools' rule).
const BLOB_MIN_ELEMENTS: usize = 10;

/// A tensor type: MIL element type and dimensions (`None` = unknown, bounded by the interface).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TType {
    pub dtype: mil::DataType,
    pub dims: Vec<Option<u64>>,
}

impl TType {
    fn new(dtype: mil::DataType, dims: Vec<Option<u64>>) -> Self {
        Self { dtype, dims }
    }

    fn with_dtype(&self, dtype: mil::DataType) -> Self {
        Self::new(dtype, self.dims.clone())
    }

    fn with_last(&self, last: Option<u64>) -> Self {
        let mut dims = self.dims.clone();
        *dims.last_mut().expect("rank ≥ 1") = last;
        Self::new(self.dtype, dims)
    }
}

/// A named value of the program.
#[derive(Debug, Clone)]
pub(crate) struct Var {
    pub name: String,
    pub ty: TType,
}

/// The element type a graph dtype has in the program.
pub(crate) fn mil_dtype(d: DType) -> mil::DataType {
    match d {
        DType::F32 => mil::DataType::Float32,
        DType::F16 => mil::DataType::Float16,
        DType::I64 => mil::DataType::Int32,
    }
}

fn dtype_str(d: DType) -> &'static str {
    match d {
        DType::F32 => "fp32",
        DType::F16 => "fp16",
        DType::I64 => "int32",
    }
}

/// The program type of a graph value (batch 1, runtime dimensions unknown).
pub(crate) fn ttype(vt: &ValueType) -> TType {
    TType::new(
        mil_dtype(vt.dtype),
        vt.shape
            .iter()
            .map(|d| match d {
                Dim::Batch => Some(1),
                Dim::Fixed(n) => Some(*n as u64),
                Dim::Seq | Dim::Options => None,
            })
            .collect(),
    )
}

pub(crate) fn value_type(t: &TType) -> mil::ValueType {
    use mil::dimension::{ConstantDimension, Dimension, UnknownDimension};
    mil::ValueType {
        r#type: Some(mil::value_type::Type::TensorType(mil::TensorType {
            data_type: t.dtype as i32,
            rank: t.dims.len() as i64,
            dimensions: t
                .dims
                .iter()
                .map(|d| mil::Dimension {
                    dimension: Some(match d {
                        Some(n) => Dimension::Constant(ConstantDimension { size: *n }),
                        None => Dimension::Unknown(UnknownDimension { variadic: false }),
                    }),
                })
                .collect(),
        })),
    }
}

/// Immediate tensor data.
enum Lit {
    I32(Vec<i32>),
    F32(Vec<f32>),
    F16(Vec<f32>),
    Bool(Vec<bool>),
    Str(String),
}

fn immediate(ty: &TType, lit: Lit) -> mil::Value {
    use mil::tensor_value::{
        RepeatedBools, RepeatedBytes, RepeatedFloats, RepeatedInts, RepeatedStrings, Value as TV,
    };
    let tv = match lit {
        Lit::I32(values) => TV::Ints(RepeatedInts { values }),
        Lit::F32(values) => TV::Floats(RepeatedFloats { values }),
        Lit::F16(values) => TV::Bytes(RepeatedBytes {
            values: values
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
        }),
        Lit::Bool(values) => TV::Bools(RepeatedBools { values }),
        Lit::Str(s) => TV::Strings(RepeatedStrings { values: vec![s] }),
    };
    mil::Value {
        r#type: Some(value_type(ty)),
        value: Some(mil::value::Value::ImmediateValue(
            mil::value::ImmediateValue {
                value: Some(mil::value::immediate_value::Value::Tensor(
                    mil::TensorValue { value: Some(tv) },
                )),
            },
        )),
    }
}

fn string_value(s: &str) -> mil::Value {
    immediate(
        &TType::new(mil::DataType::String, vec![]),
        Lit::Str(s.to_string()),
    )
}

/// `[A-Za-z0-9_]`, not starting with a digit.
pub(crate) fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// The lowered program: the block's operations, the function inputs and outputs, and the layout
/// of `weight.bin`.
pub(crate) struct Lowered {
    pub inputs: Vec<Var>,
    pub outputs: Vec<Var>,
    pub operations: Vec<mil::Operation>,
    pub plan: BlobPlan,
}

/// Where one graph op's result goes: its final value is named `name` and has type `ty`; its
/// temporaries are named `<base>_<step>`.
struct Out {
    name: String,
    base: String,
    ty: TType,
}

impl Out {
    /// The (not yet unique) name of temporary `step`.
    fn tmp(&self, step: &str) -> String {
        format!("{}_{step}", self.base)
    }
}

/// The bounds of a `slice_by_index` (stride 1 everywhere).
struct SliceSpec<'a> {
    begin: &'a [i32],
    end: &'a [i32],
    begin_mask: &'a [bool],
    end_mask: &'a [bool],
    squeeze_mask: &'a [bool],
}

struct Lowering<'g> {
    graph: &'g Graph,
    ops: Vec<mil::Operation>,
    names: HashSet<String>,
    reserved: HashSet<String>,
    values: HashMap<ValueId, Var>,
    consts: HashMap<ConstId, Var>,
    zero_bias: HashMap<(usize, mil::DataType), Var>,
    rope_tables: HashMap<(ValueId, ValueId), (Var, Var)>,
    plan: BlobPlan,
}

/// Lower `graph` (batch 1) to MIL operations.
pub(crate) fn lower(graph: &Graph) -> Result<Lowered> {
    let mut l = Lowering {
        graph,
        ops: Vec::new(),
        names: HashSet::new(),
        reserved: graph.outputs().iter().map(|(n, _)| n.clone()).collect(),
        values: HashMap::new(),
        consts: HashMap::new(),
        zero_bias: HashMap::new(),
        rope_tables: HashMap::new(),
        plan: BlobPlan::new(),
    };
    let mut inputs = Vec::new();
    for (name, id) in graph.inputs() {
        let vt = graph.value(*id);
        if vt.dtype != DType::I64 {
            bail!(
                "input `{name}` is {vt}; the Core ML writer expects integer inputs (int32 in Core ML)"
            );
        }
        if sanitize(name) != *name {
            bail!("input name `{name}` is not a valid Core ML name");
        }
        l.names.insert(name.clone());
        let var = Var {
            name: name.clone(),
            ty: ttype(vt),
        };
        l.values.insert(*id, var.clone());
        inputs.push(var);
    }
    let output_of: HashMap<ValueId, &str> = graph
        .outputs()
        .iter()
        .map(|(n, id)| (*id, n.as_str()))
        .collect();
    for node in graph.nodes() {
        let ty = ttype(graph.value(node.output));
        let name = match output_of.get(&node.output) {
            Some(n) => {
                if sanitize(n) != *n || !l.names.insert(n.to_string()) {
                    bail!("output name `{n}` is not a valid, unique Core ML name");
                }
                n.to_string()
            }
            None => l.fresh(&node.name),
        };
        let out = Out {
            name,
            base: sanitize(&node.name),
            ty,
        };
        let var = l.node(&node.op, out)?;
        l.values.insert(node.output, var);
    }
    let mut outputs = Vec::new();
    for (name, id) in graph.outputs() {
        let var = l.values[id].clone();
        if var.name != *name {
            // An output computed under another name (not the case for build_qwen3's graphs).
            let named = Var {
                name: name.clone(),
                ty: var.ty.clone(),
            };
            l.names.insert(name.clone());
            let n = name.clone();
            let v = l.op("identity", n, vec![("x", vec![var])], named.ty.clone());
            outputs.push(v);
        } else {
            outputs.push(var);
        }
    }
    Ok(Lowered {
        inputs,
        outputs,
        operations: l.ops,
        plan: l.plan,
    })
}

impl Lowering<'_> {
    /// A fresh, valid, unused name derived from `base`.
    fn fresh(&mut self, base: &str) -> String {
        let base = sanitize(base);
        let mut name = base.clone();
        let mut i = 0;
        while self.names.contains(&name) || self.reserved.contains(&name) {
            i += 1;
            name = format!("{base}_{i}");
        }
        self.names.insert(name.clone());
        name
    }

    fn val(&self, id: ValueId) -> Var {
        self.values[&id].clone()
    }

    /// Append `name = kind(inputs…)` with output type `out`.
    fn op(&mut self, kind: &str, name: String, inputs: Vec<(&str, Vec<Var>)>, out: TType) -> Var {
        let inputs = inputs
            .into_iter()
            .map(|(param, vars)| {
                let arguments = vars
                    .into_iter()
                    .map(|v| mil::argument::Binding {
                        binding: Some(mil::argument::binding::Binding::Name(v.name)),
                    })
                    .collect();
                (param.to_string(), mil::Argument { arguments })
            })
            .collect();
        self.ops.push(mil::Operation {
            r#type: kind.to_string(),
            inputs,
            outputs: vec![mil::NamedValueType {
                name: name.clone(),
                r#type: Some(value_type(&out)),
            }],
            attributes: [("name".to_string(), string_value(&name))].into(),
        });
        Var { name, ty: out }
    }

    /// A `const` op holding `value` of type `ty`.
    fn const_op(&mut self, name: String, ty: TType, value: mil::Value) -> Var {
        self.ops.push(mil::Operation {
            r#type: "const".into(),
            inputs: Default::default(),
            outputs: vec![mil::NamedValueType {
                name: name.clone(),
                r#type: Some(value_type(&ty)),
            }],
            attributes: [
                ("name".to_string(), string_value(&name)),
                ("val".to_string(), value),
            ]
            .into(),
        });
        Var { name, ty }
    }

    /// A small literal parameter of op `op`: `const <op>_<param>`.
    fn lit(
        &mut self,
        op: &str,
        param: &str,
        dtype: mil::DataType,
        dims: Vec<u64>,
        lit: Lit,
    ) -> Var {
        let name = self.fresh(&format!("{op}_{param}"));
        let ty = TType::new(dtype, dims.into_iter().map(Some).collect());
        let value = immediate(&ty, lit);
        self.const_op(name, ty, value)
    }

    fn int(&mut self, op: &str, param: &str, v: i32) -> Var {
        self.lit(op, param, mil::DataType::Int32, vec![], Lit::I32(vec![v]))
    }

    fn ints(&mut self, op: &str, param: &str, v: &[i32]) -> Var {
        self.lit(
            op,
            param,
            mil::DataType::Int32,
            vec![v.len() as u64],
            Lit::I32(v.to_vec()),
        )
    }

    fn boolean(&mut self, op: &str, param: &str, v: bool) -> Var {
        self.lit(op, param, mil::DataType::Bool, vec![], Lit::Bool(vec![v]))
    }

    fn bools(&mut self, op: &str, param: &str, v: &[bool]) -> Var {
        self.lit(
            op,
            param,
            mil::DataType::Bool,
            vec![v.len() as u64],
            Lit::Bool(v.to_vec()),
        )
    }

    /// A float scalar in `dtype` (fp32 or fp16).
    fn scalar(&mut self, op: &str, param: &str, v: f32, dtype: mil::DataType) -> Var {
        let lit = if dtype == mil::DataType::Float16 {
            Lit::F16(vec![v])
        } else {
            Lit::F32(vec![v])
        };
        self.lit(op, param, dtype, vec![], lit)
    }

    fn string(&mut self, op: &str, param: &str, v: &str) -> Var {
        self.lit(
            op,
            param,
            mil::DataType::String,
            vec![],
            Lit::Str(v.to_string()),
        )
    }

    /// A float tensor constant: in `weight.bin` when large, immediate otherwise.
    fn float_const(
        &mut self,
        name: String,
        dtype: DType,
        shape: &[usize],
        source: BlobSource,
    ) -> Result<Var> {
        let ty = TType::new(
            mil_dtype(dtype),
            shape.iter().map(|n| Some(*n as u64)).collect(),
        );
        let numel: usize = shape.iter().product();
        let value = if numel >= BLOB_MIN_ELEMENTS {
            let offset = self.plan.add(source, dtype, numel)?;
            mil::Value {
                r#type: Some(value_type(&ty)),
                value: Some(mil::value::Value::BlobFileValue(
                    mil::value::BlobFileValue {
                        file_name: WEIGHTS_PATH.into(),
                        offset,
                    },
                )),
            }
        } else {
            let values = match source {
                BlobSource::Const(id) => self.graph.const_f32(id)?,
                BlobSource::Values(v) => v,
            };
            let lit = match dtype {
                DType::F32 => Lit::F32(values),
                DType::F16 => Lit::F16(values),
                DType::I64 => bail!("`{name}`: integer constants are not weights"),
            };
            immediate(&ty, lit)
        };
        Ok(self.const_op(name, ty, value))
    }

    /// The `const` op of a graph constant (emitted once, at first use).
    fn weight(&mut self, id: ConstId) -> Result<Var> {
        if let Some(v) = self.consts.get(&id) {
            return Ok(v.clone());
        }
        let c = self.graph.constant(id);
        let (cname, dtype, shape) = (c.name.clone(), c.dtype, c.shape.clone());
        let name = self.fresh(&cname);
        let var = self.float_const(name, dtype, &shape, BlobSource::Const(id))?;
        self.consts.insert(id, var.clone());
        Ok(var)
    }

    /// The zero bias `linear` gets when the layer has none (coremltools' default, written out).
    fn zero_bias(&mut self, out: usize, dtype: DType) -> Result<Var> {
        let key = (out, mil_dtype(dtype));
        if let Some(v) = self.zero_bias.get(&key) {
            return Ok(v.clone());
        }
        let name = self.fresh(&format!("zero_bias_{out}_{}", dtype.name()));
        let var = self.float_const(name, dtype, &[out], BlobSource::Values(vec![0.0; out]))?;
        self.zero_bias.insert(key, var.clone());
        Ok(var)
    }

    fn cast(&mut self, name: String, x: Var, to: mil::DataType, to_str: &str) -> Var {
        let dtype = self.string(&name, "dtype", to_str);
        let out = x.ty.with_dtype(to);
        self.op(
            "cast",
            name,
            vec![("x", vec![x]), ("dtype", vec![dtype])],
            out,
        )
    }

    fn gather(&mut self, name: String, x: Var, indices: Var, axis: i32, out: TType) -> Var {
        let axis = self.int(&name, "axis", axis);
        let batch_dims = self.int(&name, "batch_dims", 0);
        let validate = self.boolean(&name, "validate_indices", false);
        self.op(
            "gather",
            name,
            vec![
                ("x", vec![x]),
                ("indices", vec![indices]),
                ("axis", vec![axis]),
                ("batch_dims", vec![batch_dims]),
                ("validate_indices", vec![validate]),
            ],
            out,
        )
    }

    fn binary(&mut self, kind: &str, name: String, x: Var, y: Var, out: TType) -> Var {
        self.op(kind, name, vec![("x", vec![x]), ("y", vec![y])], out)
    }

    fn unary(&mut self, kind: &str, name: String, x: Var, out: TType) -> Var {
        self.op(kind, name, vec![("x", vec![x])], out)
    }

    fn reshape(&mut self, name: String, x: Var, shape: &[i32], out: TType) -> Var {
        let shape = self.ints(&name, "shape", shape);
        self.op(
            "reshape",
            name,
            vec![("x", vec![x]), ("shape", vec![shape])],
            out,
        )
    }

    fn transpose(&mut self, name: String, x: Var, perm: &[i32], out: TType) -> Var {
        let perm = self.ints(&name, "perm", perm);
        self.op(
            "transpose",
            name,
            vec![("x", vec![x]), ("perm", vec![perm])],
            out,
        )
    }

    fn expand_dims(&mut self, name: String, x: Var, axes: &[i32], out: TType) -> Var {
        let axes = self.ints(&name, "axes", axes);
        self.op(
            "expand_dims",
            name,
            vec![("x", vec![x]), ("axes", vec![axes])],
            out,
        )
    }

    fn concat(&mut self, name: String, values: Vec<Var>, axis: i32, out: TType) -> Var {
        let axis = self.int(&name, "axis", axis);
        let interleave = self.boolean(&name, "interleave", false);
        self.op(
            "concat",
            name,
            vec![
                ("values", values),
                ("axis", vec![axis]),
                ("interleave", vec![interleave]),
            ],
            out,
        )
    }

    /// `slice_by_index` with every parameter written out.
    fn slice(&mut self, name: String, x: Var, s: &SliceSpec, out: TType) -> Var {
        let rank = s.begin.len();
        let b = self.ints(&name, "begin", s.begin);
        let e = self.ints(&name, "end", s.end);
        let stride = self.ints(&name, "stride", &vec![1; rank]);
        let bm = self.bools(&name, "begin_mask", s.begin_mask);
        let em = self.bools(&name, "end_mask", s.end_mask);
        let sm = self.bools(&name, "squeeze_mask", s.squeeze_mask);
        self.op(
            "slice_by_index",
            name,
            vec![
                ("x", vec![x]),
                ("begin", vec![b]),
                ("end", vec![e]),
                ("stride", vec![stride]),
                ("begin_mask", vec![bm]),
                ("end_mask", vec![em]),
                ("squeeze_mask", vec![sm]),
            ],
            out,
        )
    }

    /// `concat(t, t)` on the last axis of a RoPE table broadcast over heads: `[1, s, d/2]` →
    /// `[1, 1, s, d]`; made once per (cos, sin) pair and shared by every layer.
    fn rope_tables(&mut self, cos: ValueId, sin: ValueId) -> (Var, Var) {
        if let Some(t) = self.rope_tables.get(&(cos, sin)) {
            return t.clone();
        }
        let mut out = Vec::new();
        for (label, id) in [("cos", cos), ("sin", sin)] {
            let x = self.val(id);
            let mut dims = x.ty.dims.clone();
            dims.insert(1, Some(1));
            let e_ty = TType::new(x.ty.dtype, dims);
            let n = self.fresh(&format!("rope_{label}_heads"));
            let e = self.expand_dims(n, x, &[1], e_ty.clone());
            let half = e_ty.dims.last().copied().flatten();
            let full = e_ty.with_last(half.map(|h| 2 * h));
            let n = self.fresh(&format!("rope_{label}_full"));
            out.push(self.concat(n, vec![e.clone(), e], -1, full));
        }
        let pair = (out[0].clone(), out[1].clone());
        self.rope_tables.insert((cos, sin), pair.clone());
        pair
    }

    /// Lower one graph op, one function per op family.
    fn node(&mut self, op: &Op, out: Out) -> Result<Var> {
        Ok(match op {
            Op::Embedding { table, ids } => self.embedding(*table, *ids, out)?,
            Op::Linear { x, weight, bias } => self.linear(*x, *weight, *bias, out)?,
            Op::RmsNorm { x, weight, eps } => self.rms_norm(*x, *weight, *eps, out)?,
            Op::Cast { x, to } => {
                let x = self.val(*x);
                self.cast(out.name, x, mil_dtype(*to), dtype_str(*to))
            }
            Op::SplitHeads { x, heads, head_dim } => self.split_heads(*x, *heads, *head_dim, out),
            Op::MergeHeads { x } => self.merge_heads(*x, out)?,
            Op::PositionIds { mask } => self.position_ids(*mask, out),
            Op::RopeAngles {
                positions,
                inv_freq,
            } => self.rope_angles(*positions, *inv_freq, out)?,
            Op::Cos { x } => self.elementwise("cos", &[*x], out),
            Op::Sin { x } => self.elementwise("sin", &[*x], out),
            Op::Rope { x, cos, sin } => self.rope(*x, (*cos, *sin), out)?,
            Op::AttentionBias { mask, masked } => self.attention_bias(*mask, *masked, out),
            Op::Attention {
                q,
                k,
                v,
                bias,
                scale,
            } => self.attention([*q, *k, *v], *bias, *scale, out)?,
            Op::Silu { x } => self.elementwise("silu", &[*x], out),
            Op::Mul { a, b } => self.elementwise("mul", &[*a, *b], out),
            Op::Add { a, b } => self.elementwise("add", &[*a, *b], out),
            Op::LastPosition { x } => {
                let x = self.val(*x);
                let last = SliceSpec {
                    begin: &[0, -1, 0],
                    end: &[0, 0, 0],
                    begin_mask: &[true, false, true],
                    end_mask: &[true, true, true],
                    squeeze_mask: &[false, true, false],
                };
                self.slice(out.name, x, &last, out.ty)
            }
            Op::OptionLogits { hidden, table, ids } => {
                self.option_logits(*hidden, *table, *ids, out)?
            }
            Op::DivScalar { x, divisor } => {
                let x = self.val(*x);
                let y = self.scalar(&out.name, "y", *divisor, x.ty.dtype);
                self.binary("real_div", out.name, x, y, out.ty)
            }
            Op::Softmax { x } => {
                let x = self.val(*x);
                let axis = self.int(&out.name, "axis", -1);
                self.op(
                    "softmax",
                    out.name,
                    vec![("x", vec![x]), ("axis", vec![axis])],
                    out.ty,
                )
            }
        })
    }

    /// A one-op MIL equivalent: `kind(x)` for one input, `kind(x, y)` for two.
    fn elementwise(&mut self, kind: &str, inputs: &[ValueId], out: Out) -> Var {
        match *inputs {
            [x] => {
                let x = self.val(x);
                self.unary(kind, out.name, x, out.ty)
            }
            [a, b] => {
                let (a, b) = (self.val(a), self.val(b));
                self.binary(kind, out.name, a, b, out.ty)
            }
            _ => unreachable!("elementwise ops take one or two inputs"),
        }
    }

    fn embedding(&mut self, table: ConstId, ids: ValueId, out: Out) -> Result<Var> {
        let table = self.weight(table)?;
        let ids = self.val(ids);
        Ok(self.gather(out.name, table, ids, 0, out.ty))
    }

    /// `linear` with its bias written out (a zero bias when the layer has none).
    fn linear(
        &mut self,
        x: ValueId,
        weight: ConstId,
        bias: Option<ConstId>,
        out: Out,
    ) -> Result<Var> {
        let x = self.val(x);
        let w = self.weight(weight)?;
        let c = self.graph.constant(weight);
        let (out_dim, dtype) = (c.shape[0], c.dtype);
        let b = match bias {
            Some(b) => self.weight(b)?,
            None => self.zero_bias(out_dim, dtype)?,
        };
        Ok(self.op(
            "linear",
            out.name,
            vec![("x", vec![x]), ("weight", vec![w]), ("bias", vec![b])],
            out.ty,
        ))
    }

    /// `x · rsqrt(mean(x²) + eps) · weight`, in fp32.
    fn rms_norm(&mut self, x: ValueId, weight: ConstId, eps: f32, out: Out) -> Result<Var> {
        let x = self.val(x);
        if x.ty.dtype != mil::DataType::Float32 {
            bail!(
                "{}: RMSNorm input must be fp32 (the graph casts around it)",
                out.base
            );
        }
        let w = self.weight(weight)?;
        let n = self.fresh(&out.tmp("square"));
        let sq = self.binary("mul", n, x.clone(), x.clone(), x.ty.clone());
        let n = self.fresh(&out.tmp("mean"));
        let axes = self.ints(&n, "axes", &[-1]);
        let keep = self.boolean(&n, "keep_dims", true);
        let mean_ty = x.ty.with_last(Some(1));
        let mean = self.op(
            "reduce_mean",
            n,
            vec![
                ("x", vec![sq]),
                ("axes", vec![axes]),
                ("keep_dims", vec![keep]),
            ],
            mean_ty.clone(),
        );
        let n = self.fresh(&out.tmp("rsqrt"));
        let epsilon = self.scalar(&n, "epsilon", eps, mil::DataType::Float32);
        let inv = self.op(
            "rsqrt",
            n,
            vec![("x", vec![mean]), ("epsilon", vec![epsilon])],
            mean_ty,
        );
        let n = self.fresh(&out.tmp("normed"));
        let normed = self.binary("mul", n, x.clone(), inv, x.ty.clone());
        Ok(self.binary("mul", out.name, normed, w, out.ty))
    }

    /// `[1, s, heads·d]` → `[1, heads, s, d]`.
    fn split_heads(&mut self, x: ValueId, heads: usize, head_dim: usize, out: Out) -> Var {
        let x = self.val(x);
        let r_ty = TType::new(
            x.ty.dtype,
            vec![Some(1), None, Some(heads as u64), Some(head_dim as u64)],
        );
        let n = self.fresh(&out.tmp("reshape"));
        let r = self.reshape(n, x, &[1, -1, heads as i32, head_dim as i32], r_ty);
        self.transpose(out.name, r, &[0, 2, 1, 3], out.ty)
    }

    /// `[1, heads, s, d]` → `[1, s, heads·d]`.
    fn merge_heads(&mut self, x: ValueId, out: Out) -> Result<Var> {
        let x = self.val(x);
        let d = &x.ty.dims;
        let (heads, width) = match (d.get(1).copied().flatten(), d.get(3).copied().flatten()) {
            (Some(h), Some(w)) => (h, w),
            _ => bail!("{}: merge_heads needs fixed heads and head width", out.base),
        };
        let t_ty = TType::new(x.ty.dtype, vec![Some(1), None, Some(heads), Some(width)]);
        let n = self.fresh(&out.tmp("transpose"));
        let tr = self.transpose(n, x, &[0, 2, 1, 3], t_ty);
        Ok(self.reshape(out.name, tr, &[1, -1, (heads * width) as i32], out.ty))
    }

    /// `max(cumsum(mask) − 1, 0)`: positions counted over real tokens only.
    fn position_ids(&mut self, mask: ValueId, out: Out) -> Var {
        let m = self.val(mask);
        let n = self.fresh(&out.tmp("cumsum"));
        let axis = self.int(&n, "axis", 1);
        let exclusive = self.boolean(&n, "exclusive", false);
        let reverse = self.boolean(&n, "reverse", false);
        let c = self.op(
            "cumsum",
            n,
            vec![
                ("x", vec![m.clone()]),
                ("axis", vec![axis]),
                ("exclusive", vec![exclusive]),
                ("reverse", vec![reverse]),
            ],
            m.ty.clone(),
        );
        let n = self.fresh(&out.tmp("minus_one"));
        let one = self.int(&n, "y", 1);
        let c1 = self.binary("sub", n, c, one, m.ty.clone());
        let zero = self.int(&out.name, "y", 0);
        self.binary("maximum", out.name, c1, zero, out.ty)
    }

    /// `float(positions)[.., None] · inv_freq`.
    fn rope_angles(&mut self, positions: ValueId, inv_freq: ConstId, out: Out) -> Result<Var> {
        let p = self.val(positions);
        let f = self.weight(inv_freq)?;
        let n = self.fresh(&out.tmp("float"));
        let pf = self.cast(n, p, mil::DataType::Float32, "fp32");
        let mut dims = pf.ty.dims.clone();
        dims.push(Some(1));
        let n = self.fresh(&out.tmp("column"));
        let pe = self.expand_dims(n, pf, &[-1], TType::new(mil::DataType::Float32, dims));
        Ok(self.binary("mul", out.name, pe, f, out.ty))
    }

    /// `x · cos + rotate_half(x) · sin`, the tables shared by every layer.
    fn rope(&mut self, x: ValueId, (cos, sin): (ValueId, ValueId), out: Out) -> Result<Var> {
        let (c, s) = self.rope_tables(cos, sin);
        let x = self.val(x);
        let d = x.ty.dims.last().copied().flatten().unwrap_or(0);
        if d == 0 || d % 2 != 0 {
            bail!("{}: RoPE needs an even, fixed head width", out.base);
        }
        let h = (d / 2) as i32;
        let half_ty = x.ty.with_last(Some(d / 2));
        let first = SliceSpec {
            begin: &[0, 0, 0, 0],
            end: &[0, 0, 0, h],
            begin_mask: &[true, true, true, true],
            end_mask: &[true, true, true, false],
            squeeze_mask: &[false; 4],
        };
        let second = SliceSpec {
            begin: &[0, 0, 0, h],
            end: &[0, 0, 0, 0],
            begin_mask: &[true, true, true, false],
            end_mask: &[true, true, true, true],
            squeeze_mask: &[false; 4],
        };
        let n = self.fresh(&out.tmp("x1"));
        let x1 = self.slice(n, x.clone(), &first, half_ty.clone());
        let n = self.fresh(&out.tmp("x2"));
        let x2 = self.slice(n, x.clone(), &second, half_ty.clone());
        let n = self.fresh(&out.tmp("neg_x2"));
        let minus = self.scalar(&n, "y", -1.0, x.ty.dtype);
        let neg = self.binary("mul", n, x2, minus, half_ty);
        let n = self.fresh(&out.tmp("rotated"));
        let rot = self.concat(n, vec![neg, x1], -1, x.ty.clone());
        let n = self.fresh(&out.tmp("x_cos"));
        let a = self.binary("mul", n, x.clone(), c, x.ty.clone());
        let n = self.fresh(&out.tmp("rot_sin"));
        let b = self.binary("mul", n, rot, s, x.ty.clone());
        Ok(self.binary("add", out.name, a, b, out.ty))
    }

    /// The additive attention bias `[1, 1, s, s]` from the padding mask: 0 where a query may
    /// attend (causal and a real key), `masked` elsewhere.
    fn attention_bias(&mut self, mask: ValueId, masked: f32, out: Out) -> Var {
        let m = self.val(mask);
        let i32t = mil::DataType::Int32;
        let n = self.fresh(&out.tmp("shape"));
        let shp = self.unary("shape", n, m.clone(), TType::new(i32t, vec![Some(2)]));
        let n = self.fresh(&out.tmp("seq"));
        let one = self.int(&n, "indices", 1);
        let seq = self.gather(n, shp, one, 0, TType::new(i32t, vec![]));
        let n = self.fresh(&out.tmp("range"));
        let start = self.int(&n, "start", 0);
        let step = self.int(&n, "step", 1);
        let idx = self.op(
            "range_1d",
            n,
            vec![
                ("end", vec![seq]),
                ("start", vec![start]),
                ("step", vec![step]),
            ],
            TType::new(i32t, vec![None]),
        );
        let n = self.fresh(&out.tmp("rows"));
        let rows = self.expand_dims(n, idx.clone(), &[1], TType::new(i32t, vec![None, Some(1)]));
        let n = self.fresh(&out.tmp("cols"));
        let cols = self.expand_dims(n, idx, &[0], TType::new(i32t, vec![Some(1), None]));
        let n = self.fresh(&out.tmp("causal"));
        let causal = self.binary(
            "less_equal",
            n,
            cols,
            rows,
            TType::new(mil::DataType::Bool, vec![None, None]),
        );
        let n = self.fresh(&out.tmp("mask_4d"));
        let m4 = self.expand_dims(
            n,
            m,
            &[1, 2],
            TType::new(i32t, vec![Some(1), Some(1), Some(1), None]),
        );
        let n = self.fresh(&out.tmp("key_real"));
        let one = self.int(&n, "y", 1);
        let real = self.binary(
            "equal",
            n,
            m4,
            one,
            TType::new(mil::DataType::Bool, vec![Some(1), Some(1), Some(1), None]),
        );
        let n = self.fresh(&out.tmp("allowed"));
        let allowed = self.binary(
            "logical_and",
            n,
            causal,
            real,
            TType::new(mil::DataType::Bool, vec![Some(1), Some(1), None, None]),
        );
        // bias = (1 − allowed) · masked: 0 where allowed, `masked` elsewhere. (Not `select`: its
        // result type follows `a` and `b` only, which are scalars here.)
        let f32t = mil::DataType::Float32;
        let n = self.fresh(&out.tmp("allowed_fp32"));
        let allowed = self.cast(n, allowed, f32t, "fp32");
        let n = self.fresh(&out.tmp("blocked"));
        let one = self.scalar(&n, "x", 1.0, f32t);
        let blocked = self.binary("sub", n, one, allowed, out.ty.clone());
        let neg = self.scalar(&out.name, "y", masked, f32t);
        self.binary("mul", out.name, blocked, neg, out.ty)
    }

    /// `scaled_dot_product_attention` in fp32, key/value heads repeated for grouped-query
    /// attention and any scale other than 1/√d folded into the query.
    fn attention(
        &mut self,
        [q, k, v]: [ValueId; 3],
        bias: ValueId,
        scale: f32,
        out: Out,
    ) -> Result<Var> {
        let (mut q, mut k, mut v) = (self.val(q), self.val(k), self.val(v));
        let bias = self.val(bias);
        let heads = |x: &Var| x.ty.dims.get(1).copied().flatten();
        let (Some(hq), Some(hkv)) = (heads(&q), heads(&k)) else {
            bail!("{}: attention needs fixed head counts", out.base);
        };
        if hkv == 0 || hq % hkv != 0 {
            bail!(
                "{}: {hq} query heads are not a multiple of {hkv} key/value heads",
                out.base
            );
        }
        let d = q.ty.dims.last().copied().flatten().unwrap_or(0);
        if hq != hkv {
            // Grouped-query attention: query head i reads kv head i / (hq / hkv), each kv head
            // repeated consecutively (transformers' repeat_kv), by an explicit gather.
            let rep = hq / hkv;
            let index: Vec<i32> = (0..hq).map(|i| (i / rep) as i32).collect();
            let mut repeated = Vec::new();
            for (label, x) in [("k", k.clone()), ("v", v.clone())] {
                let n = self.fresh(&out.tmp(&format!("{label}_repeat")));
                let idx = self.ints(&n, "indices", &index);
                let mut dims = x.ty.dims.clone();
                dims[1] = Some(hq);
                let ty = TType::new(x.ty.dtype, dims);
                repeated.push(self.gather(n, x, idx, 1, ty));
            }
            v = repeated.pop().expect("v");
            k = repeated.pop().expect("k");
        }
        let dt = q.ty.dtype;
        let f32t = mil::DataType::Float32;
        if dt != f32t {
            // The precision policy: attention probabilities are computed in fp32.
            for (label, x) in [("q", &mut q), ("k", &mut k), ("v", &mut v)] {
                let n = self.fresh(&out.tmp(&format!("{label}_fp32")));
                *x = self.cast(n, x.clone(), f32t, "fp32");
            }
        }
        // scaled_dot_product_attention divides by sqrt(d); any other scale is folded into the
        // query.
        let factor = scale as f64 * (d as f64).sqrt();
        if (factor - 1.0).abs() > 1e-6 {
            let n = self.fresh(&out.tmp("q_scaled"));
            let y = self.scalar(&n, "y", factor as f32, f32t);
            let ty = q.ty.clone();
            q = self.binary("mul", n, q, y, ty);
        }
        let out32 = out.ty.with_dtype(f32t);
        let sdpa_name = if dt == f32t {
            out.name.clone()
        } else {
            self.fresh(&out.tmp("sdpa"))
        };
        let a = self.op(
            "scaled_dot_product_attention",
            sdpa_name,
            vec![
                ("query", vec![q]),
                ("key", vec![k]),
                ("value", vec![v]),
                ("attn_mask", vec![bias]),
            ],
            out32,
        );
        Ok(if dt == f32t {
            a
        } else {
            self.cast(out.name, a, dt, "fp16")
        })
    }

    /// The option logits: the label tokens' rows of the output table times the last hidden
    /// state, in fp32.
    fn option_logits(
        &mut self,
        hidden: ValueId,
        table: ConstId,
        ids: ValueId,
        out: Out,
    ) -> Result<Var> {
        let h = self.val(hidden);
        let ids = self.val(ids);
        let table_var = self.weight(table)?;
        let width = self.graph.constant(table).shape[1] as u64;
        let rows_ty = TType::new(table_var.ty.dtype, vec![Some(1), None, Some(width)]);
        let n = self.fresh(&out.tmp("rows"));
        let mut rows = self.gather(n, table_var, ids, 0, rows_ty.clone());
        let f32t = mil::DataType::Float32;
        if rows_ty.dtype != f32t {
            let n = self.fresh(&out.tmp("rows_fp32"));
            rows = self.cast(n, rows, f32t, "fp32");
        }
        let n = self.fresh(&out.tmp("hidden_column"));
        let col = self.expand_dims(
            n,
            h,
            &[-1],
            TType::new(f32t, vec![Some(1), Some(width), Some(1)]),
        );
        let n = self.fresh(&out.tmp("matmul"));
        let tx = self.boolean(&n, "transpose_x", false);
        let ty_ = self.boolean(&n, "transpose_y", false);
        let lg = self.op(
            "matmul",
            n,
            vec![
                ("x", vec![rows]),
                ("y", vec![col]),
                ("transpose_x", vec![tx]),
                ("transpose_y", vec![ty_]),
            ],
            TType::new(f32t, vec![Some(1), None, Some(1)]),
        );
        let axes = self.ints(&out.name, "axes", &[-1]);
        Ok(self.op(
            "squeeze",
            out.name,
            vec![("x", vec![lg]), ("axes", vec![axes])],
            out.ty,
        ))
    }
}
