//! The Core ML writer: package structure (always), and the coremltools check (when a Python with
//! coremltools is there: `$DECISION_PYTHON`, else `python3`; `.ci/run` installs one and sets
//! `DECISION_REQUIRE_CHECKERS=coremltools`, under which a missing coremltools fails these tests).
//!
//! The models are the tiny Qwen3 checkpoints of tests/fixtures/export (made by
//! scripts/make_export_fixtures.py, weights large enough that the option probabilities are far from
//! uniform). The reference is the training-side Burn forward pass (decision-train) on the built-in
//! probe states. The check must reproduce its `option_probs` within the parity gate's tolerances:
//! max |Δp| ≤ 2e-3 with fp16 weights, ≤ 1e-4 with fp32, same picks; and it must reject a package
//! with a corrupted blob sentinel, a wrong declared output type or a wrong parameter name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use decision_export::Qwen3Config;
use decision_export::coreml::check::{self, CheckSample, Python};
use decision_export::coreml::pb::{self, mil_spec as mil};
use decision_export::coreml::verify::structure;
use decision_export::coreml::{
    CoremlOptions, FUNCTION, OPSET, SPECIFICATION_VERSION, read_model, write_coreml,
};
use decision_export::graph::{DType, Graph, GraphOptions, build_qwen3};
use decision_export::parity::{self, Batch};
use decision_export::source::BurnScorer;
use decision_train::model::hub::ModelDir;
use decision_train::model::weights::{SafetensorsDir, WeightSource};
use decision_train::{Backend, DecisionModel, LoadOptions, Precision};
use prost::Message;

#[path = "../../tests/support/checkers.rs"]
mod checkers;

const TEMPERATURE: f32 = 1.7;

#[path = "support/options.rs"]
mod support;
use support::{fixtures, options};

/// `tiny` (tied embeddings, 4 query / 2 key-value heads) or `gqa3` (untied, 6 / 2).
fn graph(model: &str, dtype: DType) -> Graph {
    let dir = fixtures().join(model);
    let cfg = Qwen3Config::from_file(&dir).unwrap();
    let weights: Arc<dyn WeightSource> = Arc::new(SafetensorsDir::open(&dir).unwrap());
    build_qwen3(
        &cfg,
        weights,
        GraphOptions {
            dtype,
            temperature: TEMPERATURE,
        },
    )
    .unwrap()
}

fn opts() -> CoremlOptions {
    CoremlOptions {
        max_seq: 128,
        max_options: 8,
    }
}

fn block(model: &pb::Model) -> &mil::Block {
    let Some(pb::model::Type::MlProgram(p)) = &model.r#type else {
        panic!("not an ML Program")
    };
    &p.functions[FUNCTION].block_specializations[OPSET]
}

fn block_mut(model: &mut pb::Model) -> &mut mil::Block {
    let Some(pb::model::Type::MlProgram(p)) = &mut model.r#type else {
        panic!("not an ML Program")
    };
    p.functions
        .get_mut(FUNCTION)
        .unwrap()
        .block_specializations
        .get_mut(OPSET)
        .unwrap()
}

fn model_path(pkg: &Path) -> PathBuf {
    pkg.join("Data/com.apple.CoreML/model.mlmodel")
}

fn weight_path(pkg: &Path) -> PathBuf {
    pkg.join("Data/com.apple.CoreML/weights/weight.bin")
}

