//! Exported models against the reference implementation.
//!
//! The fixtures (tests/fixtures/export, made by scripts/make_export_fixtures.py with transformers
//! and peft) hold tiny Qwen3 checkpoints, a PEFT adapter and, for one left-padded batch, the
//! option logits / probabilities transformers computes. The ONNX files we write run in tract and
//! must agree within the gate's tolerances: max |Δp| ≤ 1e-4 with f32 weights, ≤ 2e-3 with f16,
//! and the same picks.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use decision_export::Qwen3Config;
use decision_export::graph::{DType, GraphOptions, build_qwen3};
use decision_export::lora::MergedSource;
use decision_export::onnx::{DATA_ALIGN, OnnxOptions, read_model, write_onnx};
use decision_export::parity::{Batch, Scorer, Scores, TractModel, compare};
use decision_train::model::peft::PeftAdapter;
use decision_train::model::weights::{SafetensorsDir, WeightSource};
use serde_json::Value;

#[path = "support/options.rs"]
mod support;
use support::{fixtures, options};

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn matrix_i64(v: &Value) -> (usize, usize, Vec<i64>) {
    let rows: Vec<Vec<i64>> = serde_json::from_value(v.clone()).unwrap();
    let cols = rows[0].len();
    (rows.len(), cols, rows.concat())
}

fn fixture_batch(e: &Value) -> Batch {
    let b = &e["batch"];
    let (batch, seq, input_ids) = matrix_i64(&b["input_ids"]);
    let (_, _, attention_mask) = matrix_i64(&b["attention_mask"]);
    let (_, options, option_token_ids) = matrix_i64(&b["option_token_ids"]);
    Batch {
        batch,
        seq,
        options,
        input_ids,
        attention_mask,
        option_token_ids,
    }
}

/// transformers' answer for the fixture batch.
struct Transformers {
    scores: Scores,
}

impl Scorer for Transformers {
    fn describe(&self) -> String {
        "transformers (fixture)".into()
    }
    fn score(&self, _: &Batch) -> Result<Scores> {
        Ok(self.scores.clone())
    }
}

fn reference(e: &Value, model: &str) -> Transformers {
    let m = &e["models"][model];
    Transformers {
        scores: Scores {
            logits: serde_json::from_value(m["option_logits"].clone()).unwrap(),
            probs: serde_json::from_value(m["option_probs"].clone()).unwrap(),
        },
    }
}

fn source(model: &str) -> (Qwen3Config, Arc<dyn WeightSource>) {
    let (base, adapter) = match model.split_once('+') {
        // `tiny+lora` → tiny/ with tiny-lora/; `tiny+lora-tokens` → tiny/ with tiny-lora-tokens/.
        Some((b, a)) => (b, Some(format!("{b}-{a}"))),
        None => (model, None),
    };
    let dir = fixtures().join(base);
    let cfg = Qwen3Config::from_file(&dir).unwrap();
    let weights: Arc<dyn WeightSource> = Arc::new(SafetensorsDir::open(&dir).unwrap());
    let weights = match adapter {
        None => weights,
        Some(a) => {
            let adapter = PeftAdapter::load(&fixtures().join(a), &cfg).unwrap();
            Arc::new(MergedSource::new(weights, Arc::new(adapter)).unwrap())
        }
    };
    (cfg, weights)
}

