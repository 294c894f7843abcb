//! `configs/fit.toml`: the policy per decision point and how free-text outcomes are read.
//! Every problem (an unknown key, a target outside (0, 1], a policy missing its parameters) is
//! reported here, before any receipt is read.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use decision_data::receipts_io::OutcomePatterns;
use serde::{Deserialize, Serialize};

/// The file as written: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    defaults: RawPolicy,
    #[serde(default)]
    points: BTreeMap<String, RawPolicy>,
    #[serde(default)]
    outcome: RawOutcome,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    policy: Option<PolicyKind>,
    target: Option<f64>,
    bound: Option<Bound>,
    level: Option<f64>,
    min_count: Option<u64>,
    bucket_width: Option<f64>,
    llm_accuracy: Option<f64>,
    saved_price: Option<f64>,
    cost_wrong: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutcome {
    #[serde(default)]
    success: Vec<String>,
    #[serde(default)]
    failure: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Bucket rule: the lowest bucket reached from the top whose lower bound meets the target.
    Bucket,
    /// The JevAgentHarness delegation rule: target = llm_accuracy − saved_price / cost_wrong,
    /// then the bucket rule.
    Cost,
    /// Fixed-sequence test with one-sided Clopper–Pearson bounds on the error rate.
    Risk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    Wilson,
    None,
}

/// The cost rule's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostParams {
    pub llm_accuracy: f64,
    pub saved_price: f64,
    pub cost_wrong: f64,
}

/// The fully resolved policy of one point (defaults, then the point's own keys). Serialised
/// as the `policy` object of thresholds.json.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointPolicy {
    pub kind: PolicyKind,
    /// Success rate required above the threshold (for `cost`, the derived one).
    pub target: f64,
    pub bound: Bound,
    pub level: f64,
    pub min_count: u64,
    pub bucket_width: f64,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostParams>,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct FitConfig {
    pub defaults: PointPolicy,
    /// Points named in the file (they appear in the output even without receipts).
    pub points: BTreeMap<String, PointPolicy>,
    pub outcome: OutcomePatterns,
    /// The patterns as written (for the report).
    pub outcome_success: Vec<String>,
    pub outcome_failure: Vec<String>,
}

impl FitConfig {
    pub fn load(path: &Path) -> Result<FitConfig> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("{}: invalid fit config", path.display()))
    }

    pub fn parse(text: &str) -> Result<FitConfig> {
        let raw: RawConfig = toml::from_str(text)?;
        let builtin = RawPolicy {
            policy: Some(PolicyKind::Bucket),
            target: Some(0.95),
            bound: Some(Bound::Wilson),
            level: Some(0.95),
            min_count: Some(30),
            bucket_width: Some(0.1),
            llm_accuracy: None,
            saved_price: None,
            cost_wrong: None,
        };
        let defaults_raw = overlay(&builtin, &raw.defaults);
        let defaults = resolve(&defaults_raw, &raw.defaults, "defaults")?;
        let mut points = BTreeMap::new();
        for (name, p) in &raw.points {
            if !valid_point_name(name) {
                bail!("points.{name}: a decision point is named [a-z][a-z0-9_]*");
            }
            let merged = overlay(&defaults_raw, p);
            points.insert(
                name.clone(),
                resolve(&merged, p, &format!("points.{name}"))?,
            );
        }
        let outcome = OutcomePatterns::new(&raw.outcome.success, &raw.outcome.failure)?;
        Ok(FitConfig {
            defaults,
            points,
            outcome,
            outcome_success: raw.outcome.success,
            outcome_failure: raw.outcome.failure,
        })
    }

    /// The policy of a point: its own section, else the defaults.
    pub fn policy(&self, point: &str) -> &PointPolicy {
        self.points.get(point).unwrap_or(&self.defaults)
    }
}

