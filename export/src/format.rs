//! What each bundle format's export is given ([`Reference`]) and gives back ([`Written`]).
//!
//! # Adding a format
//!
//! A format is a folder beside `onnx/` and `coreml/` that owns its whole pipeline:
//!
//! - `export.rs`: `export(graph, options, dir, &Reference) -> Written<Facts>` writes the model
//!   file(s) into the staging folder and runs its parity gate against the reference (an error
//!   publishes nothing);
//! - `verify.rs`: `check(dir, &Facts)` for `decision bundle verify`, re-reading what was written;
//! - its `Facts` (what manifest.json records about it) as a field of [`crate::bundle::Formats`].
//!
//! Then a variant of [`crate::Format`] and its one arm in `run::export_into` (and in
//! `verify::verify`) wire it in. The graph description ([`crate::graph`]) is shared: a format
//! lowers it and never reads weights by itself.

use crate::parity::{self, Recorded};

/// What every model file is checked against: the training-side answers on the sample states.
pub(crate) struct Reference<'a> {
    pub recorded: &'a Recorded,
    pub batches: &'a [parity::Batch],
    /// Where the sample states came from (for the summary and `verified_with`).
    pub samples_from: &'a str,
    pub temperature: f64,
    pub pad_id: u32,
}

/// One format's part of the export: its summary lines, its `verified_with` entries and the facts
/// manifest.json records about it.
pub(crate) struct Written<F> {
    pub lines: Vec<String>,
    pub checks: Vec<serde_json::Value>,
    pub facts: F,
}
