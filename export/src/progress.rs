//! Progress bars: the data crate's one bar maker ([`decision_data::progress::task`]).

pub use decision_data::progress::task as bar;