#[test]
fn onnx_matches_transformers_across_models_dtypes_opsets_and_data_layouts() {
    let e = expected();
    let batch = fixture_batch(&e);
    let temperature = e["batch"]["temperature"].as_f64().unwrap() as f32;
    let cases: &[(&str, DType, i64, bool)] = &[
        ("tiny", DType::F32, 18, false),
        ("tiny", DType::F16, 18, false),
        ("tiny", DType::F32, 23, false),
        ("tiny", DType::F16, 23, true),
        ("gqa3", DType::F32, 18, false),
        ("gqa3", DType::F32, 23, false),
        ("gqa3", DType::F16, 18, true),
        ("tiny+lora", DType::F32, 18, true),
        ("tiny+lora", DType::F16, 18, false),
        ("tiny+lora-tokens", DType::F32, 18, false),
    ];
    let mut lines = Vec::new();
    for &(model, dtype, opset, external) in cases {
        let (cfg, weights) = source(model);
        let graph = build_qwen3(&cfg, weights, GraphOptions { dtype, temperature }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = write_onnx(
            &graph,
            OnnxOptions {
                opset,
                external_data: external,
            },
            dir.path(),
        )
        .unwrap();
        assert_eq!(files.data.is_some(), external);
        let onnx = TractModel::load(&files.model).unwrap();
        let report = compare(
            "model.onnx",
            &onnx,
            &reference(&e, model),
            std::slice::from_ref(&batch),
            dtype,
        )
        .unwrap();
        lines.push(format!(
            "{model:10} {:3} opset {opset} external {external:5}: max|Δp| {:.2e}  max|Δlogit| {:.2e}",
            dtype.name(),
            report.max_abs_dp,
            report.max_abs_dlogit
        ));
        assert!(
            report.passed,
            "{model} {dtype:?} opset {opset} external {external}: {report:?}"
        );
        assert_eq!(report.samples, 3);
    }
    eprintln!("{}", lines.join("\n"));
}

#[test]
fn external_data_is_aligned_and_complete() {
    let (cfg, weights) = source("gqa3");
    let graph = build_qwen3(&cfg, weights, GraphOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = write_onnx(
        &graph,
        OnnxOptions {
            opset: 18,
            external_data: true,
        },
        dir.path(),
    )
    .unwrap();
    let model = read_model(&files.model).unwrap();
    let data_len = std::fs::metadata(files.data.as_ref().unwrap())
        .unwrap()
        .len();
    let g = model.graph.unwrap();
    let mut external = 0;
    let mut covered = 0u64;
    for t in &g.initializer {
        let get = |k: &str| {
            t.external_data
                .iter()
                .find(|e| e.key == k)
                .map(|e| e.value.clone())
        };
        if t.data_location == 1 {
            external += 1;
            assert_eq!(get("location").as_deref(), Some("model.onnx.data"));
            let offset: u64 = get("offset").unwrap().parse().unwrap();
            let length: u64 = get("length").unwrap().parse().unwrap();
            assert_eq!(offset % DATA_ALIGN, 0, "{} at {offset}", t.name);
            assert!(offset + length <= data_len);
            assert!(t.raw_data.is_empty());
            covered += length;
        } else {
            // Inline: only the builder's small constants (shapes, scalars, RoPE frequencies).
            assert!(
                t.raw_data.len() <= 64,
                "{} is inline with {} bytes",
                t.name,
                t.raw_data.len()
            );
        }
    }
    let weight_count = graph.consts().iter().filter(|c| c.is_weight()).count();
    assert_eq!(external, weight_count);
    assert_eq!(covered, graph.parameter_count() * 4);
}

// ---- the export command: bundle, gate, verify --------------------------------------------

use decision_export::bundle::Manifest;
use decision_export::source::{Origin, Source};
use decision_export::verify::verify;
use decision_export::{ExportOptions, Format, WeightDtype, run, run_from};

fn args(out: &Path) -> ExportOptions {
    options("tiny", out)
}

fn manifest(bundle: &Path) -> Manifest {
    serde_json::from_str(&std::fs::read_to_string(bundle.join("manifest.json")).unwrap()).unwrap()
}

const THRESHOLDS: &str = r#"{"schema": "decision-thresholds/1", "fitted_at": "2026-11-30T12:00:00Z",
  "source": {"files": ["r.jsonl"], "sha256": "00", "records": 10, "bad": 0, "quarantine": null},
  "points": {"tool": {"status": "fitted", "threshold": 0.9, "judged": 40},
             "stop": {"status": "insufficient-data", "threshold": null, "judged": 3}}}"#;

#[test]
fn lora_bundle_passes_the_gate_verifies_and_any_tampering_is_caught() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    let thresholds = root.path().join("thresholds.json");
    std::fs::write(&thresholds, THRESHOLDS).unwrap();
    let mut a = args(&out);
    a.adapter = Some(fixtures().join("tiny-lora"));
    a.thresholds = Some(thresholds);
    a.formats = vec![Format::Onnx, Format::Peft];
    let lines = run(&a).unwrap();
    eprintln!("{}", lines.join("\n"));
    // thresholds.json's points (tool, stop) are none of keel's default rules' (pre_step,
    // intake): decision-worker would never use them, and the export says so.
    assert!(
        lines.iter().any(|l| l.starts_with(
            "warning: thresholds.json fits points stop, tool that no point rule in decision.json \
             produces (its rules give intake, pre_step)"
        )),
        "{lines:?}"
    );

    let m = manifest(&out);
    assert_eq!(m.schema, "decision-bundle/1");
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "adapter/adapter_config.json",
            "adapter/adapter_model.safetensors",
            "coreml_config.json",
            "decision.json",
            "model.onnx",
            "probes.jsonl",
            "thresholds.json",
            "tokenizer.json"
        ]
    );
    // decision-worker's point rules are written out (keel's two sites by default), and keel's
    // marker file is there even without model.mlpackage, saying so.
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("decision.json")).unwrap()).unwrap();
    assert_eq!(
        spec["point_rules"],
        serde_json::json!([
            {"point": "pre_step", "candidates": ["inspect", "implement", "verify", "answer"]},
            {"point": "intake"}
        ])
    );
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("coreml_config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["package"], Value::Null);
    let parity = &m.verified_with[0];
    assert_eq!(parity["check"], "parity");
    assert_eq!(parity["passed"], true);
    assert!(
        parity["reference"].as_str().unwrap().contains("unmerged"),
        "{parity}"
    );
    assert!(parity["max_abs_dp"].as_f64().unwrap() <= 1e-4);
    assert!(parity["samples"].as_u64().unwrap() >= 9);
    let adapter = m.model.adapter.as_ref().unwrap();
    assert_eq!((adapter.r, adapter.alpha, adapter.included), (4, 8.0, true));
    // The adapter we wrote holds exactly what we read.
    let cfg = Qwen3Config::from_file(&fixtures().join("tiny")).unwrap();
    let ours = PeftAdapter::load(&out.join("adapter"), &cfg).unwrap();
    let theirs = PeftAdapter::load(&fixtures().join("tiny-lora"), &cfg).unwrap();
    assert_eq!(ours.modules, theirs.modules);

    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);
    assert_eq!(v.files_checked, 8);

    // A flipped byte (same size) in the model.
    let model = out.join("model.onnx");
    let original = std::fs::read(&model).unwrap();
    let mut bytes = original.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&model, &bytes).unwrap();
    let v = verify(&out);
    assert!(
        v.problems
            .iter()
            .any(|p| p.starts_with("model.onnx: sha256")),
        "{:?}",
        v.problems
    );
    std::fs::write(&model, &original).unwrap();
    // Label ids that do not match the tokenizer, with the manifest hash updated to match, so
    // only the semantic check can catch it.
    let decision = out.join("decision.json");
    let mut spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&decision).unwrap()).unwrap();
    spec["label_token_ids"][0] = serde_json::json!(1);
    std::fs::write(&decision, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let mut m2: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let (n, sha) = decision_export::bundle::hash_file(&decision).unwrap();
    for f in m2["files"].as_array_mut().unwrap() {
        if f["path"] == "decision.json" {
            f["bytes"] = serde_json::json!(n);
            f["sha256"] = serde_json::json!(sha);
        }
    }
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_vec_pretty(&m2).unwrap(),
    )
    .unwrap();
    let v = verify(&out);
    assert_eq!(v.problems.len(), 1, "{:?}", v.problems);
    assert!(
        v.problems[0].contains("label token ids"),
        "{:?}",
        v.problems
    );
    // An unlisted file.
    std::fs::write(out.join("extra.bin"), b"x").unwrap();
    assert!(
        verify(&out)
            .problems
            .iter()
            .any(|p| p.contains("extra.bin: in the bundle but not in manifest.json"))
    );
}

