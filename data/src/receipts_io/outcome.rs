//! Free-text outcomes (keel's `observedOutcome`) mapped to success / failure by configured
//! regular expressions (the `[outcome]` section of `configs/fit.toml`).

use anyhow::{Context, Result};
use regex::RegexSet;

use crate::OutcomeStatus;

/// Two lists of patterns. A text that matches a failure pattern is a failure, even when it also
/// matches a success pattern (an ambiguous text never counts in the selector's favour); a text
/// that matches only a success pattern is a success; a text that matches neither is unknown.
/// Patterns use the `regex` crate's syntax and are case-sensitive unless they say `(?i)`.
#[derive(Debug, Clone)]
pub struct OutcomePatterns {
    success: RegexSet,
    failure: RegexSet,
}

impl Default for OutcomePatterns {
    fn default() -> Self {
        Self::none()
    }
}

impl OutcomePatterns {
    /// No patterns: every free-text outcome stays unknown.
    pub fn none() -> Self {
        Self {
            success: RegexSet::empty(),
            failure: RegexSet::empty(),
        }
    }

    pub fn new<S: AsRef<str>>(success: &[S], failure: &[S]) -> Result<Self> {
        let compile = |kind: &str, list: &[S]| -> Result<RegexSet> {
            for p in list {
                regex::Regex::new(p.as_ref())
                    .with_context(|| format!("outcome.{kind}: bad pattern {:?}", p.as_ref()))?;
            }
            RegexSet::new(list.iter().map(|p| p.as_ref()))
                .with_context(|| format!("outcome.{kind}: bad pattern list"))
        };
        Ok(Self {
            success: compile("success", success)?,
            failure: compile("failure", failure)?,
        })
    }

    /// `Some(Success | Failure)` when a pattern recognises the text, `None` when none does.
    pub fn classify(&self, text: &str) -> Option<OutcomeStatus> {
        if self.failure.is_match(text) {
            Some(OutcomeStatus::Failure)
        } else if self.success.is_match(text) {
            Some(OutcomeStatus::Success)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_wins_and_unmatched_is_unknown() {
        let p = OutcomePatterns::new(
            &["^task completed", "^tests passed"],
            &["^task failed", "error"],
        )
        .unwrap();
        assert_eq!(
            p.classify("task completed in 3 steps"),
            Some(OutcomeStatus::Success)
        );
        assert_eq!(p.classify("tests passed"), Some(OutcomeStatus::Success));
        assert_eq!(
            p.classify("task failed: timeout"),
            Some(OutcomeStatus::Failure)
        );
        assert_eq!(
            p.classify("task completed with error"),
            Some(OutcomeStatus::Failure)
        );
        assert_eq!(p.classify("user closed the window"), None);
        assert_eq!(
            p.classify("Task completed"),
            None,
            "case-sensitive unless (?i)"
        );
        assert_eq!(OutcomePatterns::none().classify("task completed"), None);
    }

    #[test]
    fn bad_pattern_is_named() {
        let err = OutcomePatterns::new(&["("], &[] as &[&str]).unwrap_err();
        assert!(format!("{err:#}").contains("outcome.success"), "{err:#}");
    }
}
