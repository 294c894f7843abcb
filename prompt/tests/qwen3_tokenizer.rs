//! The decision prompt under Qwen3's real tokenizer (151 643 BPE entries and 26 added tokens),
//! compared token for token with transformers' `apply_chat_template` and `tokenizers`
//! (tests/fixtures/prompt/qwen3-chat.json, made by scripts/make_qwen3_prompt_fixture.py).
//! The tokenizer comes from `make qwen3-tokenizer`; without it these tests say NOT RUN, and fail
//! under `DECISION_REQUIRE_CHECKERS=qwen3-tokenizer` (as `.ci/run` sets it).

#[path = "../../tests/support/checkers.rs"]
mod checkers;

use decision_data::State;
use decision_prompt::spec::{DecisionSpec, default_labels};
use decision_prompt::tokenizer::{self, label_token_ids};
use decision_prompt::{PromptTemplate, Prompter};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/prompt/qwen3-chat.json"
);

/// The real tokenizer and the reference, checked to be made from the same `tokenizer.json`.
fn setup(test: &str) -> Option<(Tokenizer, Value)> {
    let dir = checkers::qwen3_tokenizer(test)?;
    let path = dir.join("tokenizer.json");
    let bytes = std::fs::read(&path).unwrap();
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    assert_eq!(
        hex::encode(Sha256::digest(&bytes)),
        fixture["tokenizer_sha256"].as_str().unwrap(),
        "{} is not the tokenizer the reference was made with",
        path.display()
    );
    Some((tokenizer::load(&path).unwrap(), fixture))
}

fn prompter(tok: &Tokenizer, max_tokens: usize) -> Prompter {
    let mut spec = DecisionSpec::defaults(PromptTemplate::qwen_chat(true));
    spec.max_tokens = max_tokens;
    Prompter::new(&spec, tok.clone(), 40_960).unwrap()
}

fn state(case: &Value) -> State {
    let s = &case["state"];
    let text = |v: &Value| v.as_str().unwrap().to_string();
    let candidates = s["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (text(&c["id"]), text(&c["label"])));
    State::unlabelled(
        &text(&s["id"]),
        &text(&s["point"]),
        &text(&s["context"]),
        candidates,
    )
}

fn ids(case: &Value) -> Vec<u32> {
    let ids = case["ids"].as_array().unwrap();
    ids.iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn cases(fixture: &Value) -> &[Value] {
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 6, "the reference lost cases");
    cases
}

#[test]
fn prompts_match_transformers_chat_template_token_for_token() {
    let Some((tok, fixture)) = setup("prompts_match_transformers_chat_template_token_for_token")
    else {
        return;
    };
    let p = prompter(&tok, 4096);
    let im_start = tok.token_to_id("<|im_start|>");
    let im_end = tok.token_to_id("<|im_end|>");
    for case in cases(&fixture) {
        let name = case["name"].as_str().unwrap();
        let s = state(case);
        assert_eq!(p.render(&s), case["text"].as_str().unwrap(), "{name}: text");
        let enc = p.encode(&s).unwrap();
        assert!(!enc.truncated, "{name}");
        assert_eq!(enc.input_ids, ids(case), "{name}: token ids");
        // The template writes three <|im_start|> and two <|im_end|>; a typed one stays text.
        let count = |id| enc.input_ids.iter().filter(|&&t| Some(t) == id).count();
        assert_eq!((count(im_start), count(im_end)), (3, 2), "{name}");
    }
    let typed = cases(&fixture)
        .iter()
        .filter(|c| c["typed_markers"] == true);
    assert!(typed.count() > 0, "no case types a marker");
    let nfd = cases(&fixture).iter().filter(|c| c["nfc_changed"] == true);
    assert!(nfd.count() > 0, "no case needs the NFC normalizer");
}

#[test]
fn a_prompt_of_exactly_max_tokens_is_kept_and_one_token_less_cuts_the_oldest_context() {
    let Some((tok, fixture)) = setup("a_prompt_of_exactly_max_tokens_is_kept") else {
        return;
    };
    for case in cases(&fixture) {
        let name = case["name"].as_str().unwrap();
        let s = state(case);
        let want = ids(case);
        let n = want.len();
        let exact = prompter(&tok, n).encode(&s).unwrap();
        assert!(!exact.truncated, "{name}");
        assert_eq!(exact.input_ids, want, "{name}");
        let cut = prompter(&tok, n - 1).encode(&s).unwrap();
        assert!(cut.truncated && cut.input_ids.len() < n, "{name}");
        assert!(cut.dropped_context_bytes > 0, "{name}");
        assert!(
            s.context.is_char_boundary(cut.dropped_context_bytes),
            "{name}"
        );
        // Only the oldest context goes: the kept prompt is the full encoding of the state with
        // the shorter context, and it ends as the reference does (options, answer slot).
        let mut shorter = s.clone();
        shorter.context = s.context[cut.dropped_context_bytes..].to_string();
        let again = prompter(&tok, 4096).encode(&shorter).unwrap();
        assert_eq!(cut.input_ids, again.input_ids, "{name}");
        let tail = 12;
        assert_eq!(
            cut.input_ids[cut.input_ids.len() - tail..],
            want[n - tail..],
            "{name}"
        );
    }
}

#[test]
fn labels_are_single_tokens_of_the_real_vocabulary_where_the_template_puts_them() {
    let Some((tok, fixture)) = setup("labels_are_single_tokens_of_the_real_vocabulary") else {
        return;
    };
    let labels = default_labels();
    let ids = label_token_ids(&tok, &labels, labels.len()).unwrap();
    for (label, id) in labels.iter().zip(&ids).take(26) {
        assert_eq!(
            fixture["label_ids"][label],
            serde_json::json!([id]),
            "{label}"
        );
    }
    // All 62 labels stay one token each in the option list of Qwen's chat template.
    let mut spec = DecisionSpec::defaults(PromptTemplate::qwen_chat(true));
    spec.max_options = labels.len();
    Prompter::new(&spec, tok.clone(), 40_960).unwrap();

    // A label of two tokens, and a chat marker as a label, are refused by name.
    let bad: Vec<String> = ["A", "Option 1", "<|im_end|>"].map(String::from).to_vec();
    let e = label_token_ids(&tok, &bad, 3).unwrap_err().to_string();
    assert!(
        e.contains("\"Option 1\"") && e.contains("\"<|im_end|>\"") && !e.contains("\"A\""),
        "{e}"
    );

    // A template that glues the label to the word before it: ` A` is one token, not `A`.
    spec.max_options = 4;
    spec.template.option = "Option {label}: {text}".into();
    let e = Prompter::new(&spec, tok, 40_960).err().unwrap().to_string();
    assert!(
        e.contains("\"A\" (token 32)") && e.contains("Option {label}"),
        "{e}"
    );
}