/// Rewrite manifest.json's `files` to list what the bundle holds now, with their sizes and
/// hashes, as someone editing a bundle by hand would (so only the semantic checks can object).
fn relist(bundle: &Path) {
    let path = bundle.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let files: Vec<Value> = decision_export::bundle::list_files(bundle)
        .unwrap()
        .into_iter()
        .map(|p| {
            let (bytes, sha256) = decision_export::bundle::hash_file(&bundle.join(&p)).unwrap();
            serde_json::json!({"path": p, "bytes": bytes, "sha256": sha256})
        })
        .collect();
    m["files"] = files.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// `bundle verify`'s problems with `file` rewritten to `bytes` (`None`: removed) and the
/// manifest relisted; the file is put back (and relisted) afterwards.
fn problems_with(bundle: &Path, file: &str, bytes: Option<&[u8]>) -> Vec<String> {
    let path = bundle.join(file);
    let original = std::fs::read(&path).unwrap();
    match bytes {
        Some(b) => std::fs::write(&path, b).unwrap(),
        None => std::fs::remove_file(&path).unwrap(),
    }
    relist(bundle);
    let problems = verify(bundle).problems;
    std::fs::write(&path, original).unwrap();
    relist(bundle);
    problems
}

#[test]
fn a_bundle_without_a_model_file_is_neither_exported_nor_verified() {
    let root = tempfile::tempdir().unwrap();
    // The adapter alone is no model the harness can run: refused before any work.
    let out = root.path().join("adapter-only");
    let mut a = args(&out);
    a.adapter = Some(fixtures().join("tiny-lora"));
    a.formats = vec![Format::Peft];
    let err = format!("{:#}", run(&a).unwrap_err());
    assert!(
        err.contains("--formats peft writes no model the harness can run")
            && err.contains("add onnx (or coreml)")
            && err.contains("--formats onnx,peft"),
        "{err}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);

    // A bundle made so by hand (model.onnx, its probes and formats.onnx removed, the manifest
    // relisted) fails verify.
    let out = root.path().join("bundle");
    run(&args(&out)).unwrap();
    assert!(verify(&out).ok());
    for f in ["model.onnx", "probes.jsonl"] {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    let path = out.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["formats"].as_object_mut().unwrap().remove("onnx");
    m["verified_with"] = serde_json::json!([]);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    relist(&out);
    let v = verify(&out);
    assert_eq!(v.problems.len(), 1, "{:?}", v.problems);
    assert!(
        v.problems[0].contains("formats names no model file")
            && v.problems[0].contains("--formats onnx"),
        "{:?}",
        v.problems
    );
}

#[test]
fn verify_checks_coreml_config_and_the_temperature_the_worker_checks() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    run(&args(&out)).unwrap();
    assert!(verify(&out).ok());

    // keel accepts a folder only with coreml_config.json: its absence fails, even relisted.
    let p = problems_with(&out, "coreml_config.json", None);
    assert_eq!(
        p,
        ["coreml_config.json: not listed in manifest.json, so it cannot be trusted"]
    );
    // Read as the exporter writes it: its schema, and the package it describes.
    let p = problems_with(
        &out,
        "coreml_config.json",
        Some(br#"{"schema":"nonsense/9"}"#),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("coreml_config.json: schema is \"nonsense/9\"")
            && p[0].contains("decision-coreml-config/1"),
        "{p:?}"
    );
    let p = problems_with(&out, "coreml_config.json", Some(b"not json"));
    assert!(
        p.len() == 1 && p[0].starts_with("coreml_config.json: not valid JSON"),
        "{p:?}"
    );
    let claims_a_package =
        br#"{"schema": "decision-coreml-config/1", "package": "model.mlpackage"}"#;
    let p = problems_with(&out, "coreml_config.json", Some(claims_a_package));
    assert_eq!(
        p,
        [
            "coreml_config.json: describes package \"model.mlpackage\", manifest.json's \
          formats.coreml names none"
        ]
    );

    // decision.json's temperature against the manifest's, as decision-worker compares them.
    let text = std::fs::read_to_string(out.join("decision.json")).unwrap();
    let mut spec: Value = serde_json::from_str(&text).unwrap();
    let t = spec["temperature"].as_f64().unwrap();
    assert_eq!(t, manifest(&out).model.temperature);
    spec["temperature"] = (t * 2.0).into();
    let p = problems_with(
        &out,
        "decision.json",
        Some(&serde_json::to_vec_pretty(&spec).unwrap()),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains(&format!("decision.json's temperature is {}", t * 2.0))
            && p[0].contains(&format!(
                "model.temperature (the one the model files apply) is {t}"
            )),
        "{p:?}"
    );
    // Within the worker's tolerance (1e-9 relative) it is the same temperature.
    spec["temperature"] = (t * (1.0 + 1e-12)).into();
    let p = problems_with(
        &out,
        "decision.json",
        Some(&serde_json::to_vec_pretty(&spec).unwrap()),
    );
    assert!(p.is_empty(), "{p:?}");
    assert!(verify(&out).ok());
}

#[test]
fn f16_opset23_external_bundle_passes_the_gate_and_verifies() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("b16");
    let mut a = args(&out);
    a.model = Some(fixtures().join("gqa3").display().to_string());
    a.dtype = Some(WeightDtype::F16);
    a.opset = 23;
    a.external_data = true;
    run(&a).unwrap();
    let m = manifest(&out);
    assert_eq!(m.model.dtype, "f16");
    let onnx = m.formats.onnx.as_ref().unwrap();
    assert_eq!(
        (onnx.opset, onnx.external_data.as_deref()),
        (23, Some("model.onnx.data"))
    );
    assert!(m.files.iter().any(|f| f.path == "model.onnx.data"));
    let dp = m.verified_with[0]["max_abs_dp"].as_f64().unwrap();
    assert!(dp <= 2e-3 && dp > 0.0, "{dp}");
    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);
    // Without --force an existing bundle is never overwritten.
    let err = run(&a).unwrap_err().to_string();
    assert!(err.contains("--force"), "{err}");
}

#[test]
fn a_wrong_adapter_key_fails_the_export_and_publishes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let bad = root.path().join("bad-lora");
    std::fs::create_dir(&bad).unwrap();
    std::fs::copy(
        fixtures().join("tiny-lora/adapter_config.json"),
        bad.join("adapter_config.json"),
    )
    .unwrap();
    let bytes = std::fs::read(fixtures().join("tiny-lora/adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .iter()
        .map(|(name, view)| {
            (
                name.replace("layers.1.mlp.up_proj", "layers.1.mlp.upp_proj"),
                view,
            )
        })
        .collect();
    std::fs::write(
        bad.join("adapter_model.safetensors"),
        safetensors::serialize(renamed, None).unwrap(),
    )
    .unwrap();
    let out = root.path().join("bundle");
    let mut a = args(&out);
    a.adapter = Some(bad);
    let err = format!("{:#}", run(&a).unwrap_err());
    assert!(
        err.contains("missing key `base_model.model.model.layers.1.mlp.up_proj.lora_A.weight`"),
        "{err}"
    );
    assert!(
        err.contains("unexpected key `base_model.model.model.layers.1.mlp.upp_proj.lora_B.weight`"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn a_model_that_disagrees_with_the_reference_is_not_published() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    let a = args(&out);
    let mut source = Source::open(
        &Origin::Model {
            src: a.model.clone().unwrap(),
            adapter: None,
        },
        None,
        32,
    )
    .unwrap();
    // The reference gets other weights than the ones exported.
    let device = source.model.device.clone();
    source.model.model =
        decision_train::model::qwen3::init_random(&source.model.config, 0.2, &device);
    let err = run_from(source, &a).unwrap_err().to_string();
    assert!(
        err.contains("parity check failed for model.onnx") && err.contains("max |Δp| = "),
        "{err}"
    );
    assert!(err.contains("nothing was published"), "{err}");
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(root.path()).unwrap().count(),
        0,
        "staging folder left behind"
    );
}

#[test]
fn a_lora_run_folder_exports_with_its_validation_states() {
    use decision_train::run_config::RunConfig;
    use decision_train::trainer::{TrainOptions, train};
    let root = tempfile::tempdir().unwrap();
    let states = decision_data::r#gen::generate(&decision_data::r#gen::GenOptions {
        tasks: 12,
        seed: 3,
        ..Default::default()
    })
    .unwrap();
    let data = root.path().join("states.jsonl");
    decision_data::write_states(&data, &states).unwrap();
    let text = format!(
        r#"
name = "lora-test"
[model]
init = "pretrained"
source = "{}"
[data]
train = "{}"
max_options = 16
max_tokens = 128
[lora]
rank = 2
alpha = 4.0
dropout = 0.0
targets = ["q_proj", "v_proj", "down_proj"]
[optim]
lr = 1e-2
warmup_steps = 0
[train]
mode = "lora"
max_steps = 2
batch_size = 4
seed = 1
[eval]
batch_size = 16
min_states_per_point = 5
permutations = 0
"#,
        fixtures().join("tiny").display(),
        data.display()
    );
    let cfg = RunConfig::parse(&text, &[]).unwrap();
    let run = root.path().join("run");
    train(&cfg, &run, &TrainOptions::default()).unwrap();

    let out = root.path().join("bundle");
    let mut a = args(&out);
    a.model = None;
    a.run = Some(run.clone());
    a.formats = vec![Format::Onnx, Format::Peft];
    a.check_samples = 12;
    decision_export::run(&a).unwrap();
    let m = manifest(&out);
    assert_eq!(m.model.base, fixtures().join("tiny").display().to_string());
    assert_eq!(
        m.model.adapter.as_ref().unwrap().target_modules,
        ["q_proj", "v_proj", "down_proj"]
    );
    assert!(
        m.verified_with[0]["samples_from"]
            .as_str()
            .unwrap()
            .contains("validation split")
    );
    let samples = m.verified_with[0]["samples"].as_u64().unwrap();
    assert!((1..=12).contains(&samples), "{samples}");
    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);
}

