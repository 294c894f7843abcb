//! Parity with Hugging Face `transformers`: the checkpoints and expected logits under
//! `tests/fixtures/model/` come from `scripts/make_qwen3_fixtures.py`. Tolerance: 1e-4 absolute
//! on the last-position logits (f32 compute; logits are O(1)–O(5)).

use std::path::{Path, PathBuf};

use decision_train::model::qwen3::Batch;
use decision_train::{DecisionModel, LoadOptions};
use serde_json::Value;

const TOL: f64 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn load(dir: &Path) -> DecisionModel {
    DecisionModel::load(dir.to_str().unwrap(), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("loading {}: {e:#}", dir.display()))
}

fn vec_f64(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// Last-position logits over the whole vocabulary for each row, computed (a) one prompt at a time
/// and (b) all prompts in one left-padded batch.
fn logits(m: &DecisionModel, rows: &[Vec<u32>]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let vocab: Vec<u32> = (0..m.config.vocab_size as u32).collect();
    let run = |batch: Batch| -> Vec<Vec<f64>> {
        let t = m.model.answer_logits(&batch, &vocab);
        let [b, v] = t.dims();
        let flat: Vec<f32> = t.into_data().convert::<f32>().try_into_vec().unwrap();
        (0..b)
            .map(|i| flat[i * v..(i + 1) * v].iter().map(|&x| x as f64).collect())
            .collect()
    };
    let single = rows
        .iter()
        .map(|r| run(Batch::left_padded(&[r.as_slice()], m.pad_id)).remove(0))
        .collect();
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let batched = run(Batch::left_padded(&refs, m.pad_id));
    (single, batched)
}

fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}

fn check_model(name: &str, dir: &Path, dtype_key: &str) {
    let exp = expected();
    let case = &exp[name];
    let m = load(dir);
    let prompts: Vec<String> = case["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    let want_ids = ids(&case["input_ids"]);
    // The Rust tokenizer agrees with the Python one on the same tokenizer.json.
    assert_eq!(prompts.len(), want_ids.len());
    for (p, want) in prompts.iter().zip(&want_ids) {
        let got = m
            .tokenizer()
            .encode(p.as_str(), true)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(&got, want, "{name}: token ids of {p:?}");
    }
    let want: Vec<Vec<f64>> = case[dtype_key]
        .as_array()
        .unwrap()
        .iter()
        .map(vec_f64)
        .collect();
    let (single, batched) = logits(&m, &want_ids);
    let d1 = max_abs_diff(&single, &want);
    let d2 = max_abs_diff(&batched, &want);
    eprintln!("{name} {dtype_key}: max |Δlogit| one-by-one {d1:.2e}, left-padded batch {d2:.2e}");
    assert!(d1 <= TOL, "{name} {dtype_key}: max |Δlogit| {d1} > {TOL}");
    assert!(
        d2 <= TOL,
        "{name} {dtype_key} (padded batch): max |Δlogit| {d2} > {TOL}"
    );
}

/// A model folder holding `weights` as `model.safetensors` beside the fixture's config and tokenizer.
fn with_weights(src: &Path, weights: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::copy(src.join(weights), dir.path().join("model.safetensors")).unwrap();
    dir
}

#[test]
fn tied_model_matches_transformers() {
    check_model("tied", &fixtures().join("tied"), "f32");
}

#[test]
fn untied_gqa3_sharded_model_matches_transformers() {
    let dir = fixtures().join("untied-gqa3");
    assert!(dir.join("model.safetensors.index.json").is_file());
    assert!(
        !dir.join("model.safetensors").exists(),
        "the untied fixture must exercise shards"
    );
    check_model("untied-gqa3", &dir, "f32");
}

#[test]
fn bf16_weights_load_and_match() {
    let tmp = with_weights(&fixtures().join("tied"), "model.bf16.safetensors");
    check_model("tied", tmp.path(), "bf16");
}

#[test]
fn f16_weights_load_and_match() {
    let tmp = with_weights(&fixtures().join("untied-gqa3"), "model.f16.safetensors");
    check_model("untied-gqa3", tmp.path(), "f16");
}

#[test]
fn label_logits_are_the_vocabulary_columns() {
    let m = load(&fixtures().join("tied"));
    let exp = expected();
    let rows = ids(&exp["tied"]["input_ids"]);
    let labels = &m.spec.label_token_ids[..5];
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let got: Vec<f32> = m
        .model
        .answer_logits(&Batch::left_padded(&refs, m.pad_id), labels)
        .into_data()
        .try_into_vec()
        .unwrap();
    let want: Vec<Vec<f64>> = exp["tied"]["f32"]
        .as_array()
        .unwrap()
        .iter()
        .map(vec_f64)
        .collect();
    for (i, row) in want.iter().enumerate() {
        for (j, &t) in labels.iter().enumerate() {
            let d = (got[i * labels.len() + j] as f64 - row[t as usize]).abs();
            assert!(d <= TOL, "row {i} label {j}: {d}");
        }
    }
}

/// PEFT's trainable tokens (`trainable_token_indices`) on a tied model: the adapter in
/// `tests/fixtures/export/tiny-lora-tokens/` (`scripts/make_export_fixtures.py`: LoRA on all seven
/// projections plus the rows of a prompt word and of label `B`, all drawn random) attached by
/// `lora::load_peft` scores the fixture batch as `peft` did, unmerged and merged. Without its
/// token rows it does not, so the rows (in the embedding and in the tied head) are what is tested.
#[test]
fn peft_adapter_with_trainable_tokens_matches_peft() {
    let export = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/export");
    let e: Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("expected.json")).unwrap())
            .unwrap();
    let b = &e["batch"];
    let batch = Batch {
        input_ids: ids(&b["input_ids"]),
        attention_mask: ids(&b["attention_mask"])
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as u8).collect())
            .collect(),
    };
    let options = ids(&b["option_token_ids"]);
    let t = b["temperature"].as_f64().unwrap();
    let want: Vec<Vec<f64>> = e["models"]["tiny+lora-tokens"]["option_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(vec_f64)
        .collect();
    let scaled = |model: &decision_train::Qwen3| -> Vec<Vec<f64>> {
        options
            .iter()
            .enumerate()
            .map(|(r, opts)| {
                let l = model.answer_logits(&batch, opts);
                let flat: Vec<f32> = l.into_data().convert::<f32>().try_into_vec().unwrap();
                let k = opts.len();
                flat[r * k..(r + 1) * k]
                    .iter()
                    .map(|&x| x as f64 / t)
                    .collect()
            })
            .collect()
    };

    let base = load(&export.join("tiny"));
    let (model, spec, _) = decision_train::model::lora::load_peft(
        base.model.clone(),
        &export.join("tiny-lora-tokens"),
    )
    .unwrap();
    assert_eq!(spec.tokens.len(), 2, "{spec:?}");
    let unmerged = max_abs_diff(&scaled(&model), &want);
    assert!(unmerged < TOL, "unmerged: {unmerged}");

    let mut rows_dropped = model.clone();
    rows_dropped.tokens = None;
    let without = max_abs_diff(&scaled(&rows_dropped), &want);
    assert!(without > 1e-2, "the token rows change nothing: {without}");

    let merged = decision_train::model::lora::merge(model);
    assert!(merged.tokens.is_none());
    let merged = max_abs_diff(&scaled(&merged), &want);
    assert!(merged < TOL, "merged: {merged}");
}
