//! `decision bundle verify` for `model.onnx`: its interface, opset, external data and size
//! ([`check`]), then, on a bundle sound in every other respect, the model on its probe states
//! again ([`rerun_probes`]).

use std::path::Path;

use anyhow::{Context, Result};
use decision_prompt::DecisionSpec;

use super::probes::{self, PROBES_FILE};
use super::{model_opset, pb, read_model};
use crate::bundle::{self, Manifest, OnnxFacts};
use crate::graph::DType;
use crate::parity::TractModel;

/// `model.onnx` in a bundle: it decodes, has the contract's interface and the manifest's opset,
/// its external data stays inside its file, and it holds the manifest's parameter count.
pub(crate) fn check(dir: &Path, o: &OnnxFacts, m: &Manifest) -> Result<()> {
    let model = read_model(&dir.join(&o.file))?;
    let opset = model_opset(&model);
    if opset != Some(o.opset) {
        anyhow::bail!("imports opset {opset:?}, the manifest says {}", o.opset);
    }
    let graph = model.graph.context("no graph")?;
    let signature = |vi: &pb::ValueInfoProto| -> (String, i32, usize) {
        match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(pb::type_proto::Value::TensorType(t)) => (
                vi.name.clone(),
                t.elem_type,
                t.shape.as_ref().map_or(0, |s| s.dim.len()),
            ),
            None => (vi.name.clone(), 0, 0),
        }
    };
    let (i64_t, f32_t) = (
        pb::tensor_proto::DataType::Int64 as i32,
        pb::tensor_proto::DataType::Float as i32,
    );
    let want_in = [
        ("input_ids", i64_t),
        ("attention_mask", i64_t),
        ("option_token_ids", i64_t),
    ];
    let want_out = [("option_logits", f32_t), ("option_probs", f32_t)];
    let got_in: Vec<_> = graph.input.iter().map(signature).collect();
    let got_out: Vec<_> = graph.output.iter().map(signature).collect();
    let want = |w: &[(&str, i32)]| -> Vec<(String, i32, usize)> {
        w.iter().map(|(n, t)| (n.to_string(), *t, 2)).collect()
    };
    if got_in != want(&want_in) || got_out != want(&want_out) {
        anyhow::bail!(
            "interface {got_in:?} -> {got_out:?} is not the contract's (input_ids, attention_mask, option_token_ids: int64 \
             [batch, seq|options] -> option_logits, option_probs: float [batch, options])"
        );
    }
    let mut parameters = 0u64;
    for t in &graph.initializer {
        if !t.name.starts_with("const/") {
            parameters += t.dims.iter().product::<i64>().max(0) as u64;
        }
        if t.data_location == pb::tensor_proto::DataLocation::External as i32 {
            let get = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key == k)
                    .map(|e| e.value.as_str())
            };
            let location = get("location")
                .with_context(|| format!("tensor {} has no external location", t.name))?;
            if o.external_data.as_deref() != Some(location) {
                anyhow::bail!(
                    "tensor {} lives in {location:?}, not the manifest's external data file",
                    t.name
                );
            }
            let size = std::fs::metadata(dir.join(location))
                .with_context(|| format!("{location} is missing"))?
                .len();
            let offset: u64 = get("offset")
                .unwrap_or("0")
                .parse()
                .context("external offset")?;
            let length: u64 = get("length")
                .context("external length")?
                .parse()
                .context("external length")?;
            if offset + length > size {
                anyhow::bail!(
                    "tensor {} reads {location} up to byte {}, the file has {size}",
                    t.name,
                    offset + length
                );
            }
        }
    }
    if parameters != m.model.parameters {
        anyhow::bail!(
            "holds {parameters} weight parameters, the manifest says {}",
            m.model.parameters
        );
    }
    Ok(())
}

/// What the probe file was called before it became JSON Lines (contracts section 5).
const LEGACY_PROBES_FILE: &str = "probes.json";

/// Run `model.onnx` on the bundle's probe states with tract and hold it to their recorded answers.
pub(crate) fn rerun_probes(dir: &Path, o: &OnnxFacts, m: &Manifest) -> Result<()> {
    if !m.files.iter().any(|f| f.path == PROBES_FILE) {
        if m.files.iter().any(|f| f.path == LEGACY_PROBES_FILE) {
            anyhow::bail!(
                "missing: the bundle holds {LEGACY_PROBES_FILE}, the one-document probe file of \
                 exports before 2026-12-07; export it again to write {PROBES_FILE}"
            );
        }
        anyhow::bail!(
            "missing: a bundle with {} must hold the probe states its export recorded, to run \
             the model on again",
            o.file
        );
    }
    let dtype = match m.model.dtype.as_str() {
        "f32" => DType::F32,
        "f16" => DType::F16,
        other => anyhow::bail!("manifest.json: model.dtype {other:?} is not f32 or f16"),
    };
    let spec = DecisionSpec::from_file(&dir.join(bundle::DECISION))
        .with_context(|| format!("reading {}", bundle::DECISION))?;
    let model = TractModel::load(&dir.join(&o.file))?;
    probes::check(dir, &model, dtype, spec.max_options).map(|_| ())
}
