//! A receipt (contracts section 3): one decision the harness made or watched, normalised from
//! either the contract's record shape or keel's `DecisionEvent`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: String,
    /// RFC 3339 time of the decision.
    pub at: String,
    pub point: String,
    /// Which selector made the pick, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Exactly what was offered (candidate ids).
    pub candidates: Vec<String>,
    pub result: ReceiptResult,
    pub validation: Validation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// Absent while the outcome is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Shadow>,
    /// The free-text outcome the harness wrote (keel's `observedOutcome`), kept as written.
    /// When the configured patterns recognise it, `outcome` holds the mapped status; when they
    /// do not, `outcome` stays `None` and the record counts as observed but unjudged
    /// (`unknown`), not as pending.
    #[serde(
        rename = "observedOutcome",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_outcome: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ReceiptResult {
    Pick { id: String, confidence: f64 },
    Abstain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Validation {
    #[serde(rename = "accepted")]
    Accepted,
    #[serde(rename = "rejected-out-of-set")]
    RejectedOutOfSet,
    #[serde(rename = "rejected-stale")]
    RejectedStale,
    /// keel's `expired`.
    #[serde(rename = "rejected-expired")]
    RejectedExpired,
    /// keel's `unauthorized`.
    #[serde(rename = "rejected-unauthorized")]
    RejectedUnauthorized,
    /// The host's own gates refused a pick it had offered: keel's `rejected` of an offered id
    /// (its low-probability, low-confidence and ambiguity checks), where a `rejected` id that was
    /// not offered is out of set.
    #[serde(rename = "rejected-gate")]
    RejectedGate,
}

impl Validation {
    pub const ALL: [Validation; 6] = [
        Validation::Accepted,
        Validation::RejectedOutOfSet,
        Validation::RejectedStale,
        Validation::RejectedExpired,
        Validation::RejectedUnauthorized,
        Validation::RejectedGate,
    ];

    /// The contract's spelling (`accepted`, `rejected-stale`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Validation::Accepted => "accepted",
            Validation::RejectedOutOfSet => "rejected-out-of-set",
            Validation::RejectedStale => "rejected-stale",
            Validation::RejectedExpired => "rejected-expired",
            Validation::RejectedUnauthorized => "rejected-unauthorized",
            Validation::RejectedGate => "rejected-gate",
        }
    }

    pub fn parse(s: &str) -> Option<Validation> {
        Validation::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    pub used: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: OutcomeStatus,
    #[serde(
        rename = "durationMs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeStatus {
    Success,
    Failure,
    Abandoned,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shadow {
    pub reference: String,
}

impl Receipt {
    /// True when a fallback ran for this decision.
    pub fn fallback_used(&self) -> bool {
        self.fallback.as_ref().is_some_and(|f| f.used)
    }

    /// The pick's candidate id and confidence, `None` for an abstention.
    pub fn pick(&self) -> Option<(&str, f64)> {
        match &self.result {
            ReceiptResult::Pick { id, confidence } => Some((id, *confidence)),
            ReceiptResult::Abstain => None,
        }
    }

    /// True when the recorded pick is the host's own route rather than a selector's
    /// (keel-integration.md, "Quirks"): keel's `backend: host` receipts carry a `confidence` of
    /// 0.75 that keel puts on every host-scored route, not a model's; and where the selector
    /// abstained at intake, keel records the host's first route as `selected` with the fallback
    /// `Selector abstained; host scored the 0G catalog` (`selector_abstained` alike). Such a pick
    /// counts as a fallback, never in a confidence bucket or in coverage.
    pub fn host_scored(&self) -> bool {
        matches!(self.result, ReceiptResult::Pick { .. })
            && (self.model.as_deref() == Some(HOST_BACKEND)
                || self
                    .fallback
                    .as_ref()
                    .and_then(|f| f.reason.as_deref())
                    .is_some_and(says_selector_abstained))
    }
}

/// keel's `backend` for a route the host scored itself, kept as the receipt's `model`.
pub(crate) const HOST_BACKEND: &str = "host";

/// A fallback reason saying the selector abstained, in keel's words or its enum's (`_` read as
/// a space, any ASCII case).
pub(crate) fn says_selector_abstained(reason: &str) -> bool {
    const WORDS: &[u8] = b"selector abstained";
    let head = reason.trim_start().as_bytes();
    head.len() >= WORDS.len()
        && head
            .iter()
            .zip(WORDS)
            .all(|(&a, &w)| a.to_ascii_lowercase() == w || (a == b'_' && w == b' '))
}

impl OutcomeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeStatus::Success => "success",
            OutcomeStatus::Failure => "failure",
            OutcomeStatus::Abandoned => "abandoned",
        }
    }

    pub fn parse(s: &str) -> Option<OutcomeStatus> {
        [
            OutcomeStatus::Success,
            OutcomeStatus::Failure,
            OutcomeStatus::Abandoned,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}
