//! `decision export` and `decision bundle verify`: arguments and the command flows.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use crate::bundle::{
    self, AdapterFacts, FileEntry, Formats, Manifest, ModelFacts, OnnxFacts, Staging,
};
use crate::coreml::{self, CoremlOptions, check as coreml_check};
use crate::graph::{DType, GraphOptions, build_qwen3};
use crate::onnx::{self, OnnxOptions};
use crate::parity::{self, Recorded, TractModel};
use crate::source::{BurnScorer, Origin, Source};
use crate::verify;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// model.onnx (+ model.onnx.data)
    Onnx,
    /// adapter/ in PEFT's layout (needs a LoRA model)
    Peft,
    /// model.mlpackage (Core ML ML Program)
    Coreml,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightDtype {
    F32,
    F16,
}

/// Export a trained decision model as the bundle the desktop harness loads.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  decision export --run runs/tiny-lora-v2 --formats onnx,peft --out demo-out/bundle
  decision export --model Qwen/Qwen3-0.6B --adapter my-lora --thresholds thresholds.json \\
      --formats onnx,peft --dtype f16 --check-data states.parquet --out bundle
  DECISION_PYTHON=.ci/venv-coreml/bin/python \\
      decision export --run runs/tiny-lora-v2 --formats onnx,coreml --out demo-out/bundle

The model files apply decision.json's `temperature`; a harness that calibrates per decision
point computes softmax(option_logits * temperature / temperatures[point]).
Before manifest.json is written, each model file is run in-process on sample states and compared
with the training-side forward pass (max |dp| <= 1e-4 for f32 weights, <= 2e-3 for f16, same
picks); on failure nothing is published. model.onnx runs in tract. model.mlpackage (Core ML runs
only on Apple platforms) is always checked for structure in Rust, and its option_probs are
reproduced with coremltools (scripts/check_coreml.py) when $DECISION_PYTHON (else python3) imports
coremltools; manifest.json's verified_with says which checks ran.")]
pub struct ExportArgs {
    /// A run folder written by `decision train` (its final/ model, adapter and validation states)
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    pub run: Option<PathBuf>,
    /// A Hugging Face Qwen3 checkpoint: a local folder or a Hub id `owner/name[@revision]`
    #[arg(long)]
    pub model: Option<String>,
    /// A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) for --model;
    /// merged into the model files
    #[arg(long, requires = "model")]
    pub adapter: Option<PathBuf>,
    /// thresholds.json from `decision fit`, copied into the bundle after a schema check
    #[arg(long)]
    pub thresholds: Option<PathBuf>,
    /// Comma-separated formats to write
    #[arg(long, value_enum, value_delimiter = ',', default_value = "onnx")]
    pub formats: Vec<Format>,
    /// The bundle folder to create
    #[arg(long)]
    pub out: PathBuf,
    /// Storage type of the model-file weights (norms stay f32) [default: f32 for ONNX, f16 for
    /// Core ML]
    #[arg(long, value_enum)]
    pub dtype: Option<WeightDtype>,
    /// ONNX opset: 18 (decomposed standard ops) or 23 (RMSNormalization, RotaryEmbedding, Attention)
    #[arg(long, default_value_t = 18, value_parser = clap::value_parser!(i64).range(18..=23))]
    pub opset: i64,
    /// Store the ONNX weights in model.onnx.data even when under 2 GB
    #[arg(long)]
    pub external_data: bool,
    /// States to run the parity gate on (default: the run's validation states, or built-in probes)
    #[arg(long)]
    pub check_data: Option<PathBuf>,
    /// At most this many sample states for the parity gate
    #[arg(long, default_value_t = 32)]
    pub check_samples: usize,
    /// Replace an existing bundle at --out
    #[arg(long)]
    pub force: bool,
    /// decision.json's point rules for decision-worker, in order, replacing keel's default
    /// (`pre_step=inspect,implement,verify,answer` then `intake`): `POINT=ID,ID,...` names the
    /// point of a request offering exactly those candidate ids; a bare `POINT` (last) is the rest
    #[arg(long = "point-rule", value_name = "POINT[=IDS]")]
    pub point_rules: Vec<String>,
}

/// `--point-rule` values as decision.json's rules.
pub fn parse_point_rules(args: &[String]) -> Result<Vec<decision_train::spec::PointRule>> {
    args.iter()
        .map(|a| {
            let (point, ids) = match a.split_once('=') {
                Some((p, ids)) => (p, Some(ids)),
                None => (a.as_str(), None),
            };
            Ok(decision_train::spec::PointRule {
                point: point.trim().to_string(),
                candidates: ids.map(|ids| {
                    ids.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                }),
            })
        })
        .collect()
}

