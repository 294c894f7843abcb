//! The model's `tokenizer.json` (Hugging Face `tokenizers`), the checks a decision model needs
//! from it (labels that are one token each, a padding id, chat markers), and the word-level
//! tokenizer that the tiny from-scratch models use.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use tokenizers::Tokenizer;

pub const PAD: &str = "[PAD]";
pub const UNK: &str = "[UNK]";

/// Read a `tokenizer.json`.
pub fn load(path: &Path) -> Result<Tokenizer> {
    Tokenizer::from_file(path)
        .map_err(|e| anyhow!("{}: cannot load tokenizer: {e}", path.display()))
}

/// Token ids of the first `n` labels, each checked to be exactly one token that decodes back to
/// the label (an unknown-token fallback does not count). Refuses a tokenizer that cannot label
/// `n` options.
pub fn label_token_ids(tok: &Tokenizer, labels: &[String], n: usize) -> Result<Vec<u32>> {
    if labels.len() < n {
        bail!(
            "{} labels cannot label max_options = {n} options",
            labels.len()
        );
    }
    let mut ids = Vec::with_capacity(n);
    let mut bad = Vec::new();
    for label in &labels[..n] {
        match single_token(tok, label) {
            Some(id) if !ids.contains(&id) => ids.push(id),
            Some(id) => bad.push(format!("{label:?} (same token {id} as an earlier label)")),
            None => bad.push(format!("{label:?}")),
        }
    }
    if !bad.is_empty() {
        bail!(
            "the tokenizer cannot label max_options = {n} options: {} {} not a single token of its \
             vocabulary. Lower max_options, or give labels (in decision.json) that are each one \
             token, a different one for each label",
            bad.join(", "),
            if bad.len() == 1 { "is" } else { "are" }
        );
    }
    Ok(ids)
}

/// The id of `text` when it encodes to exactly one token that decodes back to it.
/// An added token (a chat marker such as `<|im_end|>`) is not one: a label must be text.
pub fn single_token(tok: &Tokenizer, text: &str) -> Option<u32> {
    let enc = tok.encode(text, false).ok()?;
    let [id] = enc.get_ids() else { return None };
    if tok.get_added_tokens_decoder().contains_key(id) {
        return None;
    }
    let back = tok.decode(&[*id], false).ok()?;
    (back.trim() == text).then_some(*id)
}

/// The id used for left padding: the tokenizer's own padding token, else `[PAD]`, `<|endoftext|>`
/// or `<pad>`, else 0. Padded positions are masked, so any id works; a real one reads better.
pub fn pad_id(tok: &Tokenizer) -> u32 {
    if let Some(p) = tok.get_padding() {
        return p.pad_id;
    }
    [PAD, "<|endoftext|>", "<pad>"]
        .iter()
        .find_map(|t| tok.token_to_id(t))
        .unwrap_or(0)
}

/// Whether the tokenizer has Qwen's chat markers, and whether it has the think markers.
pub fn chat_markers(tok: &Tokenizer) -> (bool, bool) {
    let has = |t: &str| tok.token_to_id(t).is_some();
    (
        has("<|im_start|>") && has("<|im_end|>"),
        has("<think>") && has("</think>"),
    )
}

/// How to count words when building a word-level vocabulary: the same split as the tokenizer's
/// `Whitespace` pre-tokenizer, `\w+|[^\w\s]+`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| regex::Regex::new(r"\w+|[^\w\s]+").expect("valid regex"))
        .find_iter(text)
        .map(|m| m.as_str())
}

/// Options for [`build_word_level`].
#[derive(Debug, Clone)]
pub struct WordLevelOptions {
    /// Words seen fewer times than this in the corpus map to `[UNK]` (required words are kept).
    pub min_count: usize,
    /// Upper bound on the vocabulary, specials and required words included (most frequent kept).
    pub max_vocab: Option<usize>,
}

impl Default for WordLevelOptions {
    fn default() -> Self {
        Self {
            min_count: 1,
            max_vocab: None,
        }
    }
}

