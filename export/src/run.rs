//! The export pipeline behind `decision export`: open the model, record the training-side
//! reference, write each requested format into a staging folder, check every model file against
//! the reference (the parity gate), write decision.json, coreml_config.json and manifest.json, and
//! publish the bundle; on any failure nothing is published. [`run`] takes the options the command
//! line parses ([`ExportOptions`]); [`run_from`] takes an already opened [`Source`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::bundle::{self, AdapterFacts, FileEntry, Formats, Manifest, ModelFacts, Staging};
use crate::coreml::{self, CoremlOptions};
use crate::format::Reference;
use crate::graph::{DType, GraphOptions, build_qwen3};
use crate::onnx::{self, OnnxOptions};
use crate::parity::Recorded;
use crate::source::{BurnScorer, Origin, Source};
use crate::verify;

/// A bundle format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// model.onnx (+ model.onnx.data)
    Onnx,
    /// adapter/ in PEFT's layout (needs a LoRA model)
    Peft,
    /// model.mlpackage (Core ML ML Program)
    Coreml,
}

/// The storage type of the model files' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightDtype {
    F32,
    F16,
}

/// What to export and where: the arguments of `decision export` (each field's text is its
/// `--help` line).
#[derive(Debug, Clone, Args)]
pub struct ExportOptions {
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
    /// Comma-separated formats to write (onnx or coreml among them: a bundle holds a model file)
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
fn parse_point_rules(args: &[String]) -> Result<Vec<decision_prompt::spec::PointRule>> {
    args.iter()
        .map(|a| {
            let (point, ids) = match a.split_once('=') {
                Some((p, ids)) => (p, Some(ids)),
                None => (a.as_str(), None),
            };
            Ok(decision_prompt::spec::PointRule {
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

/// The points a request can be given under decision.json's point rules `rules` (as
/// decision-worker names them, [`decision_prompt::DecisionSpec::point_for`]): each rule's point,
/// except a rule that can never be the first to match (after a catch-all, or offering the same
/// candidate set as an earlier rule); with no catch-all, `point_for`'s own fallback `intake` too.
fn producible_points(rules: &[decision_prompt::spec::PointRule]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeSet<Vec<&str>> = BTreeSet::new();
    for r in rules {
        match &r.candidates {
            None => {
                out.insert(r.point.clone());
                return out;
            }
            Some(ids) => {
                let mut set: Vec<&str> = ids.iter().map(String::as_str).collect();
                set.sort_unstable();
                set.dedup();
                if seen.insert(set) {
                    out.insert(r.point.clone());
                }
            }
        }
    }
    out.insert("intake".into());
    out
}

/// A warning when thresholds.json names points that none of the point `rules` produces:
/// decision-worker never gives a request those points, so their thresholds go unused (unless it
/// runs with `--point`), while the requests land at points the file may have no threshold for.
fn unproduced_points_warning<'a>(
    rules: &[decision_prompt::spec::PointRule],
    threshold_points: impl Iterator<Item = &'a str>,
) -> Option<String> {
    let producible = producible_points(rules);
    let missing: Vec<&str> = threshold_points
        .filter(|p| !producible.contains(*p))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let produced: Vec<&str> = producible.iter().map(String::as_str).collect();
    Some(format!(
        "warning: thresholds.json fits points {} that no point rule in decision.json produces \
         (its rules give {}): decision-worker never uses those thresholds (unless started with \
         --point) and escalates every request at a point without one; name the points with \
         --point-rule POINT=IDS",
        missing.join(", "),
        produced.join(", ")
    ))
}

/// Run an export; returns the summary lines (a warning's begins `warning: `). `--out` is checked
/// (and its staging folder made, so an unwritable location fails now) before the model is read.
pub fn run(opts: &ExportOptions) -> Result<Vec<String>> {
    let staging = prepare(opts)?;
    let source = Source::open(
        &origin(opts)?,
        opts.check_data.as_deref(),
        opts.check_samples,
    )?;
    export_into(source, opts, staging)
}

/// Export an opened [`Source`] (the model, its reference and samples) as `opts` say.
pub fn run_from(source: Source, opts: &ExportOptions) -> Result<Vec<String>> {
    let staging = prepare(opts)?;
    export_into(source, opts, staging)
}

/// The checks made before any work, then the staging folder.
fn prepare(opts: &ExportOptions) -> Result<Staging> {
    check_args(opts)?;
    check_paths(opts)?;
    Staging::new(&opts.out, opts.force)
}

fn origin(opts: &ExportOptions) -> Result<Origin> {
    Ok(match (&opts.run, &opts.model) {
        (Some(run), _) => Origin::Run(run.clone()),
        (None, Some(src)) => Origin::Model {
            src: src.clone(),
            adapter: opts.adapter.clone(),
        },
        (None, None) => bail!("give --run RUN_DIR or --model SRC"),
    })
}

fn check_args(opts: &ExportOptions) -> Result<()> {
    if opts.formats.is_empty() {
        bail!("--formats lists nothing to write");
    }
    // Contracts section 5: a bundle holds a model file. The adapter alone is no model the
    // harness (or decision-worker) can run.
    if !opts
        .formats
        .iter()
        .any(|f| matches!(f, Format::Onnx | Format::Coreml))
    {
        // The names as the command line spells them.
        let given: Vec<String> = opts
            .formats
            .iter()
            .filter_map(|f| Some(f.to_possible_value()?.get_name().to_string()))
            .collect();
        let given = given.join(",");
        bail!(
            "--formats {given} writes no model the harness can run; add onnx (or coreml): \
             --formats onnx,{given}"
        );
    }
    if let Some(t) = &opts.thresholds {
        verify::check_thresholds(t).context("--thresholds")?;
    }
    Ok(())
}

/// `--out` may not be, hold or lie inside anything the export reads (the run, the model, the
/// adapter, the thresholds, the check states); checked before any work, `--force` or not.
fn check_paths(opts: &ExportOptions) -> Result<()> {
    let mut io = decision_data::paths::IoCheck::new();
    if let Some(run) = &opts.run {
        decision_train::run_folder::inputs(&mut io, "--run", run);
    }
    if let Some(m) = &opts.model
        && Path::new(m).exists()
    {
        io.input("--model", m);
    }
    if let Some(a) = &opts.adapter {
        io.input("--adapter", a);
    }
    if let Some(t) = &opts.thresholds {
        io.input("--thresholds", t);
    }
    if let Some(d) = &opts.check_data {
        io.input("--check-data", d);
    }
    io.output_folder("--out", &opts.out).check()
}

/// The export proper, into `staging` (removed again if anything fails).
fn export_into(source: Source, opts: &ExportOptions, staging: Staging) -> Result<Vec<String>> {
    let origin = origin(opts)?;
    let has = |f: Format| opts.formats.contains(&f);
    let chosen = opts.dtype.map(|d| match d {
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
    if !opts.point_rules.is_empty() {
        spec.point_rules = parse_point_rules(&opts.point_rules)?;
    } else if spec.point_rules.is_empty() {
        spec.point_rules = decision_prompt::spec::keel_point_rules();
    }
    spec.validate().context("--point-rule")?;
    let mut lines = Vec::new();
    if let Some(t) = &opts.thresholds {
        let file = decision_data::contract::thresholds::ThresholdsFile::read(t)?;
        lines.extend(unproduced_points_warning(
            &spec.effective_point_rules(),
            file.points.keys().map(String::as_str),
        ));
    }
    let temperature = spec.temperature;
    // The reference's answers first; then its weights are freed before any model file is
    // loaded, so peak memory is one model, not two.
    let batches = source.batches(8)?;
    let pad_id = source.model.pad_id;
    let recorded = Recorded::record(
        &BurnScorer {
            model: &source.model,
            temperature,
            label: source.reference.clone(),
        },
        &batches,
    )?;
    // The probe states bundle verify runs model.onnx on again (onnx::probes).
    let probes = if has(Format::Onnx) {
        Some(onnx::probes::record(
            &source.model,
            &source.reference,
            temperature,
        )?)
    } else {
        None
    };
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
    let reference = Reference {
        recorded: &recorded,
        batches: &batches,
        samples_from: &samples_from,
        temperature,
        pad_id,
    };
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
    if let Some(t) = &opts.thresholds {
        std::fs::copy(t, dir.join(bundle::THRESHOLDS))
            .with_context(|| format!("copying {}", t.display()))?;
    }

    // Each format writes its files and passes its own gate; one arm per format.
    let mut verified = Vec::new();
    let mut formats = Formats::default();
    for format in [Format::Onnx, Format::Coreml, Format::Peft] {
        if !has(format) {
            continue;
        }
        match format {
            Format::Onnx => {
                let onnx_opts = OnnxOptions {
                    opset: opts.opset,
                    external_data: opts.external_data,
                };
                let probes = probes.as_ref().context("probe states for model.onnx")?;
                let w = onnx::export::export(
                    &graph,
                    onnx_opts,
                    &dir,
                    &reference,
                    probes,
                    spec.max_options,
                )?;
                lines.extend(w.lines);
                verified.extend(w.checks);
                formats.onnx = Some(w.facts);
            }
            Format::Coreml => {
                let g = if coreml_dtype == dtype {
                    graph.clone()
                } else {
                    graph_of(coreml_dtype)?
                };
                let coreml_opts = CoremlOptions {
                    max_seq: spec.max_tokens.max(1),
                    max_options: spec.max_options.max(1),
                };
                let w = coreml::export::export(&g, coreml_opts, &dir, &reference)?;
                lines.extend(w.lines);
                verified.extend(w.checks);
                formats.coreml = Some(w.facts);
            }
            Format::Peft => {
                let adapter = adapter
                    .as_ref()
                    .context("--formats peft needs a LoRA model")?;
                adapter.write_peft(&dir.join(bundle::ADAPTER_DIR))?;
                formats.peft = Some(bundle::ADAPTER_DIR.into());
                lines.push(format!(
                    "adapter   adapter/: PEFT LoRA r {} alpha {} on {} modules",
                    adapter.r,
                    adapter.alpha,
                    adapter.modules.len()
                ));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(args: &[&str]) -> Vec<decision_prompt::spec::PointRule> {
        parse_point_rules(&args.iter().map(|r| r.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn points_no_rule_produces_are_warned_about() {
        // keel's default rules give pre_step and intake.
        let keel = decision_prompt::spec::keel_point_rules();
        let w = unproduced_points_warning(&keel, ["tool", "stop", "intake"].into_iter()).unwrap();
        assert!(
            w.starts_with("warning: thresholds.json fits points tool, stop that no point rule")
                && w.contains("(its rules give intake, pre_step)"),
            "{w}"
        );
        assert!(unproduced_points_warning(&keel, ["pre_step", "intake"].into_iter()).is_none());
        // A rule offering the same candidate set as an earlier one never matches first.
        let shadowed = rules(&["tool=a,b", "stop=b,a", "rest"]);
        assert_eq!(
            producible_points(&shadowed),
            BTreeSet::from(["tool".to_string(), "rest".to_string()])
        );
        let w = unproduced_points_warning(&shadowed, ["tool", "stop"].into_iter()).unwrap();
        assert!(w.contains("fits points stop that"), "{w}");
        assert!(unproduced_points_warning(&shadowed, ["tool", "rest"].into_iter()).is_none());
    }
}
