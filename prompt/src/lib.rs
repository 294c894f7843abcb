//! decision-prompt: how a decision state becomes the model's input, shared by training
//! (`decision-train`, which re-exports what its users need) and the Burn-free `decision-worker`, so
//! both render, truncate and encode a state with one implementation.
//!
//! - [`spec`]: `decision.json` (template, labels and their token ids, bounds, temperatures,
//!   the worker's point rules);
//! - `template`: the prompt template and its parser ([`PromptTemplate`], [`Template`]);
//! - `prompt`: rendering and encoding, truncating the oldest context ([`Prompter`], [`Encoded`]);
//! - [`score`]: label logits to probabilities (softmax with a temperature);
//! - [`tokenizer`]: `tokenizer.json` loading and the checks a decision model needs from it.

mod prompt;
pub mod score;
pub mod spec;
mod template;
pub mod tokenizer;

pub use prompt::{Encoded, Prompter};
pub use spec::{DecisionSpec, TemperatureClamp};
pub use template::{PromptTemplate, Template};
