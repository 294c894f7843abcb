//! `decision.json`: how a model turns a state into a prompt and reads its answer — the prompt
//! template, the option labels and their token ids, `max_options`, `max_tokens`, temperatures
//! per decision point. A model folder holds it beside the Hugging Face files, and the export
//! bundle carries the same file (contracts section 5). A plain Hugging Face checkpoint has none:
//! the defaults apply.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "decision-config/1";
pub const FILE: &str = "decision.json";

/// Label strings in order: `A`–`Z`, then `a`–`z`, then `0`–`9`.
pub fn default_labels() -> Vec<String> {
    ('A'..='Z')
        .chain('a'..='z')
        .chain('0'..='9')
        .map(String::from)
        .collect()
}

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

/// The contents of `decision.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionSpec {
    pub schema: String,
    pub template: PromptTemplate,
    /// Label of option `i` is `labels[i]`; each must be one token of the model's tokenizer.
    pub labels: Vec<String>,
    /// Token id of each of the first `max_options` labels. Filled in from the tokenizer; when a
    /// file gives them they must agree with it.
    #[serde(default)]
    pub label_token_ids: Vec<u32>,
    pub max_options: usize,
    /// Prompt length bound; longer prompts lose their oldest context.
    pub max_tokens: usize,
    /// Temperature `T` for points without their own entry in `temperatures`.
    pub temperature: f64,
    #[serde(default)]
    pub temperatures: BTreeMap<String, f64>,
    /// The decision points the model was trained on (informational; any point can be scored).
    #[serde(default)]
    pub points: Vec<String>,
}

impl DecisionSpec {
    /// Defaults for a checkpoint without `decision.json`.
    pub fn defaults(template: PromptTemplate) -> Self {
        Self {
            schema: SCHEMA.into(),
            template,
            labels: default_labels(),
            label_token_ids: Vec::new(),
            max_options: 26,
            max_tokens: 1024,
            temperature: 1.0,
            temperatures: BTreeMap::new(),
            points: Vec::new(),
        }
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
        match value.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA) => {}
            Some(other) => bail!(
                "{}: schema {other:?} is not supported (this build reads {SCHEMA:?})",
                path.display()
            ),
            None => bail!(
                "{}: field `schema` is missing (expected {SCHEMA:?})",
                path.display()
            ),
        }
        let spec: DecisionSpec = serde_json::from_value(value)
            .with_context(|| format!("{}: not a valid decision config", path.display()))?;
        spec.validate()
            .with_context(|| format!("{}: invalid decision config", path.display()))?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<()> {
        if self.max_options < 2 {
            bail!(
                "max_options is {}; a decision needs at least 2 options",
                self.max_options
            );
        }
        if self.labels.len() < self.max_options {
            bail!(
                "{} labels cannot label max_options = {} options",
                self.labels.len(),
                self.max_options
            );
        }
        let mut seen = std::collections::HashSet::new();
        for l in &self.labels {
            if l.is_empty() || !seen.insert(l) {
                bail!("labels must be non-empty and distinct (label {l:?})");
            }
        }
        if self.max_tokens < 8 {
            bail!(
                "max_tokens is {}; too small for any prompt",
                self.max_tokens
            );
        }
        for (point, t) in std::iter::once(("<default>", &self.temperature))
            .chain(self.temperatures.iter().map(|(p, t)| (p.as_str(), t)))
        {
            if !(t.is_finite() && *t > 0.0) {
                bail!("temperature for {point} is {t}; it must be a positive number");
            }
        }
        crate::prompt::Template::parse(&self.template)?;
        Ok(())
    }

    /// The temperature of a decision point.
    pub fn temperature_for(&self, point: &str) -> f64 {
        self.temperatures
            .get(point)
            .copied()
            .unwrap_or(self.temperature)
    }
}
