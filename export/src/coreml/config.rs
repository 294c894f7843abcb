//! `coreml_config.json` (contracts section 5): a description of `model.mlpackage`'s inputs,
//! outputs and shapes. keel accepts a model folder only when a file of this name is in it (it
//! never reads it). The description is read back from the package just written, so it says what
//! the package holds, not what the writer meant to write. [`read`] reads it back for
//! `decision bundle verify`.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};

use super::pb;

pub const FILE: &str = "coreml_config.json";
pub const SCHEMA: &str = "decision-coreml-config/1";

/// What `decision bundle verify` holds `coreml_config.json` to: its schema (checked by [`read`])
/// and the package it describes (`None`: the bundle holds no `model.mlpackage`). The rest of
/// what [`describe`] writes is description, read by people, not checked.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CoremlConfig {
    pub schema: String,
    /// The package's bundle-relative name; `null` when there is none.
    pub package: Option<String>,
}

/// Read `coreml_config.json` at `path`: a JSON object of schema [`SCHEMA`] with a `package`
/// (a name or `null`). Errors say what is wrong, not where (the caller names the file).
pub fn read(path: &Path) -> Result<CoremlConfig> {
    let text = std::fs::read_to_string(path).context("cannot be read")?;
    let json: Value = serde_json::from_str(&text).context("not valid JSON")?;
    match json.get("schema") {
        Some(Value::String(s)) if s == SCHEMA => {}
        Some(other) => bail!("schema is {other}, this build reads {SCHEMA:?}"),
        None => bail!("no schema (this build reads {SCHEMA:?})"),
    }
    if json.get("package").is_none() {
        bail!("no `package` (the package's name, or null when the bundle holds none)");
    }
    serde_json::from_value(json).context("not a Core ML config")
}

fn array_dtype(t: i32) -> &'static str {
    use pb::array_feature_type::ArrayDataType as D;
    match D::try_from(t) {
        Ok(D::Int32) => "int32",
        Ok(D::Float32) => "float32",
        Ok(D::Float16) => "float16",
        Ok(D::Double) => "float64",
        _ => "unknown",
    }
}

fn feature(f: &pb::FeatureDescription, output: bool) -> Result<Value> {
    let Some(pb::feature_type::Type::MultiArrayType(a)) =
        f.r#type.as_ref().and_then(|t| t.r#type.as_ref())
    else {
        bail!("feature {:?} is not a multi-array", f.name);
    };
    let mut v = json!({
        "name": f.name,
        "dtype": array_dtype(a.data_type),
        "description": f.short_description,
    });
    if let Some(pb::array_feature_type::ShapeFlexibility::ShapeRange(r)) = &a.shape_flexibility {
        let ranges: Vec<[i64; 2]> = r
            .size_ranges
            .iter()
            .map(|s| [s.lower_bound as i64, s.upper_bound])
            .collect();
        v["shape_range"] = json!(ranges);
    }
    if !a.shape.is_empty() {
        v["default_shape"] = json!(a.shape);
    }
    if output {
        // Core ML infers output shapes from the program: [1, options], options being
        // option_token_ids's length.
        v["shape"] = json!([1, "options"]);
    } else {
        let dim = if f.name == "option_token_ids" {
            "options"
        } else {
            "seq"
        };
        v["shape"] = json!([1, dim]);
    }
    Ok(v)
}

/// The description of the package at `package` (bundle-relative name `file`), or of its absence.
pub fn describe(package: Option<(&Path, &str)>) -> Result<Value> {
    let Some((package, file)) = package else {
        return Ok(json!({
            "schema": SCHEMA,
            "package": null,
            "note": "this bundle holds no model.mlpackage (export with --formats coreml for one); \
                     decision-worker runs model.onnx",
        }));
    };
    let model = super::read_model(package)?;
    let d = model
        .description
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{file}: the model has no description"))?;
    let inputs = d
        .input
        .iter()
        .map(|f| feature(f, false))
        .collect::<Result<Vec<_>>>()?;
    let outputs = d
        .output
        .iter()
        .map(|f| feature(f, true))
        .collect::<Result<Vec<_>>>()?;
    let meta = d.metadata.as_ref();
    let user = |k: &str| meta.and_then(|m| m.user_defined.get(k)).cloned();
    Ok(json!({
        "schema": SCHEMA,
        "package": file,
        "specification_version": model.specification_version,
        "opset": super::OPSET,
        "minimum_deployment": "macOS 15 / iOS 18",
        "dtype": user("dtype"),
        "temperature_applied": user("temperature").and_then(|t| t.parse::<f64>().ok()),
        "inputs": inputs,
        "outputs": outputs,
        "left_padded": true,
        "prompt": "decision.json",
        "tokenizer": "tokenizer.json",
    }))
}
