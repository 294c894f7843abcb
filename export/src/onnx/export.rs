//! `--formats onnx`: write `model.onnx` and hold it to the reference in tract.

use std::path::Path;

use anyhow::Result;
use serde_json::json;

use super::probes::{self, PROBES_FILE, ProbeFile};
use super::{DATA_FILE, MODEL_FILE, OnnxOptions, write_onnx};
use crate::bundle::OnnxFacts;
use crate::format::{Reference, Written};
use crate::graph::Graph;
use crate::parity::{self, TractModel};

/// Write `model.onnx` (and `model.onnx.data`) into `dir` and run the parity gate on it in tract;
/// a failed gate is an error (nothing is published).
pub(crate) fn export(
    graph: &Graph,
    opts: OnnxOptions,
    dir: &Path,
    reference: &Reference,
    probes: &ProbeFile,
    max_options: usize,
) -> Result<Written<OnnxFacts>> {
    let dtype = graph.facts().dtype;
    let opset = opts.opset;
    let files = write_onnx(graph, opts, dir)?;
    let candidate = TractModel::load(&files.model)?;
    let report = parity::compare(
        MODEL_FILE,
        &candidate,
        reference.recorded,
        reference.batches,
        dtype,
    )?;
    report.ensure()?;
    // What bundle verify will run again: written, and run here first.
    decision_data::atomic::write_atomic(dir.join(PROBES_FILE), &probes.to_jsonl()?)?;
    let (probed, probe_dp) = probes::check(dir, &candidate, dtype, max_options)?;
    let lines = vec![
        format!(
            "model     model.onnx: opset {}, {} weights{}",
            opset,
            dtype.name(),
            if files.data.is_some() {
                ", external data in model.onnx.data"
            } else {
                ""
            }
        ),
        format!(
            "parity    {} vs {}: {} samples from {}, max |Δp| {:.2e} (tolerance {:.0e}), picks agree{}",
            report.runtime,
            report.reference,
            report.samples,
            reference.samples_from,
            report.max_abs_dp,
            report.tolerance,
            if report.near_ties > 0 {
                format!(" ({} near-ties)", report.near_ties)
            } else {
                String::new()
            }
        ),
        format!(
            "probes    {}: {probed} probe states (2 to {max_options} options) for bundle verify, \
             max |Δp| {probe_dp:.2e}",
            PROBES_FILE
        ),
    ];
    let mut entry = serde_json::to_value(&report)?;
    entry["check"] = json!("parity");
    entry["samples_from"] = json!(reference.samples_from);
    Ok(Written {
        lines,
        checks: vec![entry],
        facts: OnnxFacts {
            file: MODEL_FILE.into(),
            external_data: files.data.as_ref().map(|_| DATA_FILE.to_string()),
            opset,
        },
    })
}
