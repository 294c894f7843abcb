//! `decision.json`: how a model turns a state into a prompt and reads its answer — the prompt
//! template, the option labels and their token ids, `max_options`, `max_tokens`, temperatures
//! per decision point. A model folder holds it beside the Hugging Face files, and the export
//! bundle carries the same file (contracts section 5). A plain Hugging Face checkpoint has none:
//! the defaults apply.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The type of [`DecisionSpec::template`] (defined with its parser in [`crate::template`]).
pub use crate::template::PromptTemplate;
use crate::template::Template;

pub const SCHEMA: &str = "decision-config/1";
pub const FILE: &str = "decision.json";

/// Label strings in order: `A`–`Z`, then `a`–`z`, then `0`–`9`.
pub fn default_labels() -> Vec<String> {
    ('A'..='Z')
        .chain('a'..='z')
        .chain('0'..='9')
        .map(String::from)
        .collect()
}

/// The contents of `decision.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionSpec {
    pub schema: String,
    pub template: PromptTemplate,
    /// Label of option `i` is `labels[i]`; each must be one token of the model's tokenizer.
    pub labels: Vec<String>,
    /// Token id of each of the first `max_options` labels. Filled in from the tokenizer; when a
    /// file gives them they must agree with it.
    #[serde(default)]
    pub label_token_ids: Vec<u32>,
    pub max_options: usize,
    /// Prompt length bound; longer prompts lose their oldest context.
    pub max_tokens: usize,
    /// Temperature `T` for points without their own entry in `temperatures`.
    pub temperature: f64,
    #[serde(default)]
    pub temperatures: BTreeMap<String, f64>,
    /// Set when `temperature` is not a fitted minimum but the bound of the fit's range it ran
    /// into (`floor` 0.05, `ceiling` 20): at the floor the validation NLL was still falling, as
    /// it does when every state is right by a wide margin, so the model is at least this sure
    /// and how much surer is unknown. Absent (older files too) means fitted or not fitted at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_clamped: Option<TemperatureClamp>,
    /// The points of `temperatures` whose fit sits at a bound, as for `temperature_clamped`;
    /// a point absent here (older files: every point) has a fitted temperature.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub temperatures_clamped: BTreeMap<String, TemperatureClamp>,
    /// The decision points the model was trained on (informational; any point can be scored).
    #[serde(default)]
    pub points: Vec<String>,
    /// How `decision-worker` names the decision point of a request, which does not carry one:
    /// the first rule that matches the offered candidate ids wins. Empty (a training run's
    /// `decision.json`) means [`keel_point_rules`]; `decision export` writes the rules out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub point_rules: Vec<PointRule>,
}

/// Which bound of its range a fitted temperature sits at ([`DecisionSpec::temperature_clamped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TemperatureClamp {
    /// The lower bound (0.05): the NLL still falls as `T` goes to 0.
    Floor,
    /// The upper bound (20): the NLL still falls as `T` grows (the logits carry no signal).
    Ceiling,
}

impl std::fmt::Display for TemperatureClamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TemperatureClamp::Floor => "floor",
            TemperatureClamp::Ceiling => "ceiling",
        })
    }
}

/// One rule of [`DecisionSpec::point_rules`]: `point` applies when the request offers exactly the
/// candidate ids in `candidates` (as a set: order does not matter), or to any request when
/// `candidates` is absent (the catch-all, which must come last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointRule {
    pub point: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<String>>,
}

impl PointRule {
    pub fn matches(&self, ids: &[&str]) -> bool {
        match &self.candidates {
            None => true,
            Some(want) => {
                let mut a: Vec<&str> = want.iter().map(String::as_str).collect();
                let mut b: Vec<&str> = ids.to_vec();
                a.sort_unstable();
                b.sort_unstable();
                a == b
            }
        }
    }
}

/// keel's two decision sites (`../shared/reference/keel-integration.md`): its `preStep` focus
/// choice offers exactly `inspect`, `implement`, `verify`, `answer` and becomes point `pre_step`
/// (the point keel's own receipts map `stage: preStep` to); everything else is `intake`.
pub fn keel_point_rules() -> Vec<PointRule> {
    vec![
        PointRule {
            point: "pre_step".into(),
            candidates: Some(
                ["inspect", "implement", "verify", "answer"]
                    .map(String::from)
                    .to_vec(),
            ),
        },
        PointRule {
            point: "intake".into(),
            candidates: None,
        },
    ]
}

