//! Decision states and receipts as `../shared/design/contracts.md` defines them (sections 1 and 3),
//! the files that hold them, and the synthetic states the demo trains on.
//!
//! Reading states: [`StateReader`] streams rows from files or folders of shards;
//! `.validated(opts)` applies every rule of [`check_state`]; [`Quarantine`] keeps the bad rows.
//! Writing: [`StateWriter`] / [`write_states`] (format by extension, atomic).

pub mod atomic;
pub mod calibration;
pub mod cli;
pub mod contract;
/// Synthetic decision states (`decision gen states`); `gen` is a reserved word in edition 2024.
pub mod r#gen;
pub mod outputs;
mod parquet_pages;
pub mod paths;
pub mod progress;
pub mod quarantine;
mod receipt;
pub mod receipts_io;
mod split;
pub mod stable_hash;
mod state;
pub mod states_io;
pub mod stats;
mod string_column;
pub mod tree;
mod validate;

pub use quarantine::Quarantine;
pub use receipt::{Fallback, Outcome, OutcomeStatus, Receipt, ReceiptResult, Shadow, Validation};
pub use split::{Split, SplitRatios};
pub use state::{Candidate, State};
pub use states_io::{
    BadRow, BadRows, FieldError, Format, ReadItem, Row, StateReader, StateWriter, read_states,
    write_states,
};
pub use validate::{ValidateOptions, Validator, check_state};
