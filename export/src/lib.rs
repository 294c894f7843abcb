//! decision-export: turns a trained decision model into the bundle the desktop harness loads
//! (contracts section 5): ONNX and PEFT writers over one [graph description](graph), the manifest,
//! the parity gate, and `decision bundle verify`.

pub mod bundle;
pub mod cli;
/// The one Qwen3 `config.json` reader, shared with training.
pub use decision_train::Qwen3Config;
pub mod coreml;
mod format;
pub mod graph;
pub mod lora;
pub mod onnx;
pub mod parity;
mod run;
pub mod samples;
pub mod source;
pub mod verify;

/// The export pipeline (`decision export` parses its arguments into [`ExportOptions`]).
pub use run::{ExportOptions, Format, WeightDtype, run, run_from};
