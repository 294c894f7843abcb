//! decision-train: the decision model ([`model`]) and the jobs that train and evaluate it.
//!
//! - [`model`]: the library. Qwen3 in Burn 0.22 with Hugging Face weights (local folder or Hub),
//!   LoRA and its PEFT files, the backends, and option scoring (contracts section 2). Entry
//!   point: [`DecisionModel::load`], then [`DecisionModel::encode`] / [`DecisionModel::score`] /
//!   [`DecisionModel::save`]. It imports nothing from the trainer side.
//! - the trainer, a client of the library: [`trainer::train`] (the loop, its run folder,
//!   checkpoints and resume), the loss (`loss.rs`), [`plan`] (memory), [`eval`], and the
//!   commands' arguments ([`cli`]) and pipelines ([`run`]).
//!
//! Rendering and encoding the prompt live in the Burn-free `decision-prompt` crate, which the
//! worker shares.

pub mod model;

// The trainer (issue 4).
mod calibration;
mod checkpoint;
pub mod cli;
pub mod data_order;
pub mod eval;
mod finish_by_hand;
mod loss;
mod metrics;
mod micro_batch;
mod optim;
pub mod plan;
mod plots;
mod receipts;
mod recompute;
mod replay;
pub mod run;
pub mod run_config;
pub mod run_folder;
mod run_lock;
pub mod trainer;
#[cfg(test)]
mod trainer_tests;

pub use model::backend::{Backend, Precision};
pub use model::config::Qwen3Config;
pub use model::decision_model::{DecisionModel, LoadOptions, default_spec};
pub use model::qwen3::{Batch, Qwen3};
pub use model::score::Scores;
pub use model::weights::{HfTensor, SaveDtype};
