//! The Core ML writer: lowers the [graph description](crate::graph) to an ML Program and writes
//! `model.mlpackage` for Core ML on macOS 15 / iOS 18 and later.
//!
//! - `Data/com.apple.CoreML/model.mlmodel`: a `Model` protobuf, `specificationVersion` 9, type
//!   `mlProgram` (field 502): program version 1, one function `main`, opset `CoreML8`. The message
//!   types come from `proto/coreml/*.proto` (our own subset of Apple's spec) via `prost`.
//! - `Data/com.apple.CoreML/weights/weight.bin`: the weights in MIL blob storage ([`blob`]).
//! - `Manifest.json` ([`package`]).
//!
//! Interface (contracts section 5, batch 1): `input_ids`, `attention_mask` int32 `[1, seq]`
//! (left-padded; `seq` a range `1..=max_seq`), `option_token_ids` int32 `[1, options]` (`options` a
//! range `1..=max_options`) → `option_logits`, `option_probs` fp32 `[1, options]`, the temperature
//! applied. Weights fp16 (the Core ML default) or fp32, as the graph stores them.
//!
//! Nothing here runs Core ML (it exists only on Apple platforms). [`verify::structure`] re-reads
//! a package and checks its structure in Rust; [`check`] runs `scripts/check_coreml.py`, which
//! rebuilds the program with coremltools and evaluates it, when Python with coremltools is there.

pub mod blob;
pub mod check;
pub mod config;
pub(crate) mod export;
mod lower;
pub mod package;
pub mod verify;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use decision_data::atomic::{AtomicFile, StagedDir, write_atomic};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::graph::{DType, Graph};
pub use lower::OPSET;
pub(crate) use lower::WEIGHTS_PATH;
use package::Layout;
pub(crate) use package::PACKAGE_DIR;

/// The generated Core ML message types (`CoreML.Specification`, and `MILSpec` inside it).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/core_ml.specification.rs"));
    /// `CoreML.Specification.MILSpec`: the ML Program.
    pub mod mil_spec {
        include!(concat!(
            env!("OUT_DIR"),
            "/core_ml.specification.mil_spec.rs"
        ));
    }
}

use pb::mil_spec as mil;

/// Core ML specification version 9: iOS 18 / macOS 15 (the first with `scaled_dot_product_attention`).
pub const SPECIFICATION_VERSION: i32 = 9;
/// The ML Program version.
pub(crate) const PROGRAM_VERSION: i64 = 1;
/// The program's one function.
pub const FUNCTION: &str = "main";

/// The interface's shape ranges (batch is always 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoremlOptions {
    /// Upper bound of the sequence length (`decision.json`'s `max_tokens`, or the model's context).
    pub max_seq: usize,
    /// Upper bound of the option count (`decision.json`'s `max_options`).
    pub max_options: usize,
}

/// Facts about `model.mlpackage` for the bundle manifest (`formats.coreml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoremlFacts {
    pub file: String,
    pub specification_version: i32,
    pub opset: String,
    /// The oldest OS that loads it.
    pub minimum_deployment: String,
    /// Storage and compute type of the weights (`f16`, `f32`); norms, attention probabilities and
    /// the option logits are fp32 either way.
    pub dtype: String,
    pub batch: usize,
    pub max_seq: usize,
    pub max_options: usize,
    pub operations: usize,
    pub weight_blobs: usize,
}

/// What [`write_coreml`] wrote.
#[derive(Debug, Clone)]
pub struct CoremlFiles {
    /// The `model.mlpackage` folder.
    pub package: PathBuf,
    pub facts: CoremlFacts,
}

fn array_type(dtype: pb::array_feature_type::ArrayDataType) -> pb::ArrayFeatureType {
    pb::ArrayFeatureType {
        data_type: dtype as i32,
        ..Default::default()
    }
}

fn feature(name: &str, doc: &str, array: pb::ArrayFeatureType) -> pb::FeatureDescription {
    pb::FeatureDescription {
        name: name.into(),
        short_description: doc.into(),
        r#type: Some(pb::FeatureType {
            r#type: Some(pb::feature_type::Type::MultiArrayType(array)),
            is_optional: false,
        }),
    }
}

/// An int32 input `[1, n]` with `n` in `1..=max` (default `default`).
fn ranged_input(name: &str, doc: &str, default: usize, max: usize) -> pb::FeatureDescription {
    use pb::array_feature_type::{ArrayDataType, ShapeFlexibility, ShapeRange};
    let mut array = array_type(ArrayDataType::Int32);
    array.shape = vec![1, default.clamp(1, max) as i64];
    array.shape_flexibility = Some(ShapeFlexibility::ShapeRange(ShapeRange {
        size_ranges: vec![
            pb::SizeRange {
                lower_bound: 1,
                upper_bound: 1,
            },
            pb::SizeRange {
                lower_bound: 1,
                upper_bound: max as i64,
            },
        ],
    }));
    feature(name, doc, array)
}

fn input_doc(name: &str) -> &'static str {
    match name {
        "input_ids" => "Prompt token ids, left-padded: the last position is the answer slot",
        "attention_mask" => "1 for prompt tokens, 0 for left padding",
        "option_token_ids" => "Token ids of the offered options' labels, in order",
        _ => "",
    }
}