/// `[a-z][a-z0-9_]*`, as contracts section 1 names decision points.
pub fn valid_point(p: &str) -> bool {
    let mut b = p.bytes();
    matches!(b.next(), Some(b'a'..=b'z'))
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

impl DecisionSpec {
    /// Defaults for a checkpoint without `decision.json`.
    pub fn defaults(template: PromptTemplate) -> Self {
        Self {
            schema: SCHEMA.into(),
            template,
            labels: default_labels(),
            label_token_ids: Vec::new(),
            max_options: 26,
            max_tokens: 1024,
            temperature: 1.0,
            temperatures: BTreeMap::new(),
            temperature_clamped: None,
            temperatures_clamped: BTreeMap::new(),
            points: Vec::new(),
            point_rules: Vec::new(),
        }
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_slice(&bytes, path)
    }

    /// Parse and check the bytes of a `decision.json`; `path` names it in errors.
    pub fn from_slice(bytes: &[u8], path: &Path) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
        match value.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA) => {}
            Some(other) => bail!(
                "{}: schema {other:?} is not supported (this build reads {SCHEMA:?})",
                path.display()
            ),
            None => bail!(
                "{}: field `schema` is missing (expected {SCHEMA:?})",
                path.display()
            ),
        }
        let spec: DecisionSpec = serde_json::from_value(value)
            .with_context(|| format!("{}: not a valid decision config", path.display()))?;
        spec.validate()
            .with_context(|| format!("{}: invalid decision config", path.display()))?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<()> {
        if self.max_options < 2 {
            bail!(
                "max_options is {}; a decision needs at least 2 options",
                self.max_options
            );
        }
        if self.labels.len() < self.max_options {
            bail!(
                "{} labels cannot label max_options = {} options",
                self.labels.len(),
                self.max_options
            );
        }
        let mut seen = std::collections::HashSet::new();
        for l in &self.labels {
            if l.is_empty() || !seen.insert(l) {
                bail!("labels must be non-empty and distinct (label {l:?})");
            }
        }
        if self.max_tokens < 8 {
            bail!(
                "max_tokens is {}; too small for any prompt",
                self.max_tokens
            );
        }
        for (point, t) in std::iter::once(("<default>", &self.temperature))
            .chain(self.temperatures.iter().map(|(p, t)| (p.as_str(), t)))
        {
            if !(t.is_finite() && *t > 0.0) {
                bail!("temperature for {point} is {t}; it must be a positive number");
            }
        }
        if let Some(p) = self
            .temperatures_clamped
            .keys()
            .find(|p| !self.temperatures.contains_key(*p))
        {
            bail!("temperatures_clamped names point {p:?}, which has no entry in temperatures");
        }
        for (i, r) in self.point_rules.iter().enumerate() {
            if !valid_point(&r.point) {
                bail!(
                    "point_rules[{i}]: point {:?} does not match [a-z][a-z0-9_]*",
                    r.point
                );
            }
            let last = i + 1 == self.point_rules.len();
            match &r.candidates {
                None if !last => bail!(
                    "point_rules[{i}] ({}) has no `candidates`, so it matches everything; only the \
                     last rule may",
                    r.point
                ),
                Some(c) if c.is_empty() => {
                    bail!("point_rules[{i}] ({}): `candidates` is empty", r.point)
                }
                Some(_) if last => bail!(
                    "point_rules: the last rule ({}) must be a catch-all without `candidates`, so \
                     every request gets a point",
                    r.point
                ),
                _ => {}
            }
        }
        Template::parse(&self.template)?;
        Ok(())
    }

    /// The point rules in force: the file's, else keel's ([`keel_point_rules`]).
    pub fn effective_point_rules(&self) -> Vec<PointRule> {
        if self.point_rules.is_empty() {
            keel_point_rules()
        } else {
            self.point_rules.clone()
        }
    }

    /// The decision point of a request offering these candidate ids.
    pub fn point_for(&self, ids: &[&str]) -> String {
        self.effective_point_rules()
            .iter()
            .find(|r| r.matches(ids))
            .map(|r| r.point.clone())
            .unwrap_or_else(|| "intake".into())
    }

    /// The temperature of a decision point.
    pub fn temperature_for(&self, point: &str) -> f64 {
        self.temperatures
            .get(point)
            .copied()
            .unwrap_or(self.temperature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamped_temperatures_are_recorded_and_older_files_still_read() {
        let mut spec = DecisionSpec::defaults(PromptTemplate::plain());
        spec.temperatures.insert("stop".into(), 0.05);
        spec.temperatures.insert("tool".into(), 1.3);
        let plain = serde_json::to_value(&spec).unwrap();
        // nothing clamped: the file is as it was before the fields existed
        assert!(plain.get("temperature_clamped").is_none());
        assert!(plain.get("temperatures_clamped").is_none());
        let back =
            DecisionSpec::from_slice(plain.to_string().as_bytes(), Path::new("d.json")).unwrap();
        assert_eq!(back, spec);

        spec.temperatures_clamped
            .insert("stop".into(), TemperatureClamp::Floor);
        spec.temperature_clamped = Some(TemperatureClamp::Ceiling);
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            v["temperatures_clamped"],
            serde_json::json!({"stop": "floor"})
        );
        assert_eq!(v["temperature_clamped"], "ceiling");
        let back = DecisionSpec::from_slice(v.to_string().as_bytes(), Path::new("d.json")).unwrap();
        assert_eq!(back, spec);

        // a clamp on a point without its own temperature is an error in the file
        spec.temperatures_clamped
            .insert("route".into(), TemperatureClamp::Floor);
        let v = serde_json::to_value(&spec).unwrap();
        let e =
            DecisionSpec::from_slice(v.to_string().as_bytes(), Path::new("d.json")).unwrap_err();
        assert!(format!("{e:#}").contains("\"route\""), "{e:#}");
    }

    #[test]
    fn point_rules_name_keel_sites_and_are_checked() {
        let mut spec = DecisionSpec::defaults(PromptTemplate::plain());
        assert_eq!(
            spec.point_for(&["verify", "answer", "inspect", "implement"]),
            "pre_step"
        );
        assert_eq!(
            spec.point_for(&["inspect", "implement", "verify"]),
            "intake"
        );
        assert_eq!(spec.point_for(&["m1", "m2"]), "intake");
        // Absent from a training run's file, written by export, read back the same.
        let text = serde_json::to_string(&spec).unwrap();
        assert!(!text.contains("point_rules"), "{text}");
        spec.point_rules = keel_point_rules();
        let back: DecisionSpec =
            serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
        spec.validate().unwrap();
        spec.point_rules.reverse();
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("only the last rule"), "{e}");
        spec.point_rules = vec![keel_point_rules()[0].clone()];
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("catch-all"), "{e}");
        spec.point_rules = vec![PointRule {
            point: "Pre-Step".into(),
            candidates: None,
        }];
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("[a-z][a-z0-9_]*"), "{e}");
    }
}
