//! Rendering a state as the decision prompt and encoding it, with truncation from the oldest
//! context when the prompt is too long. The options and the answer slot are never cut.

use anyhow::{Result, bail};
use decision_data::State;
use tokenizers::{Encoding, Token, Tokenizer};

use crate::spec::DecisionSpec;
use crate::template::{Rendered, Template};

/// A state ready for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub input_ids: Vec<u32>,
    /// Label token of each candidate, in candidate order.
    pub option_token_ids: Vec<u32>,
    /// True when the oldest part of the context was cut to fit `max_tokens`.
    pub truncated: bool,
    /// Bytes of context dropped from the front.
    pub dropped_context_bytes: usize,
}

/// Everything needed to encode states: the parsed template, the tokenizer, label ids, bounds.
#[derive(Clone)]
pub struct Prompter {
    pub template: Template,
    pub tokenizer: Tokenizer,
    pub labels: Vec<String>,
    pub label_token_ids: Vec<u32>,
    pub max_options: usize,
    pub max_tokens: usize,
    /// The tokenizer without its added tokens: what the text between two of the template's
    /// markers is encoded with, so that a marker typed in a state stays text.
    plain: Tokenizer,
    /// The added tokens (chat markers and the like), longest first.
    markers: Vec<(String, u32)>,
}

/// The tokenizer's pipeline (normalizer, pre-tokenizer, model, decoder) without its added
/// tokens. Qwen's chat markers live only among the added tokens, so this encodes `<|im_end|>` as
/// the six pieces of its text.
fn without_added_tokens(tok: &Tokenizer) -> Tokenizer {
    let mut plain = Tokenizer::new(tok.get_model().clone());
    plain
        .with_normalizer(tok.get_normalizer().cloned())
        .with_pre_tokenizer(tok.get_pre_tokenizer().cloned())
        .with_decoder(tok.get_decoder().cloned());
    plain
}

