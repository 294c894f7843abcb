//! Exported models against the reference implementation.
//!
//! The fixtures (tests/fixtures/export, made by scripts/make_export_fixtures.py with transformers
//! and peft) hold tiny Qwen3 checkpoints, a PEFT adapter and, for one left-padded batch, the
//! option logits / probabilities transformers computes. The ONNX files we write run in tract and
//! must agree within the gate's tolerances: max |Δp| ≤ 1e-4 with f32 weights, ≤ 2e-3 with f16,
//! and the same picks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use decision_export::config::Qwen3Config;
use decision_export::graph::{DType, GraphOptions, build_qwen3};
use decision_export::lora::{LoraAdapter, MergedSource};
use decision_export::onnx::{DATA_ALIGN, OnnxOptions, read_model, write_onnx};
use decision_export::parity::{Batch, Scorer, Scores, TractModel, compare};
use decision_export::weights::{SafetensorsDir, WeightSource};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/export")
}

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
        Some((b, _)) => (b, Some(format!("{b}-lora"))),
        None => (model, None),
    };
    let dir = fixtures().join(base);
    let cfg = Qwen3Config::load(&dir).unwrap();
    let weights: Arc<dyn WeightSource> = Arc::new(SafetensorsDir::open(&dir).unwrap());
    let weights = match adapter {
        None => weights,
        Some(a) => {
            let adapter = LoraAdapter::load(&fixtures().join(a), &cfg).unwrap();
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
