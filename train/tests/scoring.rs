//! Scoring states: probabilities do not depend on batch composition or padding, temperatures
//! apply per decision point, labels are checked against the tokenizer, truncation is counted,
//! and `decision score` writes what the contract says.

use std::path::{Path, PathBuf};

use decision_data::State;
use decision_prompt::spec::{DecisionSpec, PromptTemplate};
use decision_train::{DecisionModel, LoadOptions};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/model")
        .join(name)
}

fn load(name: &str) -> DecisionModel {
    DecisionModel::load(fixture(name).to_str().unwrap(), &LoadOptions::default()).unwrap()
}

fn state(id: &str, point: &str, context: &str, options: &[&str]) -> State {
    let candidates = options.iter().map(|o| (format!("{o}-id"), o.to_string()));
    State {
        task_id: format!("task-{id}"),
        ..State::unlabelled(id, point, context, candidates)
    }
}

fn states() -> Vec<State> {
    vec![
        state(
            "a",
            "tool",
            "user asks to cancel order ord_117",
            &["lookup_order", "cancel_order"],
        ),
        state("b", "stop", "done", &["stop", "ask_user", "refund_order"]),
        state(
            "c",
            "tool",
            "the agent called search_docs and got 3 results; the user wants a refund for ord_42 and \
             says the last attempt failed twice, so route carefully",
            &[
                "refund_order",
                "ask_user",
                "stop",
                "lookup_order",
                "cancel_order",
            ],
        ),
        state("d", "route", "policy says a human", &["human", "agent"]),
        state(
            "e",
            "tool",
            "cancel",
            &["cancel_order", "lookup_order", "ask_user"],
        ),
        state("f", "args", "order ord_117", &["ord_117", "ord_42"]),
    ]
}

fn max_diff(a: &[decision_train::Scores], b: &[decision_train::Scores]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.probs.len(), y.probs.len());
            x.probs.iter().zip(&y.probs).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}

