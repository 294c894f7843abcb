//! A decision state (contracts section 1): one moment in an agent run where the host offered a
//! bounded choice, with its answer key when it is known.

use serde::{Deserialize, Serialize};

/// One option the host offered. `id` names it; `label` is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub id: String,
    pub label: String,
}

/// A recorded decision state. Field names and meanings follow contracts section 1 exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub id: String,
    pub task_id: String,
    /// Decision point, `[a-z][a-z0-9_]*`: `tool`, `args`, `stop`, ...
    pub point: String,
    pub context: String,
    /// What the host offered, in order.
    pub candidates: Vec<Candidate>,
    /// Id of the correct candidate; `None` for unlabeled states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// A teacher's probabilities, aligned with `candidates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<Vec<f64>>,
    #[serde(default)]
    pub after_error: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<String>,
    /// `train` / `valid` / `test`; when absent the split comes from a hash of `task_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
}

impl State {
    /// An unlabelled state, as a host asks: `id`, the point, the context and `(id, label)`
    /// candidates in the host's order; `task_id` is `id`, and no answer, teacher, rules or split.
    pub fn unlabelled(
        id: &str,
        point: &str,
        context: &str,
        candidates: impl IntoIterator<Item = (String, String)>,
    ) -> State {
        State {
            id: id.into(),
            task_id: id.into(),
            point: point.into(),
            context: context.into(),
            candidates: candidates
                .into_iter()
                .map(|(id, label)| Candidate { id, label })
                .collect(),
            answer: None,
            teacher: None,
            after_error: false,
            rules: None,
            split: None,
        }
    }

    /// Index of the answer among the candidates, when the state is labelled.
    pub fn answer_index(&self) -> Option<usize> {
        let answer = self.answer.as_deref()?;
        self.candidates.iter().position(|c| c.id == answer)
    }
}