#[test]
fn package_layout_interface_and_weights_are_well_formed() {
    let g = graph("gqa3", DType::F16);
    let dir = tempfile::tempdir().unwrap();
    let files = write_coreml(&g, opts(), dir.path()).unwrap();
    let pkg = files.package.clone();
    assert_eq!(pkg, dir.path().join("model.mlpackage"));
    for f in [
        "Manifest.json",
        "Data/com.apple.CoreML/model.mlmodel",
        "Data/com.apple.CoreML/weights/weight.bin",
    ] {
        assert!(pkg.join(f).is_file(), "{f} missing");
    }
    // Nothing but the package is left in the folder (no staging leftovers).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let model = read_model(&pkg).unwrap();
    assert_eq!(model.specification_version, SPECIFICATION_VERSION);
    let desc = model.description.as_ref().unwrap();
    let names: Vec<&str> = desc.input.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["input_ids", "attention_mask", "option_token_ids"]);
    assert_eq!(desc.input.len(), 3);
    for (f, max) in desc.input.iter().zip([128, 128, 8]) {
        let Some(pb::feature_type::Type::MultiArrayType(a)) =
            f.r#type.as_ref().unwrap().r#type.as_ref()
        else {
            panic!("{} is not a multi-array", f.name)
        };
        assert_eq!(
            a.data_type,
            pb::array_feature_type::ArrayDataType::Int32 as i32
        );
        let Some(pb::array_feature_type::ShapeFlexibility::ShapeRange(r)) = &a.shape_flexibility
        else {
            panic!("{} has no shape range", f.name)
        };
        let ranges: Vec<(u64, i64)> = r
            .size_ranges
            .iter()
            .map(|s| (s.lower_bound, s.upper_bound))
            .collect();
        assert_eq!(ranges, [(1, 1), (1, max)], "{}", f.name);
    }
    let outs: Vec<&str> = desc.output.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(outs, ["option_logits", "option_probs"]);
    let meta = desc.metadata.as_ref().unwrap();
    assert_eq!(meta.user_defined["temperature"], "1.7");
    assert_eq!(meta.user_defined["dtype"], "f16");

    let b = block(&model);
    assert_eq!(b.outputs, ["option_logits", "option_probs"]);
    let kinds: std::collections::BTreeSet<&str> =
        b.operations.iter().map(|o| o.r#type.as_str()).collect();
    for k in [
        "gather",
        "linear",
        "matmul",
        "slice_by_index",
        "concat",
        "scaled_dot_product_attention",
        "silu",
        "softmax",
        "reduce_mean",
        "rsqrt",
        "cast",
    ] {
        assert!(kinds.contains(k), "no {k} op");
    }
    // Every op is named after its output, and names are unique.
    let mut seen = std::collections::HashSet::new();
    for op in &b.operations {
        let out = &op.outputs[0].name;
        assert!(seen.insert(out.clone()), "{out} defined twice");
        assert!(
            out.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{out}"
        );
        let name = &op.attributes["name"];
        let Some(mil::value::Value::ImmediateValue(v)) = &name.value else {
            panic!()
        };
        let Some(mil::value::immediate_value::Value::Tensor(t)) = &v.value else {
            panic!()
        };
        assert_eq!(
            t.value,
            Some(mil::tensor_value::Value::Strings(
                mil::tensor_value::RepeatedStrings {
                    values: vec![out.clone()]
                }
            ))
        );
    }

    // Every weight is in weight.bin once (the tied table too), as fp16; norms as fp32.
    let summary = structure(&pkg).unwrap();
    assert_eq!(summary.weight_blobs, files.facts.weight_blobs);
    let weights_f16: u64 = g
        .consts()
        .iter()
        .filter(|c| c.is_weight())
        .map(|c| (c.numel() * c.dtype.size()) as u64)
        .sum();
    assert!(summary.weight_bytes >= weights_f16, "{summary:?}");
    let file_len = std::fs::metadata(weight_path(&pkg)).unwrap().len();
    assert!(file_len >= 64 + summary.weight_bytes);

    // Byte-identical when written again (the manifest's identifiers come from the model's hash).
    let again = tempfile::tempdir().unwrap();
    let pkg2 = write_coreml(&g, opts(), again.path()).unwrap().package;
    for f in [
        "Manifest.json",
        "Data/com.apple.CoreML/model.mlmodel",
        "Data/com.apple.CoreML/weights/weight.bin",
    ] {
        assert_eq!(
            std::fs::read(pkg.join(f)).unwrap(),
            std::fs::read(pkg2.join(f)).unwrap(),
            "{f} differs"
        );
    }
    // Writing over an existing package replaces it.
    let g32 = graph("gqa3", DType::F32);
    write_coreml(&g32, opts(), dir.path()).unwrap();
    let m32 = read_model(&pkg).unwrap();
    assert_eq!(
        m32.description.unwrap().metadata.unwrap().user_defined["dtype"],
        "f32"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn verify_package_names_a_corrupted_blob() {
    let g = graph("tiny", DType::F32);
    let dir = tempfile::tempdir().unwrap();
    let pkg = write_coreml(&g, opts(), dir.path()).unwrap().package;
    structure(&pkg).unwrap();
    let first = first_blob_offset(&read_model(&pkg).unwrap());
    let mut bytes = std::fs::read(weight_path(&pkg)).unwrap();
    bytes[first as usize] ^= 0x01;
    std::fs::write(weight_path(&pkg), &bytes).unwrap();
    let err = format!("{:#}", structure(&pkg).unwrap_err());
    assert!(err.contains("sentinel is 0xdeadbeee"), "{err}");
}

fn first_blob_offset(model: &pb::Model) -> u64 {
    block(model)
        .operations
        .iter()
        .find_map(|op| match &op.attributes.get("val")?.value {
            Some(mil::value::Value::BlobFileValue(b)) => Some(b.offset),
            _ => None,
        })
        .expect("a blob")
}

// ---- the coremltools check -----------------------------------------------------------------

/// The Python to run the check with, or `None` (after saying so loudly, or failing when
/// `$DECISION_REQUIRE_CHECKERS` names coremltools) when there is none.
fn python(test: &str) -> Option<PathBuf> {
    match check::find_python() {
        Python::Ready {
            interpreter,
            versions,
        } => {
            eprintln!(
                "coremltools check with {} ({versions})",
                interpreter.display()
            );
            Some(interpreter)
        }
        Python::Missing { reason } => {
            checkers::not_run(
                test,
                "coremltools",
                &format!(
                    "{reason}; .ci/run installs it; locally: DECISION_PYTHON=/path/to/python cargo \
                     test -p decision-export --test coreml"
                ),
            );
            None
        }
    }
}

/// The Burn forward pass on the built-in probe states (2 to 6 options, short and long contexts).
fn burn_samples(model: &str) -> Vec<CheckSample> {
    let dir = fixtures().join(model);
    let md = ModelDir {
        dir: dir.clone(),
        origin: dir.display().to_string(),
    };
    let m = DecisionModel::load_dir(
        &md,
        &LoadOptions {
            backend: Backend::Cpu,
            precision: Precision::F32,
            hub: None,
            trains: false,
        },
    )
    .unwrap();
    let states = decision_export::samples::probes(&["tool".into(), "stop".into()], 6);
    let rows: Vec<_> = states.iter().map(|s| m.encode(s).unwrap()).collect();
    let mut batches = Vec::new();
    for k in 2..=6 {
        let group: Vec<(&[u32], &[u32])> = rows
            .iter()
            .filter(|e| e.option_token_ids.len() == k)
            .map(|e| (e.input_ids.as_slice(), e.option_token_ids.as_slice()))
            .collect();
        batches.push(Batch::left_padded(&group, m.pad_id).unwrap());
    }
    let burn = BurnScorer {
        model: &m,
        temperature: TEMPERATURE as f64,
        label: "burn".into(),
    };
    check::samples_from(&burn, &batches, TEMPERATURE as f64).unwrap()
}

/// Every step of the check, in order.
const STEPS: [&str; 9] = [
    "manifest",
    "load_spec",
    "mlmodel",
    "interface",
    "weights",
    "milproto",
    "explicit_parameters",
    "values",
    "parity",
];

#[test]
fn coremltools_rebuilds_the_program_and_reproduces_burn() {
    let Some(py) = python("coremltools_rebuilds_the_program_and_reproduces_burn") else {
        return;
    };
    let mut lines = Vec::new();
    for model in ["tiny", "gqa3"] {
        let samples = burn_samples(model);
        assert_eq!(samples.len(), 10);
        let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
        let dtypes = [DType::F16, DType::F32];
        let pkgs: Vec<PathBuf> = dtypes
            .iter()
            .zip(&dirs)
            .map(|(d, dir)| {
                write_coreml(&graph(model, *d), opts(), dir.path())
                    .unwrap()
                    .package
            })
            .collect();
        let refs: Vec<&Path> = pkgs.iter().map(PathBuf::as_path).collect();
        // No tolerance given: the script picks it from the package's weight type.
        let reports = check::run_checks(&py, &refs, &samples, check::CheckArgs::default()).unwrap();
        assert_eq!(reports.len(), pkgs.len());
        for ((dtype, r), pkg) in dtypes.iter().zip(&reports).zip(&pkgs) {
            assert_eq!(Path::new(&r.package), pkg.as_path());
            lines.push(format!(
                "{model:5} {}: max|Δp| {:.2e} ({})  max|Δlogit| {:.2e}  ({} evaluations, {} ops, \
                 {} blobs, numpy for {:?})",
                dtype.name(),
                r.max_abs_dp.unwrap_or(f64::NAN),
                r.worst.as_deref().unwrap_or("?"),
                r.max_abs_dlogit.unwrap_or(f64::NAN),
                r.samples,
                r.operations,
                r.weight_blobs,
                r.numpy_fallbacks
            ));
            assert!(r.passed, "{model} {dtype:?}: {r:?}");
            assert_eq!(r.steps, STEPS);
            assert_eq!(
                r.tolerance.map(|t| t as f32),
                Some(parity::tolerance(*dtype))
            );
            // Each state as given and left-padded.
            assert_eq!(r.samples, 20);
            // Stated tolerances: 2e-3 (fp16 weights), 1e-4 (fp32), same picks.
            assert!(r.max_abs_dp.unwrap() <= parity::tolerance(*dtype) as f64);
            assert_eq!(r.pick_mismatches, 0);
            // Only silu lacks a value inference in coremltools 9.
            assert_eq!(r.numpy_fallbacks, ["silu"]);
            // At this size every product is under the fp32 threshold: all coremltools'.
            assert_eq!((r.f32_products, r.states_checked, r.padded), (0, 10, 10));
            assert!(!r.budget_limited);
        }
        // fp16 weights really are fp16: the fp32 package agrees far more closely.
        assert!(reports[1].max_abs_dp < reports[0].max_abs_dp, "{reports:?}");
    }
    eprintln!("{}", lines.join("\n"));
}

/// The path a large model's check takes: every linear / matmul in numpy fp32, and a budget that
/// leaves states out. It must reach the same verdict as coremltools' own value inference, and
/// check what it says it checked.
#[test]
fn fp32_products_and_a_budget_check_fewer_states_to_the_same_tolerance() {
    let Some(py) = python("fp32_products_and_a_budget_check_fewer_states_to_the_same_tolerance")
    else {
        return;
    };
    let samples = burn_samples("gqa3");
    let dir = tempfile::tempdir().unwrap();
    let pkg = write_coreml(&graph("gqa3", DType::F16), opts(), dir.path())
        .unwrap()
        .package;
    let full = check::CheckArgs {
        products: check::Products::F32,
        ..Default::default()
    };
    let r = check::run_check(&py, &pkg, &samples, full).unwrap();
    assert!(r.passed, "{r:?}");
    assert_eq!(r.steps, STEPS);
    assert!(r.max_abs_dp.unwrap() <= parity::tolerance(DType::F16) as f64);
    assert_eq!((r.states_checked, r.padded, r.samples), (10, 10, 20));
    // 2 layers x 7 projections (attention is one scaled_dot_product_attention op), and the
    // option logits, per evaluation.
    assert_eq!(r.f32_products, 20 * (2 * 7 + 1), "{r:?}");
    assert!(r.other_ops > 0);
    assert!(r.macs_per_token > 0);

    // A budget for the first state twice and exactly two more.
    let len = |i: usize| samples[i].input_ids.len() as f64;
    let budget = r.macs_per_token as f64 * (2.0 * len(0) + len(1) + len(2));
    let limited = check::CheckArgs { budget, ..full };
    let b = check::run_check(&py, &pkg, &samples, limited).unwrap();
    assert!(b.passed, "{b:?}");
    assert!(b.budget_limited);
    assert_eq!(b.padded, 1);
    assert_eq!(b.states_checked, 3, "{b:?}");
    assert_eq!(b.samples, b.states_checked + 1);
    let what = b.describe_values();
    assert!(
        what.contains(&format!("{} of 10 sample states", b.states_checked)),
        "{what}"
    );
    assert!(what.contains("left-padded; the budget"), "{what}");
}

#[test]
fn the_check_rejects_broken_packages() {
    let Some(py) = python("the_check_rejects_broken_packages") else {
        return;
    };
    let samples = burn_samples("gqa3");
    let g = graph("gqa3", DType::F16);
    let root = tempfile::tempdir().unwrap();
    let src = write_coreml(&g, opts(), root.path()).unwrap().package;
    let original = read_model(&src).unwrap();
    let first = first_blob_offset(&original);

    // One copy of the package per case, mutated, all checked in one run.
    let copy = |case: &str| -> PathBuf {
        let pkg = root.path().join(case).join("model.mlpackage");
        for f in [
            "Manifest.json",
            "Data/com.apple.CoreML/model.mlmodel",
            "Data/com.apple.CoreML/weights/weight.bin",
        ] {
            std::fs::create_dir_all(pkg.join(f).parent().unwrap()).unwrap();
            std::fs::copy(src.join(f), pkg.join(f)).unwrap();
        }
        pkg
    };
    let write_model =
        |pkg: &Path, m: &pb::Model| std::fs::write(model_path(pkg), m.encode_to_vec()).unwrap();

    // 1. A corrupted sentinel in the first blob's metadata record.
    let sentinel = copy("sentinel");
    let mut bad = std::fs::read(weight_path(&sentinel)).unwrap();
    bad[first as usize] = 0;
    std::fs::write(weight_path(&sentinel), &bad).unwrap();

    // 2. A wrong declared output shape: option_probs declared [1, options, 1].
    let shape = copy("shape");
    let mut m = original.clone();
    for op in &mut block_mut(&mut m).operations {
        if op.outputs[0].name == "option_probs" {
            let Some(mil::value_type::Type::TensorType(t)) =
                op.outputs[0].r#type.as_mut().unwrap().r#type.as_mut()
            else {
                panic!()
            };
            t.rank = 3;
            t.dimensions.push(mil::Dimension {
                dimension: Some(mil::dimension::Dimension::Constant(
                    mil::dimension::ConstantDimension { size: 1 },
                )),
            });
        }
    }
    write_model(&shape, &m);

    // 3. A wrong parameter name: softmax's `axis` bound as `axes`.
    let param = copy("param");
    let mut m = original.clone();
    let op = block_mut(&mut m)
        .operations
        .iter_mut()
        .find(|op| op.r#type == "softmax")
        .unwrap();
    let arg = op.inputs.remove("axis").unwrap();
    op.inputs.insert("axes".into(), arg);
    write_model(&param, &m);

    // 4. An optional parameter left out (coremltools would fill in its default; we write every
    // parameter, and the check holds us to it).
    let implicit = copy("implicit");
    let mut m = original.clone();
    let op = block_mut(&mut m)
        .operations
        .iter_mut()
        .find(|op| op.r#type == "gather")
        .unwrap();
    op.inputs.remove("validate_indices").unwrap();
    write_model(&implicit, &m);

    // 5. An untouched copy passes: the failures above are the mutations' doing.
    let intact = copy("intact");

    let pkgs = [&sentinel, &shape, &param, &implicit, &intact];
    let refs: Vec<&Path> = pkgs.iter().map(|p| p.as_path()).collect();
    let args = check::CheckArgs {
        tolerance: Some(parity::tolerance(DType::F16)),
        ..Default::default()
    };
    let reports = check::run_checks(&py, &refs, &samples, args).unwrap();
    let expect = [
        ("weights", "sentinel 0xdeadbe00"),
        ("milproto", "Mismatch between var types"),
        ("milproto", "axes"),
        ("explicit_parameters", "['validate_indices'] left implicit"),
    ];
    assert_eq!(reports.len(), pkgs.len(), "{reports:?}");
    for ((step, needle), r) in expect.iter().zip(&reports) {
        assert!(!r.passed, "accepted: {needle}: {r:?}");
        assert_eq!(r.failed_step.as_deref(), Some(*step), "{r:?}");
        let err = r.error.clone().unwrap();
        assert!(err.contains(needle), "{err}");
        assert!(r.ensure().unwrap_err().to_string().contains(step));
    }
    assert!(reports[4].passed, "{:?}", reports[4]);
    assert_eq!(reports[4].steps, STEPS);
}

// ---- decision export --formats coreml ------------------------------------------------------

use decision_export::bundle::Manifest;
use decision_export::verify::verify;
use decision_export::{ExportOptions, Format, WeightDtype, run};

fn export_args(out: &Path) -> ExportOptions {
    ExportOptions {
        formats: vec![Format::Onnx, Format::Coreml],
        dtype: None,
        ..options("tiny", out)
    }
}

fn read_manifest(bundle: &Path) -> Manifest {
    serde_json::from_str(&std::fs::read_to_string(bundle.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn export_writes_the_package_into_the_bundle_and_says_which_checks_ran() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    let lines = run(&export_args(&out)).unwrap();
    eprintln!("{}", lines.join("\n"));
    let m = read_manifest(&out);
    // Without --dtype: ONNX f32, Core ML f16.
    assert_eq!(m.model.dtype, "f32");
    let c = m.formats.coreml.as_ref().expect("formats.coreml");
    assert_eq!(
        (c.file.as_str(), c.specification_version, c.opset.as_str()),
        ("model.mlpackage", 9, "CoreML8")
    );
    assert_eq!(c.dtype, "f16");
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    for p in [
        "model.mlpackage/Data/com.apple.CoreML/model.mlmodel",
        "model.mlpackage/Data/com.apple.CoreML/weights/weight.bin",
        "model.mlpackage/Manifest.json",
        "model.onnx",
    ] {
        assert!(paths.contains(&p), "{p} not in {paths:?}");
    }
    // keel's marker file, read back from the package: its real interface.
    assert!(paths.contains(&"coreml_config.json"), "{paths:?}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("coreml_config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["schema"], "decision-coreml-config/1");
    assert_eq!(cfg["package"], "model.mlpackage");
    assert_eq!(cfg["specification_version"], 9);
    assert_eq!(cfg["dtype"], "f16");
    let names = |k: &str| -> Vec<String> {
        cfg[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names("inputs"),
        ["input_ids", "attention_mask", "option_token_ids"]
    );
    assert_eq!(names("outputs"), ["option_logits", "option_probs"]);
    let input = |i: usize| cfg["inputs"][i].clone();
    assert_eq!(input(0)["dtype"], "int32");
    assert_eq!(
        input(0)["shape_range"],
        serde_json::json!([[1, 1], [1, c.max_seq]])
    );
    assert_eq!(
        input(2)["shape_range"],
        serde_json::json!([[1, 1], [1, c.max_options]])
    );
    assert_eq!(cfg["outputs"][1]["dtype"], "float32");
    assert_eq!(
        cfg["outputs"][1]["shape"],
        serde_json::json!([1, "options"])
    );
    let pkg_bytes: u64 = m
        .files
        .iter()
        .filter(|f| f.path.starts_with("model.mlpackage/"))
        .map(|f| f.bytes)
        .sum();
    eprintln!("model.mlpackage: {pkg_bytes} bytes");

    let entry = |check: &str| {
        m.verified_with
            .iter()
            .find(|e| e["file"] == "model.mlpackage" && e["check"] == check)
            .unwrap_or_else(|| panic!("no {check} entry: {:?}", m.verified_with))
            .clone()
    };
    assert_eq!(entry("structure")["passed"], true);
    assert_eq!(entry("structure")["weight_blobs"], c.weight_blobs);
    let parity = entry("parity");
    let ran = matches!(check::find_python(), Python::Ready { .. });
    if ran {
        assert_eq!(parity["passed"], true, "{parity}");
        assert!(
            parity["runtime"]
                .as_str()
                .unwrap()
                .starts_with("coremltools 9.")
        );
        assert!(parity["max_abs_dp"].as_f64().unwrap() <= 2e-3, "{parity}");
        assert_eq!(parity["tolerance"].as_f64().unwrap() as f32, 2e-3);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("coremltools") && l.contains("max |Δp|"))
        );
    } else {
        checkers::not_run(
            "export_writes_the_package_into_the_bundle_and_says_which_checks_ran",
            "coremltools",
            "no $DECISION_PYTHON with coremltools; testing that the export records its check as \
             not run",
        );
        assert_eq!(
            (&parity["ran"], &parity["passed"]),
            (&false.into(), &false.into())
        );
        assert!(parity["reason"].as_str().unwrap().contains("coremltools"));
        assert!(lines.iter().any(|l| l.contains("NOT RUN")));
    }
    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);
    assert_eq!(v.notes.len(), usize::from(!ran), "{:?}", v.notes);

    // A manifest that claims a check the export could not run is only a note while the package's
    // structure check passed; without that, the package counts as unverified.
    let path = out.join("manifest.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let mut j: serde_json::Value = serde_json::from_str(&original).unwrap();
    let checks = j["verified_with"].as_array_mut().unwrap();
    for e in checks.iter_mut() {
        if e["file"] == "model.mlpackage" && e["check"] == "parity" {
            *e = serde_json::json!({"check": "parity", "file": "model.mlpackage", "ran": false,
                                    "passed": false, "reason": "no coremltools"});
        }
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);
    assert!(v.notes[0].contains("no coremltools"), "{:?}", v.notes);
    j["verified_with"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["check"] != "structure");
    std::fs::write(&path, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
    let v = verify(&out);
    assert!(
        v.problems.iter().any(
            |p| p == "model.mlpackage: no passed parity check in manifest.json's verified_with"
        ),
        "{:?}",
        v.problems
    );
    std::fs::write(&path, &original).unwrap();

    // A flipped byte in weight.bin: the hash, and the structure check once the hash is updated.
    let weights = out.join("model.mlpackage/Data/com.apple.CoreML/weights/weight.bin");
    let model = read_model(&out.join("model.mlpackage")).unwrap();
    let mut bytes = std::fs::read(&weights).unwrap();
    bytes[first_blob_offset(&model) as usize + 1] ^= 0x10;
    std::fs::write(&weights, &bytes).unwrap();
    let v = verify(&out);
    assert!(
        v.problems.iter().any(|p| p.contains("weight.bin: sha256")),
        "{:?}",
        v.problems
    );
    assert!(
        v.problems
            .iter()
            .any(|p| p.starts_with("model.mlpackage:") && p.contains("sentinel")),
        "{:?}",
        v.problems
    );
}

#[test]
fn coreml_alone_with_f32_weights() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("b32");
    let mut a = export_args(&out);
    a.model = Some(fixtures().join("gqa3").display().to_string());
    a.formats = vec![Format::Coreml];
    a.dtype = Some(WeightDtype::F32);
    run(&a).unwrap();
    let m = read_manifest(&out);
    assert!(m.formats.onnx.is_none());
    let c = m.formats.coreml.as_ref().unwrap();
    assert_eq!((m.model.dtype.as_str(), c.dtype.as_str()), ("f32", "f32"));
    // The interface bounds come from decision.json (max_tokens, max_options).
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("decision.json")).unwrap()).unwrap();
    assert_eq!(c.max_options as u64, spec["max_options"].as_u64().unwrap());
    assert_eq!(c.max_seq as u64, spec["max_tokens"].as_u64().unwrap());
    if let Some(p) = m
        .verified_with
        .iter()
        .find(|e| e["check"] == "parity" && e["ran"] != false)
    {
        assert!(p["max_abs_dp"].as_f64().unwrap() <= 1e-4, "{p}");
    }
    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);
}