fn valid_point_name(p: &str) -> bool {
    let mut b = p.bytes();
    matches!(b.next(), Some(b'a'..=b'z'))
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

fn overlay(base: &RawPolicy, top: &RawPolicy) -> RawPolicy {
    RawPolicy {
        policy: top.policy.or(base.policy),
        target: top.target.or(base.target),
        bound: top.bound.or(base.bound),
        level: top.level.or(base.level),
        min_count: top.min_count.or(base.min_count),
        bucket_width: top.bucket_width.or(base.bucket_width),
        llm_accuracy: top.llm_accuracy.or(base.llm_accuracy),
        saved_price: top.saved_price.or(base.saved_price),
        cost_wrong: top.cost_wrong.or(base.cost_wrong),
    }
}

/// `own` is the section as written (to tell an explicit key from an inherited one).
fn resolve(p: &RawPolicy, own: &RawPolicy, at: &str) -> Result<PointPolicy> {
    let kind = p.policy.expect("built-in default");
    let level = p.level.expect("built-in default");
    if !(level > 0.0 && level < 1.0) {
        bail!("{at}.level = {level}: must lie in (0, 1)");
    }
    let min_count = p.min_count.expect("built-in default");
    if min_count == 0 {
        bail!("{at}.min_count must be at least 1");
    }
    let bucket_width = p.bucket_width.expect("built-in default");
    if !(bucket_width > 0.0 && bucket_width <= 1.0) || bucket_width < 1e-3 {
        bail!("{at}.bucket_width = {bucket_width}: must lie in [0.001, 1]");
    }
    let check_target = |t: f64, what: &str| -> Result<()> {
        if !(t > 0.0 && t <= 1.0) {
            bail!("{at}: {what} = {t} lies outside (0, 1]");
        }
        Ok(())
    };
    let (target, cost) = match kind {
        PolicyKind::Bucket | PolicyKind::Risk => {
            let t = p.target.expect("built-in default");
            check_target(t, "target")?;
            if own.llm_accuracy.is_some() || own.saved_price.is_some() || own.cost_wrong.is_some() {
                bail!(
                    "{at}: llm_accuracy / saved_price / cost_wrong only apply to policy = \"cost\""
                );
            }
            (t, None)
        }
        PolicyKind::Cost => {
            if own.target.is_some() && at != "defaults" {
                bail!(
                    "{at}: policy \"cost\" derives its target (llm_accuracy − saved_price / cost_wrong); remove `target`"
                );
            }
            let missing: Vec<&str> = [
                ("llm_accuracy", p.llm_accuracy.is_none()),
                ("saved_price", p.saved_price.is_none()),
                ("cost_wrong", p.cost_wrong.is_none()),
            ]
            .into_iter()
            .filter(|(_, m)| *m)
            .map(|(k, _)| k)
            .collect();
            if !missing.is_empty() {
                bail!("{at}: policy \"cost\" needs {}", missing.join(", "));
            }
            let c = CostParams {
                llm_accuracy: p.llm_accuracy.expect("checked"),
                saved_price: p.saved_price.expect("checked"),
                cost_wrong: p.cost_wrong.expect("checked"),
            };
            check_target(c.llm_accuracy, "llm_accuracy")?;
            if !(c.saved_price >= 0.0 && c.saved_price.is_finite()) {
                bail!("{at}: saved_price = {} must be ≥ 0", c.saved_price);
            }
            if !(c.cost_wrong > 0.0 && c.cost_wrong.is_finite()) {
                bail!("{at}: cost_wrong = {} must be > 0", c.cost_wrong);
            }
            let t = c.llm_accuracy - c.saved_price / c.cost_wrong;
            check_target(
                t,
                "the derived target llm_accuracy − saved_price / cost_wrong",
            )?;
            (t, Some(c))
        }
    };
    Ok(PointPolicy {
        kind,
        target,
        bound: p.bound.expect("built-in default"),
        level,
        min_count,
        bucket_width,
        cost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_EXAMPLE: &str = r#"
[defaults]
policy = "bucket"
target = 0.95
bound = "wilson"
level = 0.95
min_count = 30
bucket_width = 0.1

[points.tool]
target = 0.97

[points.route]
policy = "cost"
llm_accuracy = 0.92
saved_price = 0.002
cost_wrong = 1.0

[outcome]
success = ["^task completed", "^tests passed"]
failure = ["^task failed", "error"]
"#;

    #[test]
    fn the_issue_example_resolves() {
        let c = FitConfig::parse(ISSUE_EXAMPLE).unwrap();
        assert_eq!(c.policy("tool").target, 0.97);
        assert_eq!(c.policy("tool").kind, PolicyKind::Bucket);
        let route = c.policy("route");
        assert_eq!(route.kind, PolicyKind::Cost);
        assert!((route.target - 0.918).abs() < 1e-15);
        assert_eq!(c.policy("stop"), &c.defaults);
        assert_eq!(c.defaults.min_count, 30);
        assert_eq!(
            c.outcome.classify("task completed"),
            Some(decision_data::OutcomeStatus::Success)
        );
    }

    fn err(text: &str) -> String {
        format!("{:#}", FitConfig::parse(text).unwrap_err())
    }

    #[test]
    fn mistakes_are_refused_with_their_place() {
        assert!(err("[defaults]\ntarget = 0.9\ntagret = 0.9\n").contains("tagret"));
        assert!(err("[points.tool]\nmin_cont = 3\n").contains("min_cont"));
        assert!(err("[surprise]\n").contains("surprise"));
        assert!(
            err("[points.tool]\ntarget = 1.2\n")
                .contains("points.tool: target = 1.2 lies outside (0, 1]")
        );
        assert!(err("[defaults]\ntarget = 0.0\n").contains("outside (0, 1]"));
        assert!(
            err("[points.route]\npolicy = \"cost\"\nllm_accuracy = 0.9\n")
                .contains("needs saved_price, cost_wrong")
        );
        assert!(
            err("[points.route]\npolicy = \"cost\"\nllm_accuracy = 0.5\nsaved_price = 1\ncost_wrong = 1\n")
                .contains("derived target")
        );
        assert!(err("[points.tool]\npolicy = \"magic\"\n").contains("magic"));
        assert!(err("[points.tool]\nllm_accuracy = 0.9\n").contains("only apply"));
        assert!(err("[outcome]\nsuccess = [\"(\"]\n").contains("outcome.success"));
        assert!(err("[points.Tool]\n").contains("[a-z]"));
        assert!(err("[defaults]\nbucket_width = 0\n").contains("bucket_width"));
    }

    #[test]
    fn cost_params_inherit_from_defaults() {
        let c = FitConfig::parse(
            "[defaults]\nllm_accuracy = 0.9\nsaved_price = 0.1\ncost_wrong = 2\n[points.route]\npolicy = \"cost\"\n",
        );
        // defaults are a bucket policy, so cost keys there are refused
        assert!(c.is_err());
        let c = FitConfig::parse(
            "[defaults]\npolicy = \"cost\"\nllm_accuracy = 0.9\nsaved_price = 0.1\ncost_wrong = 2\n[points.route]\ncost_wrong = 1\n",
        )
        .unwrap();
        assert!((c.policy("route").target - 0.8).abs() < 1e-15);
        assert!((c.defaults.target - 0.85).abs() < 1e-15);
    }
}
