//! decision-prompt: how a decision state becomes the model's input, shared by training
//! (`decision-train`, which re-exports these modules) and the Burn-free `decision-worker`, so
//! both render, truncate and encode a state with one implementation.
//!
//! - [`spec`]: `decision.json` (template, labels and their token ids, bounds, temperatures,
//!   the worker's point rules);
//! - [`template`]: the prompt template and its parser;
//! - [`prompt`]: rendering and encoding, truncating the oldest context ([`Prompter`]);
//! - [`score`]: label logits to probabilities (softmax with a temperature);
//! - [`tokenizer`]: `tokenizer.json` loading and the checks a decision model needs from it.

pub mod prompt;
pub mod score;
pub mod spec;
pub mod template;
pub mod tokenizer;

pub use prompt::{Encoded, Prompter};
pub use spec::{DecisionSpec, TemperatureClamp};
pub use template::PromptTemplate;