#[test]
fn probabilities_do_not_depend_on_batch_composition_or_padding() {
    for name in ["tied", "untied-gqa3"] {
        let m = load(name);
        let s = states();
        let alone = m.score(&s, 1).unwrap();
        for sc in &alone {
            assert!((sc.probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert!(sc.probs.iter().all(|p| *p > 0.0 && *p < 1.0));
        }
        assert_eq!(alone[2].probs.len(), 5);
        let together = m.score(&s, s.len()).unwrap();
        let in_threes = m.score(&s, 3).unwrap();
        // Reversed input: different neighbours and different amounts of padding per state.
        let mut rev = s.clone();
        rev.reverse();
        let mut reversed = m.score(&rev, 4).unwrap();
        reversed.reverse();
        // 1e-5 on probabilities: batches differ only by f32 rounding in differently shaped matmuls.
        for other in [&together, &in_threes, &reversed] {
            let d = max_diff(&alone, other);
            assert!(
                d < 1e-5,
                "{name}: batch composition moved a probability by {d}"
            );
            for (x, y) in alone.iter().zip(other.iter()) {
                assert_eq!(x.pick_index, y.pick_index);
            }
        }
        // Sanity: the states are not all scored alike (a broken model would give uniform probs).
        assert!(
            alone
                .iter()
                .any(|s| (s.probs[0] - 1.0 / s.probs.len() as f64).abs() > 1e-3)
        );
    }
}

#[test]
fn temperature_applies_per_decision_point() {
    let base = load("tied");
    let mut spec = base.spec.clone();
    spec.temperatures.insert("tool".into(), 2.5);
    spec.temperature = 0.5;
    let dir = tempfile::tempdir().unwrap();
    base.save(dir.path()).unwrap();
    decision_data::atomic::write_json_atomic(dir.path().join("decision.json"), &spec).unwrap();
    let hot = DecisionModel::load(dir.path().to_str().unwrap(), &LoadOptions::default()).unwrap();
    let s = states();
    let plain = base.score(&s, 4).unwrap();
    let tempered = hot.score(&s, 4).unwrap();
    assert_eq!((plain.len(), tempered.len()), (s.len(), s.len()));
    for ((st, p), t) in s.iter().zip(&plain).zip(&tempered) {
        let temp = if st.point == "tool" { 2.5 } else { 0.5 };
        assert_eq!(t.temperature, temp);
        let raw: Vec<f64> = p.logits.clone();
        let (want, _) = decision_train::model::score::softmax_t(&raw, temp);
        assert_eq!(want.len(), t.probs.len());
        for (a, b) in want.iter().zip(&t.probs) {
            assert!((a - b).abs() < 1e-6, "{}: {a} vs {b}", st.id);
        }
    }
}

#[test]
fn default_prompt_follows_the_tokenizer() {
    let chat = load("tied");
    assert!(chat.spec.template.text.starts_with("<|im_start|>system"));
    assert!(
        chat.spec
            .template
            .text
            .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    );
    let tok = chat.tokenizer();
    let e = chat.encode(&states()[0]).unwrap();
    // The prompt ends exactly at the answer slot, after the empty think block.
    let tail = tok
        .decode(&e.input_ids[e.input_ids.len() - 4..], false)
        .unwrap();
    assert!(tail.ends_with("</think>\n\n"), "{tail:?}");
    assert_eq!(
        e.option_token_ids,
        vec![tok.token_to_id("A").unwrap(), tok.token_to_id("B").unwrap()]
    );
    let plain = load("untied-gqa3");
    assert_eq!(plain.spec.template, PromptTemplate::plain());
}

#[test]
fn tokenizer_must_label_max_options() {
    // The word-level fixture has A..Z but not "zebra": 26 options with these labels fit, 27 do not.
    let m = load("untied-gqa3");
    let tok = m.tokenizer().clone();
    let mut labels: Vec<String> = ('A'..='Z').map(String::from).collect();
    labels.push("zebra".into());
    let mut spec = DecisionSpec::defaults(PromptTemplate::plain());
    spec.labels = labels;
    spec.max_options = 26;
    let ok = DecisionModel::from_parts(
        m.config.clone(),
        m.model,
        tok.clone(),
        Some(spec.clone()),
        "fixture",
    )
    .unwrap();
    assert_eq!(ok.spec.label_token_ids.len(), 26);
    spec.max_options = 27;
    let e = DecisionModel::from_parts(
        ok.config.clone(),
        ok.model,
        tok.clone(),
        Some(spec),
        "fixture",
    )
    .err()
    .unwrap();
    let e = format!("{e:#}");
    assert!(
        e.contains("max_options = 27") && e.contains("\"zebra\""),
        "{e}"
    );

    // Label ids recorded in decision.json must match the tokenizer.
    let m = load("untied-gqa3");
    let mut spec = DecisionSpec::defaults(PromptTemplate::plain());
    spec.label_token_ids = (100..126).collect();
    let e = DecisionModel::from_parts(m.config.clone(), m.model, tok, Some(spec), "fixture")
        .err()
        .unwrap();
    assert!(
        format!("{e:#}").contains("not the one the model was trained with"),
        "{e:#}"
    );
}

#[test]
fn long_prompts_lose_oldest_context_and_are_counted() {
    let base = load("untied-gqa3");
    let mut spec = base.spec.clone();
    let s = state(
        "long",
        "tool",
        &"cancel order ord_117 user asks ".repeat(20),
        &["lookup_order", "cancel_order"],
    );
    let full = base.encode(&s).unwrap();
    assert!(!full.truncated);
    spec.max_tokens = full.input_ids.len() - 31;
    let cfg = base.config.clone();
    let tok = base.tokenizer().clone();
    let m = DecisionModel::from_parts(cfg, base.model, tok, Some(spec), "fixture").unwrap();
    let e = m.encode(&s).unwrap();
    assert!(e.truncated);
    assert_eq!(e.input_ids.len(), full.input_ids.len() - 31);
    // Exactly the 31 oldest context tokens are gone: the prefix before the context and
    // everything after the cut (the rest of the context, the options, the answer slot) remain.
    let prefix = m
        .tokenizer()
        .encode("Decision: tool\nContext:\n", true)
        .unwrap()
        .get_ids()
        .len();
    assert_eq!(e.input_ids[..prefix], full.input_ids[..prefix]);
    assert_eq!(e.input_ids[prefix..], full.input_ids[prefix + 31..]);
}

#[test]
fn score_command_writes_one_line_per_state() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("states.jsonl");
    let lines: Vec<String> = states()
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("scores.jsonl");
    let args = decision_train::cli::ScoreArgs {
        model: fixture("tied").to_str().unwrap().into(),
        data: vec![data],
        out: out.clone(),
        batch_size: 4,
        backend: decision_train::Backend::Cpu,
        dtype: decision_train::Precision::F32,
        emit_tokens: true,
    };
    decision_train::run::score(args).unwrap();
    let m = load("tied");
    let want = m.score(&states(), 1).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), states().len());
    assert_eq!(want.len(), rows.len());
    for ((row, st), sc) in rows.iter().zip(states()).zip(want) {
        assert_eq!(row["id"], st.id.as_str());
        assert_eq!(row["pick"], st.candidates[sc.pick_index].id.as_str());
        let probs: Vec<f64> = row["probs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .collect();
        assert_eq!(probs.len(), st.candidates.len());
        assert!((row["confidence"].as_f64().unwrap() - sc.confidence).abs() < 1e-5);
        let enc = m.encode(&st).unwrap();
        let ids: Vec<u32> = row["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, enc.input_ids);
        assert_eq!(row["attention_mask"].as_array().unwrap().len(), ids.len());
        assert_eq!(
            row["option_token_ids"].as_array().unwrap().len(),
            st.candidates.len()
        );
        assert_eq!(row["temperature"].as_f64(), Some(1.0));
    }
}

#[test]
fn f16_compute_on_cpu_stays_close_to_f32() {
    let f32m = load("tied");
    let opts = LoadOptions {
        precision: decision_train::Precision::F16,
        ..Default::default()
    };
    let f16m = DecisionModel::load(fixture("tied").to_str().unwrap(), &opts).unwrap();
    assert_eq!(f16m.dtype(), burn::tensor::DType::F16);
    let s = states();
    let d = max_diff(&f32m.score(&s, 3).unwrap(), &f16m.score(&s, 3).unwrap());
    eprintln!("f16 vs f32 on cpu: max |Δp| {d:.2e}");
    // Half precision keeps ~3 significant digits through two layers.
    assert!(d < 1e-2, "f16 probabilities differ from f32 by {d}");
}