fn output_doc(name: &str) -> &'static str {
    match name {
        "option_logits" => "Label logits of the offered options, divided by the temperature",
        "option_probs" => "softmax(option_logits): one probability per offered option",
        _ => "",
    }
}

fn description(graph: &Graph, opts: CoremlOptions) -> Result<pb::ModelDescription> {
    let mut input = Vec::new();
    for (name, _) in graph.inputs() {
        let (default, max) = if name == "option_token_ids" {
            (2, opts.max_options)
        } else {
            (opts.max_seq.min(64), opts.max_seq)
        };
        input.push(ranged_input(name, input_doc(name), default, max));
    }
    let mut output = Vec::new();
    for (name, id) in graph.outputs() {
        if graph.value(*id).dtype != DType::F32 {
            bail!("output `{name}` is not f32; Core ML outputs here are fp32");
        }
        output.push(feature(
            name,
            output_doc(name),
            array_type(pb::array_feature_type::ArrayDataType::Float32),
        ));
    }
    let facts = graph.facts();
    let user_defined: BTreeMap<String, String> = [
        ("architecture", facts.architecture.to_string()),
        ("dtype", facts.dtype.name().to_string()),
        ("temperature", facts.temperature.to_string()),
        (
            "producer",
            format!("decision-export {}", env!("CARGO_PKG_VERSION")),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(pb::ModelDescription {
        input,
        output,
        metadata: Some(pb::Metadata {
            short_description: format!(
                "Decision model ({}): option probabilities for a left-padded prompt",
                facts.architecture
            ),
            version_string: env!("CARGO_PKG_VERSION").into(),
            author: "decision-export".into(),
            license: String::new(),
            user_defined,
        }),
    })
}

/// Lower `graph` into a `Model` message and the layout of its weight file.
fn build(graph: &Graph, opts: CoremlOptions) -> Result<(pb::Model, blob::BlobPlan, usize)> {
    if opts.max_seq == 0 || opts.max_options == 0 {
        bail!("the Core ML interface needs max_seq and max_options of at least 1");
    }
    let lowered = lower::lower(graph)?;
    let op_count = lowered
        .operations
        .iter()
        .filter(|o| o.r#type != "const")
        .count();
    let function = mil::Function {
        inputs: lowered
            .inputs
            .iter()
            .map(|v| mil::NamedValueType {
                name: v.name.clone(),
                r#type: Some(lower::value_type(&v.ty)),
            })
            .collect(),
        opset: OPSET.into(),
        block_specializations: [(
            OPSET.to_string(),
            mil::Block {
                outputs: lowered.outputs.iter().map(|v| v.name.clone()).collect(),
                operations: lowered.operations,
            },
        )]
        .into(),
    };
    let program = mil::Program {
        version: PROGRAM_VERSION,
        functions: [(FUNCTION.to_string(), function)].into(),
    };
    let model = pb::Model {
        specification_version: SPECIFICATION_VERSION,
        description: Some(description(graph, opts)?),
        r#type: Some(pb::model::Type::MlProgram(program)),
    };
    Ok((model, lowered.plan, op_count))
}

/// Lower `graph` and write `dir/model.mlpackage`. The package is assembled in a hidden sibling
/// folder and renamed into place (replacing an older one; [`StagedDir`]), so a reader never sees
/// half of it.
pub fn write_coreml(graph: &Graph, opts: CoremlOptions, dir: &Path) -> Result<CoremlFiles> {
    let (model, plan, op_count) = build(graph, opts)?;
    let staged = StagedDir::create(dir.join(PACKAGE_DIR))?;
    let layout = Layout::new(staged.path());
    std::fs::create_dir_all(layout.weights_dir())
        .with_context(|| format!("creating {}", layout.weights_dir().display()))?;
    let weights = layout.weights();
    let mut f = AtomicFile::create(&weights)?;
    let bar = decision_data::progress::task(plan.blobs().len() as u64, "writing Core ML weights");
    blob::write_blobs(&plan, graph, &mut f, &mut || bar.inc(1))
        .with_context(|| format!("writing {}", weights.display()))?;
    bar.finish_and_clear();
    f.flush()?;
    f.commit()?;
    let bytes = model.encode_to_vec();
    write_atomic(layout.model(), &bytes)?;
    let manifest = serde_json::to_vec_pretty(&package::manifest(&bytes))?;
    write_atomic(layout.manifest(), &manifest)?;
    let final_path = staged.publish()?;
    Ok(CoremlFiles {
        package: final_path,
        facts: CoremlFacts {
            file: PACKAGE_DIR.into(),
            specification_version: SPECIFICATION_VERSION,
            opset: OPSET.into(),
            minimum_deployment: "macOS 15 / iOS 18".into(),
            dtype: graph.facts().dtype.name().into(),
            batch: 1,
            max_seq: opts.max_seq,
            max_options: opts.max_options,
            operations: op_count,
            weight_blobs: plan.blobs().len(),
        },
    })
}

/// Read the `Model` message of a package.
pub fn read_model(package: &Path) -> Result<pb::Model> {
    let item = package::read_manifest(package)?;
    let path = package.join("Data").join(item);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    pb::Model::decode(bytes.as_slice())
        .with_context(|| format!("{}: not a Core ML model", path.display()))
}
