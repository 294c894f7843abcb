//! `thresholds.json` (contracts section 4): the schema string, the file name, and the one reader,
//! which checks what every consumer relies on: the schema, `fitted_at`, each point's `status` and
//! a `threshold` that agrees with it (a number in [0, 1] when fitted, `null` otherwise).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "decision-thresholds/1";
pub const FILE: &str = "thresholds.json";

/// A point's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Fitted,
    InsufficientData,
    NoAcceptableBucket,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Fitted => "fitted",
            Status::InsufficientData => "insufficient-data",
            Status::NoAcceptableBucket => "no-acceptable-bucket",
        }
    }
}

/// What a reader of one point's entry uses (the file holds more: policy, rates, buckets).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PointEntry {
    pub status: Status,
    /// `None` (`null`): never auto-accept at this point.
    pub threshold: Option<f64>,
    #[serde(default)]
    pub coverage: Option<f64>,
    #[serde(default)]
    pub success_above: Option<f64>,
    #[serde(default)]
    pub judged: Option<u64>,
}

/// A `thresholds.json`, read and checked.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ThresholdsFile {
    pub schema: String,
    pub fitted_at: String,
    pub points: BTreeMap<String, PointEntry>,
}

impl ThresholdsFile {
    /// Read and check `path`; errors name the file and the field.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&bytes).with_context(|| path.display().to_string())
    }

    /// Parse and check the bytes of a `thresholds.json`.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let j: serde_json::Value = serde_json::from_slice(bytes).context("not valid JSON")?;
        match j.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA) => {}
            other => bail!("schema is {other:?}, expected {SCHEMA:?}"),
        }
        if j.get("fitted_at").and_then(|s| s.as_str()).is_none() {
            bail!("field `fitted_at` is missing or not a string");
        }
        let points = j
            .get("points")
            .and_then(|p| p.as_object())
            .context("field `points` is missing or not an object")?;
        for (name, p) in points {
            let status = p.get("status").and_then(|s| s.as_str()).unwrap_or("");
            let threshold = p
                .get("threshold")
                .with_context(|| format!("points.{name}: field `threshold` is missing"))?;
            match (status, threshold) {
                ("fitted", serde_json::Value::Number(n))
                    if n.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)) => {}
                ("fitted", t) => {
                    bail!("points.{name}: status fitted needs a threshold in [0, 1], got {t}")
                }
                ("insufficient-data" | "no-acceptable-bucket", serde_json::Value::Null) => {}
                ("insufficient-data" | "no-acceptable-bucket", t) => {
                    bail!("points.{name}: status {status} must have a null threshold, got {t}")
                }
                (other, _) => bail!(
                    "points.{name}: status {other:?} is not one of fitted, insufficient-data, \
                     no-acceptable-bucket"
                ),
            }
        }
        serde_json::from_value(j).context("not a thresholds file")
    }

    /// Each point's threshold (`None`: never auto-accept).
    pub fn thresholds(&self) -> BTreeMap<String, Option<f64>> {
        self.points
            .iter()
            .map(|(name, p)| (name.clone(), p.threshold))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(points: &str) -> String {
        format!(
            r#"{{"schema":"{SCHEMA}","fitted_at":"2026-11-30T12:00:00Z","points":{{{points}}}}}"#
        )
    }

    #[test]
    fn a_good_file_reads_and_each_rule_names_its_field() {
        let good = doc(r#""tool":{"status":"fitted","threshold":0.9,"judged":812},
               "stop":{"status":"insufficient-data","threshold":null}"#);
        let t = ThresholdsFile::parse(good.as_bytes()).unwrap();
        assert_eq!(t.points["tool"].status, Status::Fitted);
        assert_eq!(t.points["tool"].judged, Some(812));
        assert_eq!(
            t.thresholds(),
            BTreeMap::from([("stop".into(), None), ("tool".into(), Some(0.9))])
        );
        for (bad, want) in [
            (good.replace(SCHEMA, "decision-thresholds/2"), "schema"),
            (
                good.replace(r#""fitted_at":"2026-11-30T12:00:00Z","#, ""),
                "fitted_at",
            ),
            (
                doc(r#""tool":{"status":"fitted","threshold":1.5}"#),
                "points.tool",
            ),
            (
                doc(r#""tool":{"status":"fitted","threshold":null}"#),
                "points.tool",
            ),
            (
                doc(r#""stop":{"status":"insufficient-data","threshold":0.5}"#),
                "points.stop",
            ),
            (
                doc(r#""stop":{"status":"guess","threshold":null}"#),
                "\"guess\"",
            ),
            (
                doc(r#""stop":{"status":"fitted"}"#),
                "`threshold` is missing",
            ),
            ("not json".to_string(), "not valid JSON"),
        ] {
            let e = format!("{:#}", ThresholdsFile::parse(bad.as_bytes()).unwrap_err());
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