/// Build a word-level tokenizer for a model trained from scratch: `[PAD]` = 0, `[UNK]` = 1, then
/// every word of `required` (labels, template words) in order, then the corpus words by falling
/// frequency (ties alphabetical), so the same corpus always gives the same ids. Words are
/// `\w+|[^\w\s]+` runs; whitespace separates and is dropped.
pub fn build_word_level<'a>(
    corpus: impl IntoIterator<Item = &'a str>,
    required: &[&str],
    opts: &WordLevelOptions,
) -> Result<Tokenizer> {
    let mut vocab: Vec<String> = vec![PAD.into(), UNK.into()];
    let mut index: HashMap<String, u32> = vocab.iter().cloned().zip(0..).collect();
    for text in required {
        for w in words(text) {
            if !index.contains_key(w) {
                index.insert(w.to_string(), vocab.len() as u32);
                vocab.push(w.to_string());
            }
        }
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for text in corpus {
        for w in words(text) {
            *counts.entry(w).or_default() += 1;
        }
    }
    let mut ranked: Vec<(&str, usize)> = counts
        .into_iter()
        .filter(|(w, c)| *c >= opts.min_count && !index.contains_key(*w))
        .collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let room = opts
        .max_vocab
        .map_or(usize::MAX, |m| m.saturating_sub(vocab.len()));
    for (w, _) in ranked.into_iter().take(room) {
        index.insert(w.to_string(), vocab.len() as u32);
        vocab.push(w.to_string());
    }
    let vocab_json: serde_json::Map<String, serde_json::Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, w)| (w.clone(), json!(i)))
        .collect();
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(0, PAD), added(1, UNK)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab_json, "unk_token": UNK},
    });
    Tokenizer::from_str(&doc.to_string()).map_err(|e| anyhow!("building word-level tokenizer: {e}"))
}

/// Write `tokenizer.json` atomically.
pub fn save(tok: &Tokenizer, path: &Path) -> Result<()> {
    let text = tok
        .to_string(true)
        .map_err(|e| anyhow!("serialising tokenizer: {e}"))?;
    decision_data::atomic::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{PromptTemplate, default_labels};

    fn tiny() -> Tokenizer {
        let labels = default_labels();
        let mut required: Vec<&str> = labels.iter().map(String::as_str).collect();
        let t = PromptTemplate::plain();
        required.push(&t.text);
        build_word_level(
            [
                "tool lookup_order(ord_117)!! for",
                "stop lookup_order lookup_order ord_9",
            ],
            &required,
            &WordLevelOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn word_level_splits_words_and_punctuation() {
        let tok = tiny();
        let enc = tok.encode("lookup_order(ord_117)!! unseen", false).unwrap();
        let toks: Vec<&str> = enc.get_tokens().iter().map(String::as_str).collect();
        assert_eq!(toks, ["lookup_order", "(", "ord_117", ")!!", "[UNK]"]);
        assert_eq!(tok.token_to_id(PAD), Some(0));
        assert_eq!(tok.token_to_id(UNK), Some(1));
        assert_eq!(pad_id(&tok), 0);
        // Required words come first, in order: A is the first label.
        assert_eq!(tok.token_to_id("A"), Some(2));
        // Most frequent corpus word first among the corpus words.
        let lookup = tok.token_to_id("lookup_order").unwrap();
        let ord9 = tok.token_to_id("ord_9").unwrap();
        assert!(lookup < ord9);
    }

    #[test]
    fn word_level_round_trips_through_json_and_respects_limits() {
        let tok = tiny();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        save(&tok, &path).unwrap();
        let back = load(&path).unwrap();
        assert_eq!(back.get_vocab(true), tok.get_vocab(true));
        let capped = build_word_level(
            ["a a a b b c"],
            &[],
            &WordLevelOptions {
                min_count: 2,
                max_vocab: Some(3),
            },
        )
        .unwrap();
        assert_eq!(capped.get_vocab_size(true), 3);
        assert_eq!(capped.token_to_id("a"), Some(2));
        assert_eq!(capped.token_to_id("b"), None);
    }

    #[test]
    fn labels_must_be_single_known_tokens() {
        let tok = tiny();
        let labels = default_labels();
        let ids = label_token_ids(&tok, &labels, 30).unwrap();
        assert_eq!(ids.len(), 30);
        let bad: Vec<String> = vec!["A".into(), "ZZ".into(), "A B".into()];
        let e = label_token_ids(&tok, &bad, 3).unwrap_err().to_string();
        assert!(
            e.contains("\"ZZ\"") && e.contains("\"A B\"") && e.contains("max_options = 3"),
            "{e}"
        );
        let e = label_token_ids(&tok, &labels, 63).unwrap_err().to_string();
        assert!(e.contains("63 options"), "{e}");
    }
}
