//! Decision states and receipts as `../shared/design/contracts.md` defines them (sections 1 and 3),
//! the files that hold them, and the synthetic states the demo trains on.

pub mod atomic;
pub mod receipt;
pub mod state;

pub use receipt::{Fallback, Outcome, OutcomeStatus, Receipt, ReceiptResult, Shadow, Validation};
pub use state::{Candidate, State};
