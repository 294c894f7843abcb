//! `decision sim`: the synthetic shop's agent run end to end, with the decision model deciding
//! where a mode lets it, so that thresholds are proven in the loop and not only state by state.
//!
//! Each task is an [`Episode`](decision_data::r#gen::Episode) of the shop: the next state follows
//! from the choice actually made, a wrong irreversible action or a premature `finish` fails the
//! task. The agent's LLM is simulated ([`llm`]) from the generator's teacher; the decision model
//! is whatever [`Scorer`] the caller brings (the CLI: the export bundle through the harness's own
//! code, or a training run), its scores cached by state ([`scorer::Cache`]). Every mode runs on
//! the same tasks ([`run`]); the report ([`report`]) compares each with `llm` on those paired
//! tasks ([`stats`]). `shadow` and `cascade` record contract receipts with the task's outcome and
//! the answer key as `shadow.reference` ([`run::ModeRun::receipts`]), which `decision fit` reads.

pub mod cli;
pub mod llm;
pub mod mode;
pub mod report;
pub mod run;
pub mod scorer;
pub mod stats;

pub use cli::SimArgs;
pub use llm::Llm;
pub use mode::Mode;
pub use run::{ModeRun, SimConfig, TaskResult, run_mode};
pub use scorer::{Cache, Scorer};

/// Per decision point: `Some(t)` auto-accepts the model's pick at confidence ≥ `t`; `None`
/// (`threshold: null`, or no entry) never does.
pub type Thresholds = std::collections::BTreeMap<String, Option<f64>>;
