//! The prompt template: its text as `decision.json` stores it ([`PromptTemplate`]) and its one
//! parser ([`Template`]), which `decision.json`'s validation, rendering and the word-level
//! vocabulary (the template's fixed words) all go through.

use std::ops::Range;

use anyhow::{Result, bail};
use decision_data::State;
use serde::{Deserialize, Serialize};

/// The prompt. `text` holds the placeholders `{point}` (optional), `{context}` and `{options}`
/// (each exactly once, context before options); everything after `{options}` ends at the answer
/// slot, where the model's next token is the label of its pick. `{{` and `}}` stand for literal
/// braces. Each option renders as `option` with `{label}` and `{text}` (the candidate's label),
/// joined by `option_separator`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptTemplate {
    pub text: String,
    pub option: String,
    pub option_separator: String,
}

const SYSTEM: &str = "You choose the next step for an agent. Answer with the label of one option.";

impl PromptTemplate {
    /// For tokenizers without chat markers (and the word-level tokenizer of tiny models).
    pub fn plain() -> Self {
        Self {
            text: "Decision: {point}\nContext:\n{context}\nOptions:\n{options}\nAnswer:\n".into(),
            option: "{label}. {text}".into(),
            option_separator: "\n".into(),
        }
    }

    /// Qwen's chat format; `thinking_markers` adds the empty think block of non-thinking mode.
    pub fn qwen_chat(thinking_markers: bool) -> Self {
        let think = if thinking_markers {
            "<think>\n\n</think>\n\n"
        } else {
            ""
        };
        Self {
            text: format!(
                "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nDecision: {{point}}\n\n\
                 Context:\n{{context}}\n\nOptions:\n{{options}}<|im_end|>\n<|im_start|>assistant\n{think}"
            ),
            option: "{label}. {text}".into(),
            option_separator: "\n".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Point,
    Context,
    Options,
}

/// A parsed [`PromptTemplate`].
#[derive(Debug, Clone)]
pub struct Template {
    pieces: Vec<Piece>,
    option: Vec<OptPiece>,
    option_text: String,
    separator: String,
}

#[derive(Debug, Clone, PartialEq)]
enum OptPiece {
    Text(String),
    Label,
    Body,
}

#[derive(Debug)]
enum Lex {
    Lit(String),
    Hole(String),
}

/// Split a template into literal text and `{name}` holes; `{{` and `}}` are literal braces.
fn lex(text: &str) -> Result<Vec<Lex>> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut lit = String::new();
    while let Some(i) = rest.find(['{', '}']) {
        lit.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            lit.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            bail!("template {text:?}: unmatched `}}` (write `}}}}` for a literal brace)");
        }
        let Some(end) = tail.find('}') else {
            bail!("template {text:?}: unclosed `{{` (write `{{{{` for a literal brace)");
        };
        if !lit.is_empty() {
            out.push(Lex::Lit(std::mem::take(&mut lit)));
        }
        out.push(Lex::Hole(tail[1..end].to_string()));
        rest = &tail[end + 1..];
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        out.push(Lex::Lit(lit));
    }
    Ok(out)
}

impl Template {
    pub fn parse(t: &PromptTemplate) -> Result<Self> {
        let mut pieces = Vec::new();
        for l in lex(&t.text)? {
            pieces.push(match l {
                Lex::Lit(s) => Piece::Text(s),
                Lex::Hole(name) => match name.as_str() {
                    "point" => Piece::Point,
                    "context" => Piece::Context,
                    "options" => Piece::Options,
                    other => bail!(
                        "prompt template: unknown placeholder {{{other}}} (use {{point}}, {{context}}, {{options}})"
                    ),
                },
            });
        }
        let count = |p: &Piece| pieces.iter().filter(|x| *x == p).count();
        if count(&Piece::Context) != 1 || count(&Piece::Options) != 1 {
            bail!("prompt template: {{context}} and {{options}} must each appear exactly once");
        }
        let ctx = pieces.iter().position(|p| *p == Piece::Context);
        let opt = pieces.iter().position(|p| *p == Piece::Options);
        if ctx > opt {
            bail!("prompt template: {{context}} must come before {{options}}");
        }
        let mut option = Vec::new();
        for l in lex(&t.option)? {
            option.push(match l {
                Lex::Lit(s) => OptPiece::Text(s),
                Lex::Hole(name) => match name.as_str() {
                    "label" => OptPiece::Label,
                    "text" => OptPiece::Body,
                    other => bail!(
                        "option template: unknown placeholder {{{other}}} (use {{label}} and {{text}})"
                    ),
                },
            });
        }
        if !option.contains(&OptPiece::Label) || !option.contains(&OptPiece::Body) {
            bail!("option template must contain {{label}} and {{text}}");
        }
        Ok(Self {
            pieces,
            option,
            option_text: t.option.clone(),
            separator: t.option_separator.clone(),
        })
    }

