//! The decision model: Qwen3 in Burn 0.22 with Hugging Face weights and tokenizer, the decision
//! prompt, option scoring (contracts section 2) and `decision score`.
//!
//! Entry point: [`DecisionModel::load`] (a folder or a Hub id), then [`DecisionModel::encode`] /
//! [`DecisionModel::score`] / [`DecisionModel::save`] / [`DecisionModel::hf_tensors`].

pub mod backend;
pub mod cli;
pub mod config;
mod decision_model;
pub mod hub;
pub mod model;
pub mod random_checkpoint;
pub mod run;
pub mod score;
pub mod weights;

// Rendering and encoding live in the Burn-free decision-prompt crate, which the worker shares.
pub use decision_prompt::{spec, tokenizer};

// The trainer (issue 4).
mod calibration;
mod checkpoint;
pub mod data_order;
pub mod eval;
pub mod f16_safety;
pub mod lora;
mod loss;
mod metrics;
mod micro_batch;
mod optim;
pub mod peft;
pub mod plan;
mod plots;
mod receipts;
mod recompute;
pub mod run_config;
mod run_lock;
pub mod trainer;
#[cfg(test)]
mod trainer_tests;

pub use backend::{Backend, Precision};
pub use config::Qwen3Config;
pub use decision_model::{DecisionModel, LoadOptions, default_spec};
pub use decision_prompt::{DecisionSpec, PromptTemplate};
pub use decision_prompt::{Encoded, Prompter};
pub use model::{Batch, Qwen3};
pub use score::Scores;
pub use weights::{HfTensor, SaveDtype};
