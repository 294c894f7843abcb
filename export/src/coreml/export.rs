//! `--formats coreml`: write `model.mlpackage`, check its structure, and hold it to the
//! reference with coremltools where a Python has it.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use super::{CoremlFacts, CoremlOptions, check, verify, write_coreml};
use crate::format::{Reference, Written};
use crate::graph::Graph;
use crate::parity;

/// Write `model.mlpackage` into `dir` and check it: its structure in Rust always, then the
/// coremltools check (`scripts/check_coreml.py`: load, rebuild, evaluate, parity with the
/// reference) when a Python with coremltools is there. A failed check is an error (nothing is
/// published); a check that could not run is recorded as such in `verified_with`.
pub(crate) fn export(
    graph: &Graph,
    opts: CoremlOptions,
    dir: &Path,
    reference: &Reference,
) -> Result<Written<CoremlFacts>> {
    use parity::Scorer;
    let dtype = graph.facts().dtype;
    let files = write_coreml(graph, opts, dir)?;
    let facts = files.facts.clone();
    let mut lines = vec![format!(
        "model     {}: Core ML ML Program (specificationVersion {}, {}, {}+), {} weights, seq 1..={}, \
         options 1..={}",
        facts.file,
        facts.specification_version,
        facts.opset,
        facts.minimum_deployment,
        facts.dtype,
        facts.max_seq,
        facts.max_options
    )];
    let summary = verify::structure(&files.package)
        .with_context(|| format!("checking the {} just written", facts.file))?;
    let mut checks = vec![json!({
        "check": "structure",
        "file": facts.file,
        "runtime": format!("decision-export {} (Rust)", env!("CARGO_PKG_VERSION")),
        "what": "Manifest.json, specificationVersion, ML Program version, function, opset, and every \
                 blobFileValue's weight.bin record (sentinel, dtype, size, alignment, blob count)",
        "operations": summary.operations,
        "weight_blobs": summary.weight_blobs,
        "weight_bytes": summary.weight_bytes,
        "passed": true,
    })];
    match check::find_python() {
        check::Python::Ready {
            interpreter,
            versions,
        } => {
            let samples =
                check::samples_from(reference.recorded, reference.batches, reference.temperature)?;
            let tolerance = parity::tolerance(dtype);
            let report = check::run_check(
                &interpreter,
                &files.package,
                &samples,
                check::CheckArgs {
                    tolerance: Some(tolerance),
                    pad_id: reference.pad_id,
                    budget: check::EXPORT_BUDGET,
                    products: check::Products::Auto,
                },
            )?;
            report.ensure()?;
            let dp = report.max_abs_dp.unwrap_or(f64::NAN);
            let what = report.describe_values();
            lines.push(format!(
                "parity    {} vs {}: {what} (samples from {}), max |Δp| {:.2e} (tolerance {:.0e}), \
                 picks agree",
                report.runtime,
                reference.recorded.describe(),
                reference.samples_from,
                dp,
                tolerance
            ));
            checks.push(json!({
                "check": "parity",
                "file": facts.file,
                "runtime": report.runtime,
                "python": format!("{} ({versions})", interpreter.display()),
                "reference": reference.recorded.describe(),
                "dtype": dtype.name(),
                "samples": report.samples,
                "samples_from": reference.samples_from,
                "what": what,
                "states_given": report.states_given,
                "states_checked": report.states_checked,
                "padded": report.padded,
                "tokens": report.tokens,
                "budget": report.budget,
                "budget_limited": report.budget_limited,
                "max_abs_dp": report.max_abs_dp,
                "max_abs_dlogit": report.max_abs_dlogit,
                "tolerance": tolerance,
                "pick_mismatches": report.pick_mismatches,
                "near_ties": report.near_ties,
                "steps": report.steps,
                "numpy_fallbacks": report.numpy_fallbacks,
                "f32_products": report.f32_products,
                "passed": true,
            }));
        }
        check::Python::Missing { reason } => {
            lines.push(format!(
                "parity    {}: NOT RUN: {reason}. Only its structure was checked; \
                 manifest.json's verified_with records this",
                facts.file
            ));
            checks.push(json!({
                "check": "parity",
                "file": facts.file,
                "runtime": "coremltools",
                "ran": false,
                "passed": false,
                "reason": reason,
            }));
        }
    }
    Ok(Written {
        lines,
        checks,
        facts,
    })
}