/// Inspect a bundle.
#[derive(Debug, Subcommand)]
pub enum BundleCmd {
    /// Check hashes, JSON schemas, tokenizer label ids and the model interface; exit 1 on any mismatch
    #[command(after_help = "Example:\n  decision bundle verify demo-out/bundle")]
    Verify {
        /// The bundle folder
        bundle: PathBuf,
    },
}

impl BundleCmd {
    pub fn run(&self) -> Result<ExitCode> {
        match self {
            BundleCmd::Verify { bundle } => {
                if !bundle.is_dir() {
                    bail!("{}: not a folder", bundle.display());
                }
                let v = verify::verify(bundle);
                for n in &v.notes {
                    eprintln!("note: {n}");
                }
                if v.ok() {
                    println!(
                        "ok: {} verified ({} files)",
                        bundle.display(),
                        v.files_checked
                    );
                    Ok(ExitCode::SUCCESS)
                } else {
                    for p in &v.problems {
                        eprintln!("{}: {p}", bundle.display());
                    }
                    eprintln!(
                        "FAILED: {} problem(s) in {}",
                        v.problems.len(),
                        bundle.display()
                    );
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

impl ExportArgs {
    pub fn run(&self) -> Result<ExitCode> {
        let summary = export(self)?;
        for line in summary {
            println!("{line}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

fn origin(args: &ExportArgs) -> Result<Origin> {
    Ok(match (&args.run, &args.model) {
        (Some(run), _) => Origin::Run(run.clone()),
        (None, Some(src)) => Origin::Model {
            src: src.clone(),
            adapter: args.adapter.clone(),
        },
        (None, None) => bail!("give --run RUN_DIR or --model SRC"),
    })
}

fn check_args(args: &ExportArgs) -> Result<()> {
    if args.formats.is_empty() {
        bail!("--formats lists nothing to write");
    }
    if let Some(t) = &args.thresholds {
        verify::check_thresholds(t).with_context(|| format!("--thresholds {}", t.display()))?;
    }
    Ok(())
}

/// `--out` may not be, hold or lie inside anything the export reads (the run, the model, the
/// adapter, the thresholds, the check states); checked before any work, `--force` or not.
fn check_paths(args: &ExportArgs) -> Result<()> {
    let mut io = decision_data::paths::IoCheck::new();
    if let Some(run) = &args.run {
        decision_train::cli::model_or_run_inputs(&mut io, "--run", run);
    }
    if let Some(m) = &args.model
        && std::path::Path::new(m).exists()
    {
        io.input("--model", m);
    }
    if let Some(a) = &args.adapter {
        io.input("--adapter", a);
    }
    if let Some(t) = &args.thresholds {
        io.input("--thresholds", t);
    }
    if let Some(d) = &args.check_data {
        io.input("--check-data", d);
    }
    io.output_folder("--out", &args.out).check()
}

/// Run an export; returns the summary lines. `--out` is checked (and its staging folder made, so
/// an unwritable location fails now) before the model is read.
pub fn export(args: &ExportArgs) -> Result<Vec<String>> {
    check_args(args)?;
    check_paths(args)?;
    let staging = Staging::new(&args.out, args.force)?;
    let source = Source::open(
        &origin(args)?,
        args.check_data.as_deref(),
        args.check_samples,
    )?;
    export_into(source, args, staging)
}

/// Export an opened [`Source`] (the model, its reference and samples) as `args` say.
pub fn export_from(source: Source, args: &ExportArgs) -> Result<Vec<String>> {
    check_args(args)?;
    check_paths(args)?;
    let staging = Staging::new(&args.out, args.force)?;
    export_into(source, args, staging)
}

/// The export proper, into `staging` (removed again if anything fails).
fn export_into(source: Source, args: &ExportArgs, staging: Staging) -> Result<Vec<String>> {
    check_args(args)?;
    let origin = origin(args)?;
    let has = |f: Format| args.formats.contains(&f);
    let chosen = args.dtype.map(|d| match d {
        WeightDtype::F32 => DType::F32,
        WeightDtype::F16 => DType::F16,
    });
    // ONNX weights default to f32, Core ML's to f16 (the Core ML default); --dtype sets both.
    let dtype = chosen.unwrap_or(if has(Format::Onnx) {
        DType::F32
    } else {
        DType::F16
    });
    let coreml_dtype = chosen.unwrap_or(DType::F16);
    if has(Format::Peft) && source.adapter.is_none() {
        bail!("--formats peft needs a LoRA model: a LoRA run, or --model with --adapter");
    }
    let mut spec = source.model.spec.clone();
    // The harness truncates to what the model can take.
    spec.max_tokens = source.model.prompter.max_tokens;
    // How decision-worker names a request's point (keel's requests do not carry one).
    if !args.point_rules.is_empty() {
        spec.point_rules = parse_point_rules(&args.point_rules)?;
    } else if spec.point_rules.is_empty() {
        spec.point_rules = decision_train::spec::keel_point_rules();
    }
    spec.validate().context("--point-rule")?;
    let temperature = spec.temperature;
    // The reference's answers first; then its weights are freed before any model file is
    // loaded, so peak memory is one model, not two.
    let batches = source.batches(8)?;
    let pad_id = source.model.pad_id;
    let reference = Recorded::record(
        &BurnScorer {
            model: &source.model,
            temperature,
            label: source.reference.clone(),
        },
        &batches,
    )?;
    let Source {
        model_dir,
        base,
        config,
        config_json,
        model,
        weights,
        adapter,
        samples_from,
        ..
    } = source;
    drop(model);
    let graph_of = |dtype: DType| {
        build_qwen3(
            &config,
            weights.clone(),
            GraphOptions {
                dtype,
                temperature: temperature as f32,
            },
        )
    };
    let graph = graph_of(dtype)?;

    let dir = staging.path().to_path_buf();
    decision_data::atomic::write_json_atomic(dir.join(bundle::DECISION), &spec)?;
    let tok_src = model_dir.join(bundle::TOKENIZER);
    std::fs::copy(&tok_src, dir.join(bundle::TOKENIZER))
        .with_context(|| format!("copying {}", tok_src.display()))?;
    if let Some(t) = &args.thresholds {
        std::fs::copy(t, dir.join(bundle::THRESHOLDS))
            .with_context(|| format!("copying {}", t.display()))?;
    }

    let mut lines = Vec::new();
    let mut verified = Vec::new();
    let mut formats = Formats::default();
    if has(Format::Onnx) {
        let files = onnx::write_onnx(
            &graph,
            OnnxOptions {
                opset: args.opset,
                external_data: args.external_data,
            },
            &dir,
        )?;
        let candidate = TractModel::load(&files.model)?;
        let report = parity::compare(onnx::MODEL_FILE, &candidate, &reference, &batches, dtype)?;
        report.ensure()?;
        lines.push(format!(
            "parity    {} vs {}: {} samples from {}, max |Δp| {:.2e} (tolerance {:.0e}), picks agree{}",
            report.runtime,
            report.reference,
            report.samples,
            samples_from,
            report.max_abs_dp,
            report.tolerance,
            if report.near_ties > 0 { format!(" ({} near-ties)", report.near_ties) } else { String::new() }
        ));
        let mut entry = serde_json::to_value(&report)?;
        entry["check"] = json!("parity");
        entry["samples_from"] = json!(samples_from);
        verified.push(entry);
        lines.insert(
            0,
            format!(
                "model     model.onnx: opset {}, {} weights{}",
                args.opset,
                dtype.name(),
                if files.data.is_some() {
                    ", external data in model.onnx.data"
                } else {
                    ""
                }
            ),
        );
        formats.onnx = Some(OnnxFacts {
            file: onnx::MODEL_FILE.into(),
            external_data: files.data.as_ref().map(|_| onnx::DATA_FILE.to_string()),
            opset: args.opset,
        });
    }
    if has(Format::Coreml) {
        let g = if coreml_dtype == dtype {
            graph.clone()
        } else {
            graph_of(coreml_dtype)?
        };
        let opts = CoremlOptions {
            max_seq: spec.max_tokens.max(1),
            max_options: spec.max_options.max(1),
        };
        let (coreml_lines, checks, facts) = export_coreml(
            &g,
            opts,
            &dir,
            &reference,
            &batches,
            temperature,
            pad_id,
            &samples_from,
        )?;
        lines.extend(coreml_lines);
        verified.extend(checks);
        formats.coreml = Some(facts);
    }
    if let Some(adapter) = &adapter
        && has(Format::Peft)
    {
        adapter.write_peft(&dir.join(bundle::ADAPTER_DIR))?;
        formats.peft = Some(bundle::ADAPTER_DIR.into());
        lines.push(format!(
            "adapter   adapter/: PEFT LoRA r {} alpha {} on {} modules",
            adapter.r,
            adapter.alpha,
            adapter.modules.len()
        ));
    }

    // keel accepts a model folder only when it holds coreml_config.json.
    let coreml_config = coreml::config::describe(
        formats
            .coreml
            .as_ref()
            .map(|c| (dir.join(&c.file), c.file.clone()))
            .as_ref()
            .map(|(p, f)| (p.as_path(), f.as_str())),
    )?;
    decision_data::atomic::write_json_atomic(dir.join(coreml::config::FILE), &coreml_config)?;

    let mut points: Vec<String> = spec
        .points
        .iter()
        .chain(spec.temperatures.keys())
        .cloned()
        .collect();
    points.sort();
    points.dedup();
    let files: Vec<FileEntry> = bundle::file_entries(&dir)?;
    let manifest = Manifest {
        schema: bundle::SCHEMA.into(),
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        producer: format!("decision-export {}", env!("CARGO_PKG_VERSION")),
        model: ModelFacts {
            architecture: graph.facts().architecture.into(),
            base: base.clone(),
            adapter: adapter.as_ref().map(|a| AdapterFacts {
                source: match &origin {
                    Origin::Run(_) => model_dir.join(bundle::ADAPTER_DIR).display().to_string(),
                    Origin::Model { adapter, .. } => adapter
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                },
                r: a.r,
                alpha: a.alpha,
                target_modules: a.target_modules.clone(),
                included: formats.peft.is_some(),
            }),
            parameters: graph.parameter_count(),
            dtype: dtype.name().into(),
            temperature,
            config: config_json.clone(),
        },
        points,
        formats,
        files,
        verified_with: verified,
    };
    let count = manifest.files.len();
    decision_data::atomic::write_json_atomic(dir.join(bundle::MANIFEST), &manifest)?;
    let out = staging.publish()?;
    lines.push(format!(
        "bundle    {} ({} files + manifest.json)",
        out.display(),
        count
    ));
    Ok(lines)
}

/// Write `model.mlpackage` into `dir` and check it: its structure in Rust always, then the
/// coremltools check (`scripts/check_coreml.py`: load, rebuild, evaluate, parity with the
/// reference) when a Python with coremltools is there. A failed check is an error (nothing is
/// published); a check that could not run is recorded as such in `verified_with`.
#[allow(clippy::too_many_arguments)]
fn export_coreml(
    graph: &crate::graph::Graph,
    opts: CoremlOptions,
    dir: &std::path::Path,
    reference: &Recorded,
    batches: &[parity::Batch],
    temperature: f64,
    pad_id: u32,
    samples_from: &str,
) -> Result<(Vec<String>, Vec<serde_json::Value>, coreml::CoremlFacts)> {
    use parity::Scorer;
    let dtype = graph.facts().dtype;
    let files = coreml::write_coreml(graph, opts, dir)?;
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
    let summary = coreml::verify_package(&files.package)
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
    match coreml_check::find_python() {
        coreml_check::Python::Ready {
            interpreter,
            versions,
        } => {
            let samples = coreml_check::samples_from(reference, batches, temperature)?;
            let tolerance = parity::tolerance(dtype);
            let report = coreml_check::run_check(
                &interpreter,
                &files.package,
                &samples,
                Some(tolerance),
                pad_id,
            )?;
            report.ensure()?;
            let dp = report.max_abs_dp.unwrap_or(f64::NAN);
            lines.push(format!(
                "parity    {} vs {}: {} evaluations of {} samples from {} (as given and left-padded), \
                 max |Δp| {:.2e} (tolerance {:.0e}), picks agree",
                report.runtime,
                reference.describe(),
                report.samples,
                samples.len(),
                samples_from,
                dp,
                tolerance
            ));
            checks.push(json!({
                "check": "parity",
                "file": facts.file,
                "runtime": report.runtime,
                "python": format!("{} ({versions})", interpreter.display()),
                "reference": reference.describe(),
                "dtype": dtype.name(),
                "samples": report.samples,
                "samples_from": samples_from,
                "max_abs_dp": report.max_abs_dp,
                "max_abs_dlogit": report.max_abs_dlogit,
                "tolerance": tolerance,
                "pick_mismatches": report.pick_mismatches,
                "near_ties": report.near_ties,
                "steps": report.steps,
                "numpy_fallbacks": report.numpy_fallbacks,
                "passed": true,
            }));
        }
        coreml_check::Python::Missing { reason } => {
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
    Ok((lines, checks, facts))
}