#[test]
fn a_reference_whose_finite_weights_overflow_is_refused_by_name() {
    // Every weight finite (load accepts it), but the final norm's scale at f32's largest value
    // overflows the hidden state: the reference's logits are infinite or NaN.
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("overflowing");
    std::fs::create_dir(&model).unwrap();
    let src = fixtures().join("tiny");
    let m =
        decision_train::DecisionModel::load(src.to_str().unwrap(), &Default::default()).unwrap();
    let mut tensors: Vec<decision_train::HfTensor> = m.hf_tensors().collect();
    let norm = tensors
        .iter_mut()
        .find(|t| t.name == "model.norm.weight")
        .unwrap();
    norm.data.iter_mut().for_each(|w| *w = f32::MAX);
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), model.join(f)).unwrap();
    }
    let shapes: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    decision_train::model::weights::write_safetensors(
        &model.join("model.safetensors"),
        &shapes,
        tensors.into_iter(),
        decision_train::SaveDtype::F32,
    )
    .unwrap();
    let out = root.path().join("bundle");
    let mut a = args(&out);
    a.model = Some(model.display().to_string());
    let err = format!("{:#}", run(&a).unwrap_err());
    assert!(
        err.contains("non-finite logits") && err.contains("the reference forward pass"),
        "{err}"
    );
    assert!(!out.exists());
}