impl Prompter {
    /// Check the spec against the tokenizer: every label of the first `max_options` is one token;
    /// when the spec lists label ids they must be the tokenizer's.
    pub fn new(spec: &DecisionSpec, tokenizer: Tokenizer, max_positions: usize) -> Result<Self> {
        spec.validate()?;
        let template = Template::parse(&spec.template)?;
        let ids = crate::tokenizer::label_token_ids(&tokenizer, &spec.labels, spec.max_options)?;
        if !spec.label_token_ids.is_empty() && spec.label_token_ids != ids {
            bail!(
                "decision.json lists label token ids {:?} but this tokenizer encodes the labels as {:?}: \
                 the tokenizer is not the one the model was trained with",
                spec.label_token_ids,
                ids
            );
        }
        let mut markers: Vec<(String, u32)> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| !t.content.is_empty())
            .map(|(id, t)| (t.content, id))
            .collect();
        markers.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let prompter = Self {
            template,
            plain: without_added_tokens(&tokenizer),
            tokenizer,
            labels: spec.labels.clone(),
            label_token_ids: ids,
            max_options: spec.max_options,
            max_tokens: spec.max_tokens.min(max_positions),
            markers,
        };
        prompter.check_labels_in_place()?;
        Ok(prompter)
    }

    /// Each label, where the template's option line puts it, must encode as the label's own
    /// token: the model reads the options in the prompt and answers with the label's token, so a
    /// template that glues a label to its neighbours (` A` or `A.` as one token) would make it
    /// read one token and be scored on another.
    fn check_labels_in_place(&self) -> Result<()> {
        let n = self.max_options;
        let probe = State::unlabelled(
            "label-probe",
            "point",
            "context",
            (0..n).map(|i| (format!("c{i}"), "option".to_string())),
        );
        let r = self.template.render(&probe, &probe.context, &self.labels);
        let enc = self.tokenize(&r)?;
        let mut bad = Vec::new();
        for (i, span) in &r.labels {
            let i = *i;
            let covering: Vec<(u32, &str)> = enc
                .get_offsets()
                .iter()
                .zip(enc.get_ids())
                .zip(enc.get_tokens())
                .filter(|(((s, e), _), _)| *s < span.end && *e > span.start)
                .map(|(((_, _), id), t)| (*id, t.as_str()))
                .collect();
            if covering.iter().map(|c| c.0).collect::<Vec<_>>() != [self.label_token_ids[i]] {
                bad.push(format!(
                    "{:?} (token {}) is encoded in the option list as {:?}",
                    self.labels[i],
                    self.label_token_ids[i],
                    covering.iter().map(|c| c.1).collect::<Vec<_>>()
                ));
            }
        }
        if !bad.is_empty() {
            bail!(
                "the option template {:?} does not keep each label a token of its own: {}; \
                 put a space or a newline before the label and punctuation after it, \
                 as in \"{{label}}. {{text}}\"",
                self.template.option_text(),
                bad.join("; ")
            );
        }
        Ok(())
    }

    /// The longest added token that starts at `text[at..]`.
    fn marker_at(&self, text: &str, at: usize) -> Option<(usize, u32)> {
        let rest = &text.as_bytes()[at..];
        self.markers
            .iter()
            .find(|(m, _)| rest.starts_with(m.as_bytes()))
            .map(|(m, id)| (m.len(), *id))
    }

    /// Encode a rendered prompt. An added token (a chat marker) counts only where the template
    /// wrote it: the text is cut at those markers, as `tokenizers` cuts at every added token,
    /// and each piece between them is encoded without added tokens, so a marker typed in a
    /// context or a candidate is encoded as text. Then the tokenizer's post-processor runs.
    fn tokenize(&self, r: &Rendered) -> Result<Encoding> {
        let text = &r.text;
        let err = |e| anyhow::anyhow!("tokenizing prompt: {e}");
        let mut parts = Vec::new();
        let mut plain_from = 0;
        let push_plain = |parts: &mut Vec<Encoding>, from: usize, to: usize| -> Result<()> {
            if from < to {
                let mut enc = self.plain.encode(&text[from..to], false).map_err(err)?;
                for o in enc.get_offsets_mut() {
                    *o = (o.0 + from, o.1 + from);
                }
                parts.push(enc);
            }
            Ok(())
        };
        for span in &r.template {
            let mut at = span.start;
            while at < span.end {
                match self.marker_at(&text[..span.end], at) {
                    Some((len, id)) => {
                        push_plain(&mut parts, plain_from, at)?;
                        let token = Token::new(id, text[at..at + len].to_string(), (at, at + len));
                        parts.push(Encoding::from_tokens(vec![token], 0));
                        at += len;
                        plain_from = at;
                    }
                    None => at += text[at..].chars().next().map_or(1, char::len_utf8),
                }
            }
        }
        push_plain(&mut parts, plain_from, text.len())?;
        self.tokenizer
            .post_process(Encoding::merge(parts, false), None, true)
            .map_err(err)
    }

    /// How many tokens the whole prompt of `state` takes, untruncated.
    pub fn untruncated_len(&self, state: &State) -> Result<usize> {
        let r = self.template.render(state, &state.context, &self.labels);
        Ok(self.tokenize(&r)?.get_ids().len())
    }

    /// Render and encode a state. Too long → the context loses its oldest tokens until the
    /// prompt fits; a prompt that does not fit even with no context is an error.
    pub fn encode(&self, state: &State) -> Result<Encoded> {
        let k = state.candidates.len();
        if k < 2 {
            bail!(
                "state {:?}: {k} candidates; a decision needs at least 2",
                state.id
            );
        }
        if k > self.max_options {
            bail!(
                "state {:?}: {k} candidates but the model labels at most max_options = {}",
                state.id,
                self.max_options
            );
        }
        let option_token_ids = self.label_token_ids[..k].to_vec();
        let mut cut = 0usize;
        for _ in 0..64 {
            let context = &state.context[cut..];
            let rendered = self.template.render(state, context, &self.labels);
            let span = rendered.context.clone();
            let enc = self.tokenize(&rendered)?;
            let n = enc.get_ids().len();
            if n <= self.max_tokens {
                return Ok(Encoded {
                    input_ids: enc.get_ids().to_vec(),
                    option_token_ids,
                    truncated: cut > 0,
                    dropped_context_bytes: cut,
                });
            }
            if context.is_empty() {
                bail!(
                    "state {:?}: the prompt without any context is {n} tokens, over max_tokens = {}; \
                     the options and the answer slot are never cut",
                    state.id,
                    self.max_tokens
                );
            }
            let excess = n - self.max_tokens;
            // Context tokens in order of their start offset; drop `excess` of them from the front.
            let starts: Vec<usize> = enc
                .get_offsets()
                .iter()
                .zip(enc.get_ids())
                .filter(|((s, e), _)| *s >= span.start && *e <= span.end && e > s)
                .map(|((s, _), _)| *s - span.start)
                .collect();
            // Too few context tokens to drop: drop all of it (the next round decides).
            let next = starts.get(excess).copied().unwrap_or(context.len());
            let mut new_cut = cut + next.max(1);
            while new_cut < state.context.len() && !state.context.is_char_boundary(new_cut) {
                new_cut += 1;
            }
            cut = new_cut.min(state.context.len());
        }
        bail!(
            "state {:?}: could not truncate the prompt to max_tokens = {}",
            state.id,
            self.max_tokens
        )
    }

    /// The prompt text of a state, untruncated (for inspection and tests).
    pub fn render(&self, state: &State) -> String {
        self.template
            .render(state, &state.context, &self.labels)
            .text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{DecisionSpec, default_labels};
    use crate::template::PromptTemplate;
    use crate::tokenizer::{WordLevelOptions, build_word_level};

    fn state(context: &str, options: &[&str]) -> State {
        let candidates = options
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("c{i}"), l.to_string()));
        State::unlabelled("s1", "tool", context, candidates)
    }

    fn prompter(max_tokens: usize) -> Prompter {
        let mut spec = DecisionSpec::defaults(PromptTemplate::plain());
        spec.max_tokens = max_tokens;
        spec.max_options = 4;
        let labels = default_labels();
        let mut req: Vec<&str> = labels.iter().map(String::as_str).collect();
        let words = Template::parse(&spec.template).unwrap().literal_text();
        req.push(&words);
        let corpus = ["tool w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 lookup_order cancel_order"];
        let tok = build_word_level(corpus, &req, &WordLevelOptions::default()).unwrap();
        Prompter::new(&spec, tok, 4096).unwrap()
    }

    #[test]
    fn renders_options_with_labels_and_ends_at_answer_slot() {
        let p = prompter(512);
        let s = state("w1 w2", &["lookup_order", "cancel_order"]);
        assert_eq!(
            p.render(&s),
            "Decision: tool\nContext:\nw1 w2\nOptions:\nA. lookup_order\nB. cancel_order\nAnswer:\n"
        );
        let e = p.encode(&s).unwrap();
        assert!(!e.truncated);
        let tok = &p.tokenizer;
        assert_eq!(
            e.option_token_ids,
            vec![tok.token_to_id("A").unwrap(), tok.token_to_id("B").unwrap()]
        );
        assert_eq!(*e.input_ids.last().unwrap(), tok.token_to_id(":").unwrap());
    }

    /// Found by the fuzzer (`decision-fuzz decision-json`, whose last state offers 30 candidates
    /// to the 26 labels of its seeds): rendering such a state indexed past the labels.
    #[test]
    fn a_state_with_more_candidates_than_labels_renders_and_is_refused() {
        let p = prompter(512);
        let many: Vec<String> = (0..p.labels.len() + 2)
            .map(|i| format!("w{}", i % 10))
            .collect();
        let s = state("w1", &many.iter().map(String::as_str).collect::<Vec<_>>());
        let text = p.render(&s);
        assert!(text.contains("\n9. w1\n?. w2\n?. w3\n"), "{text}");
        assert!(p.encode(&s).is_err());
    }

    #[test]
    fn truncation_cuts_oldest_context_only() {
        let s = state(
            "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9",
            &["lookup_order", "cancel_order"],
        );
        let full = prompter(512).encode(&s).unwrap();
        let n = full.input_ids.len();
        // Allow 3 context tokens fewer than needed: the three oldest words go.
        let p = prompter(n - 3);
        let e = p.encode(&s).unwrap();
        assert!(e.truncated);
        assert_eq!(e.input_ids.len(), n - 3);
        let kept = p.tokenizer.decode(&e.input_ids, false).unwrap();
        assert!(kept.contains("w3 w4") && !kept.contains("w2"), "{kept}");
        assert!(
            kept.ends_with("A . lookup_order B . cancel_order Answer :"),
            "{kept}"
        );
        // The whole context can go; the options never.
        let ctx_tokens = 10;
        let e = prompter(n - ctx_tokens).encode(&s).unwrap();
        assert!(e.truncated);
        assert_eq!(e.dropped_context_bytes, s.context.len());
        let err = prompter(n - ctx_tokens - 1)
            .encode(&s)
            .unwrap_err()
            .to_string();
        assert!(err.contains("never cut") && err.contains("\"s1\""), "{err}");
    }

    #[test]
    fn too_many_options_are_refused() {
        let p = prompter(512);
        let s = state("w1", &["a", "b", "c", "d", "e"]);
        let e = p.encode(&s).unwrap_err().to_string();
        assert!(e.contains("max_options = 4"), "{e}");
    }
}
