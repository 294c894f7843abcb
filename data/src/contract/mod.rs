//! The files that cross our boundary besides states and receipts, read and checked in one place
//! (`../shared/design/contracts.md` sections 4 and 5): `thresholds.json` ([`thresholds`]), and the
//! export bundle's file names, schema and manifest walk ([`bundle`]). `fit` writes thresholds.json,
//! `export` writes bundles; the worker, `sim`, `fit --previous` and `bundle verify` read them with
//! these rules, so no reader is laxer than another.

pub mod bundle;
pub mod thresholds;