    /// The option template as written (for messages).
    pub fn option_text(&self) -> &str {
        &self.option_text
    }

    /// The template's fixed words (for building a vocabulary).
    pub fn literal_text(&self) -> String {
        let mut s = String::new();
        for p in &self.pieces {
            if let Piece::Text(t) = p {
                s.push_str(t);
                s.push(' ');
            }
        }
        for p in &self.option {
            if let OptPiece::Text(t) = p {
                s.push_str(t);
                s.push(' ');
            }
        }
        s
    }

    /// Render with `context`: the prompt, where the context sits in it, and which of its bytes
    /// the template wrote (the only place a chat marker may come from).
    pub(crate) fn render(&self, state: &State, context: &str, labels: &[String]) -> Rendered {
        let mut r = Rendered::default();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => r.template(t),
                Piece::Point => r.text.push_str(&state.point),
                Piece::Context => {
                    let start = r.text.len();
                    r.text.push_str(context);
                    r.context = start..r.text.len();
                }
                Piece::Options => {
                    for (i, c) in state.candidates.iter().enumerate() {
                        if i > 0 {
                            r.template(&self.separator);
                        }
                        for op in &self.option {
                            match op {
                                OptPiece::Text(t) => r.template(t),
                                // More candidates than labels: `encode` refuses such a state,
                                // but `render` shows it (the worker renders a refused state
                                // to tell a too-long prompt from a bad one).
                                OptPiece::Label => {
                                    let start = r.text.len();
                                    r.template(labels.get(i).map_or("?", String::as_str));
                                    r.labels.push((i, start..r.text.len()));
                                }
                                OptPiece::Body => r.text.push_str(&c.label),
                            }
                        }
                    }
                }
            }
        }
        r
    }
}

/// A rendered prompt.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    pub text: String,
    /// The byte range of the context.
    pub context: Range<usize>,
    /// Byte ranges the template wrote (its literal text, separators and labels), in order; the
    /// rest came from the state (point, context, candidate texts).
    pub template: Vec<Range<usize>>,
    /// Where the labels are: the option's index and the label's byte range (an option template
    /// may write its label more than once).
    pub labels: Vec<(usize, Range<usize>)>,
}

impl Rendered {
    fn template(&mut self, s: &str) {
        let start = self.text.len();
        self.text.push_str(s);
        match self.template.last_mut() {
            Some(last) if last.end == start => last.end = self.text.len(),
            _ => self.template.push(start..self.text.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_templates_are_refused_and_doubled_braces_are_literal() {
        for (text, want) in [
            ("{context} {point}", "exactly once"),
            ("{options} {context}", "before"),
            ("{context} {options} {answer}", "unknown placeholder"),
            ("{context {options}", "unknown placeholder"),
            ("{context} {options} }", "unmatched"),
        ] {
            let t = PromptTemplate {
                text: text.into(),
                ..PromptTemplate::plain()
            };
            let e = Template::parse(&t).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let t = PromptTemplate {
            text: "{{x}} {context} {options}".into(),
            ..PromptTemplate::plain()
        };
        let parsed = Template::parse(&t).unwrap();
        let candidates = [("c0", "a"), ("c1", "b")].map(|(i, l)| (i.to_string(), l.to_string()));
        let s = State::unlabelled("s1", "tool", "c", candidates);
        assert!(
            parsed
                .render(&s, "c", &["A".to_string(), "B".to_string()])
                .text
                .starts_with("{x} c A. a")
        );
    }
}
