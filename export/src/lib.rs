//! decision-export: turns a trained decision model into the bundle the desktop harness loads
//! (contracts section 5). [`source`] opens the model; one [graph description](graph) is lowered
//! by each format's folder ([`onnx`], [`coreml`]), which writes its files, holds them to the
//! reference ([`parity`]) and checks them again for `decision bundle verify`; `run.rs` only
//! orchestrates (one arm per format) and writes the manifest ([`bundle`]); [`verify`] holds the
//! bundle-wide checks. Adding a format: see `format.rs`.

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
