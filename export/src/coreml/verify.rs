//! `decision bundle verify` for `model.mlpackage`: re-read the package and check its structure
//! in Rust (Core ML itself runs only on Apple platforms; the coremltools check is [`super::check`]).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::package::Layout;
use super::pb::{self, mil_spec as mil};
use super::{
    CoremlFacts, FUNCTION, OPSET, PROGRAM_VERSION, SPECIFICATION_VERSION, WEIGHTS_PATH, blob,
    read_model,
};

/// `model.mlpackage` in a bundle: its [`structure`] and the facts the manifest states about it.
pub(crate) fn check(dir: &Path, c: &CoremlFacts) -> Result<()> {
    let pkg = dir.join(&c.file);
    let summary = structure(&pkg)?;
    let model = read_model(&pkg)?;
    let dtype = model
        .description
        .as_ref()
        .and_then(|d| d.metadata.as_ref())
        .and_then(|m| m.user_defined.get("dtype"))
        .cloned()
        .unwrap_or_default();
    if dtype != c.dtype {
        anyhow::bail!("holds {dtype:?} weights, the manifest says {:?}", c.dtype);
    }
    if summary.operations != c.operations || summary.weight_blobs != c.weight_blobs {
        anyhow::bail!(
            "has {} operations and {} weight blobs, the manifest says {} and {}",
            summary.operations,
            summary.weight_blobs,
            c.operations,
            c.weight_blobs
        );
    }
    Ok(())
}

/// What [`structure`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PackageSummary {
    pub operations: usize,
    pub weight_blobs: usize,
    pub weight_bytes: u64,
}

/// Re-read a package and check its structure: the manifest, specification version, program
/// version, function and opset, and that every `blobFileValue` points at an aligned metadata
/// record with the right sentinel, dtype and size, covering exactly the blobs the header counts.
pub fn structure(package: &Path) -> Result<PackageSummary> {
    let model = read_model(package)?;
    let at = package.display();
    if model.specification_version != SPECIFICATION_VERSION {
        bail!(
            "{at}: specificationVersion {}, expected {SPECIFICATION_VERSION}",
            model.specification_version
        );
    }
    let Some(pb::model::Type::MlProgram(program)) = &model.r#type else {
        bail!("{at}: the model is not an ML Program");
    };
    if program.version != PROGRAM_VERSION {
        bail!(
            "{at}: program version {}, expected {PROGRAM_VERSION}",
            program.version
        );
    }
    let function = program
        .functions
        .get(FUNCTION)
        .with_context(|| format!("{at}: no function `{FUNCTION}`"))?;
    if function.opset != OPSET {
        bail!("{at}: opset {}, expected {OPSET}", function.opset);
    }
    let block = function
        .block_specializations
        .get(OPSET)
        .with_context(|| format!("{at}: no block for opset {OPSET}"))?;
    let weights_path = Layout::new(package).weights();
    let file = std::fs::read(&weights_path)
        .with_context(|| format!("reading {}", weights_path.display()))?;
    let count = blob::read_header(&file).with_context(|| weights_path.display().to_string())?;
    let mut seen = BTreeSet::new();
    let mut bytes = 0;
    for op in &block.operations {
        for value in op.attributes.values() {
            let Some(mil::value::Value::BlobFileValue(b)) = &value.value else {
                continue;
            };
            let name = op.outputs.first().map(|o| o.name.as_str()).unwrap_or("?");
            if b.file_name != WEIGHTS_PATH {
                bail!(
                    "{at}: const `{name}` reads {}, expected {WEIGHTS_PATH}",
                    b.file_name
                );
            }
            let record = blob::read_record(&file, b.offset)
                .with_context(|| format!("{}: const `{name}`", weights_path.display()))?;
            let Some(mil::value_type::Type::TensorType(t)) =
                value.r#type.as_ref().and_then(|t| t.r#type.as_ref())
            else {
                bail!("{at}: const `{name}` has no tensor type");
            };
            let (code, size) = match mil::DataType::try_from(t.data_type) {
                Ok(mil::DataType::Float16) => (1, 2),
                Ok(mil::DataType::Float32) => (2, 4),
                _ => bail!("{at}: const `{name}`: blob of an unsupported element type"),
            };
            let mut numel = 1u64;
            for d in &t.dimensions {
                match d.dimension {
                    Some(mil::dimension::Dimension::Constant(c)) => numel *= c.size,
                    _ => bail!("{at}: const `{name}` has a dimension of unknown size"),
                }
            }
            if record.dtype_code != code || record.bytes != numel * size {
                bail!(
                    "{}: const `{name}` at offset {}: the record says dtype {} and {} bytes, the \
                     program says dtype {code} and {} bytes",
                    weights_path.display(),
                    b.offset,
                    record.dtype_code,
                    record.bytes,
                    numel * size
                );
            }
            if seen.insert(b.offset) {
                bytes += record.bytes;
            }
        }
    }
    if seen.len() != count as usize {
        bail!(
            "{}: the header counts {count} blobs, the program reads {}",
            weights_path.display(),
            seen.len()
        );
    }
    Ok(PackageSummary {
        operations: block
            .operations
            .iter()
            .filter(|o| o.r#type != "const")
            .count(),
        weight_blobs: seen.len(),
        weight_bytes: bytes,
    })
}
