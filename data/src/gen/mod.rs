//! Synthetic decision states (`decision gen states`): a simulated customer-service shop in the
//! spirit of DecisionGym, where an agent resolves tickets with tools.
//!
//! Each task has hidden facts and a scripted plan derived from the rules ([`rules`]), so the
//! answer key is known at every state the agent reaches, including after the mistakes this
//! generator injects. States are recorded at three decision points: `tool` (which tool next),
//! `args` (which order id the pending call acts on) and `stop` (`finish` or `continue`).
//!
//! Two rules versions share everything but the shipped-order rule (see [`rules`]); for the
//! same seed they draw the same tasks, and their states differ only from the first decision
//! that rule touches. [`generate_annotated`] says, per state, what each version answers;
//! [`rule_change_group`] recovers that for a state read back from a file, and also tells the
//! states only one version reaches.
//!
//! ```
//! use decision_data::r#gen::{GenOptions, RulesVersion, generate};
//! let opts = GenOptions { rules: RulesVersion::V2, tasks: 10, ..GenOptions::default() };
//! let states = generate(&opts).unwrap();
//! assert!(states.iter().all(|s| s.rules.as_deref() == Some("v2")));
//! ```

mod candidates;
mod catalogue;
pub mod cli;
mod episode;
mod render;
mod rules;
mod teacher;

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

use crate::split::SplitRatios;
use crate::state::State;
use episode::walk;

pub use cli::GenStatesArgs;
pub use episode::env::{End, Episode, Failure, MAX_STEPS, irreversible};

/// Which rules the answer key follows. The versions differ only in the shipped-order rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RulesVersion {
    V1,
    V2,
}

impl RulesVersion {
    /// The tag written to each state's `rules` field.
    pub fn as_str(self) -> &'static str {
        match self {
            RulesVersion::V1 => "v1",
            RulesVersion::V2 => "v2",
        }
    }
}

impl fmt::Display for RulesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RulesVersion {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "v1" => Ok(RulesVersion::V1),
            "v2" => Ok(RulesVersion::V2),
            other => bail!("unknown rules version {other:?}: expected v1 or v2"),
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenOptions {
    pub rules: RulesVersion,
    /// Number of tasks (episodes); each yields several states.
    pub tasks: usize,
    /// Same seed, same tasks, byte for byte, for either rules version.
    pub seed: u64,
    /// Shares of tasks in train / valid / test. A task's split is the one
    /// [`SplitRatios::split_of_task`] gives its id, so a reader that ignores the `split` field
    /// and hashes `task_id` with the same ratios agrees; a task is never split.
    pub splits: SplitRatios,
}

impl Default for GenOptions {
    fn default() -> Self {
        Self {
            rules: RulesVersion::V1,
            tasks: 2000,
            seed: 7,
            splits: SplitRatios::default(),
        }
    }
}

impl GenOptions {
    /// Refuse split ratios outside [0, 1] or not summing to 1 (the fields are public).
    pub fn check(&self) -> Result<()> {
        let SplitRatios { train, valid, test } = self.splits;
        SplitRatios::new(train, valid, test).map(|_| ())
    }
}

/// A generated state with what the generator knows about it beyond the contract's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub state: State,
    /// The customer's intent, e.g. `cancel_order`, `where_is_order`.
    pub intent: &'static str,
    /// The answer the `v1` and the `v2` rules give in this very situation.
    pub answer_v1: String,
    pub answer_v2: String,
}

impl Generated {
    /// Whether the changed rule touches this state: the two versions answer it differently, so
    /// a model that learnt the other version is wrong here.
    pub fn touched(&self) -> bool {
        self.answer_v1 != self.answer_v2
    }
}

/// The task id of task `index` for `seed`: `s{seed}-t{index:05}`; the same in `v1` and `v2`.
pub fn task_id(seed: u64, index: u64) -> String {
    format!("s{seed}-t{index:05}")
}

fn parse_task_id(task_id: &str) -> Option<(u64, u64)> {
    let (seed, index) = task_id.strip_prefix('s')?.split_once("-t")?;
    Some((seed.parse().ok()?, index.parse().ok()?))
}

/// Every state of one task, in the order the agent meets them. State ids are
/// `{task_id}-{rules}-{n:02}`, unique even when both versions share a file.
pub fn task_states(rules: RulesVersion, seed: u64, index: u64, split: &str) -> Vec<Generated> {
    let (intent, drafts) = walk(rules, seed, index);
    drafts
        .iter()
        .enumerate()
        .map(|(n, d)| generated(rules, seed, index, split, n, intent, d))
        .collect()
}

/// State `n` of a task, with its ids and annotations.
fn generated(
    rules: RulesVersion,
    seed: u64,
    index: u64,
    split: &str,
    n: usize,
    intent: catalogue::Intent,
    d: &episode::Draft,
) -> Generated {
    let task_id = task_id(seed, index);
    Generated {
        state: State {
            id: format!("{task_id}-{rules}-{n:02}"),
            task_id,
            point: d.point.as_str().to_string(),
            context: d.context.clone(),
            candidates: d.candidates.clone(),
            answer: Some(d.answer.clone()),
            teacher: Some(d.teacher.clone()),
            after_error: d.after_error,
            rules: Some(rules.to_string()),
            split: Some(split.to_string()),
        },
        intent: intent.name(),
        answer_v1: d.answer_v1.clone(),
        answer_v2: d.answer_v2.clone(),
    }
}

/// All states of `opts.tasks` tasks, lazily, task by task.
pub fn generate_iter(opts: &GenOptions) -> Result<impl Iterator<Item = Generated> + use<>> {
    opts.check()?;
    let GenOptions {
        rules,
        tasks,
        seed,
        splits,
    } = opts.clone();
    Ok((0..tasks as u64).flat_map(move |index| {
        let split = splits.split_of_task(&task_id(seed, index));
        task_states(rules, seed, index, split.as_str())
    }))
}

/// All states with their annotations.
pub fn generate_annotated(opts: &GenOptions) -> Result<Vec<Generated>> {
    Ok(generate_iter(opts)?.collect())
}

/// All states of `opts.tasks` tasks, in task order.
pub fn generate(opts: &GenOptions) -> Result<Vec<State>> {
    Ok(generate_iter(opts)?.map(|g| g.state).collect())
}

/// For a state this generator made (read back from a file), the same state with its
/// annotations (the answer under each rules version), found by replaying its task. `None` when
/// the state is not one of ours: an unknown task id or rules tag, or a context that does not
/// match the replay.
pub fn replay(state: &State) -> Option<Generated> {
    let (seed, index) = parse_task_id(&state.task_id)?;
    let rules: RulesVersion = state.rules.as_deref()?.parse().ok()?;
    let split = state.split.as_deref().unwrap_or("train");
    let found = task_states(rules, seed, index, split)
        .into_iter()
        .find(|g| g.state.id == state.id)?;
    (found.state.context == state.context).then_some(found)
}

/// Where a state this generator made stands with the rule change:
///
/// * `"touched"`: the two rules versions answer it differently;
/// * `"diverged"`: both answer it alike, but it is reached only under its own version (an
///   earlier decision of its task was touched, so the other version's agent never sees this
///   context);
/// * `"untouched"`: both versions reach it, with the same context, and answer it alike.
///
/// `None` when the state is not one of ours (see [`replay`]).
pub fn rule_change_group(state: &State) -> Option<&'static str> {
    let g = replay(state)?;
    if g.touched() {
        return Some("touched");
    }
    let (seed, index) = parse_task_id(&state.task_id)?;
    let other = match state.rules.as_deref()?.parse().ok()? {
        RulesVersion::V1 => RulesVersion::V2,
        RulesVersion::V2 => RulesVersion::V1,
    };
    let split = state.split.as_deref().unwrap_or("train");
    let shared = task_states(other, seed, index, split)
        .iter()
        .any(|o| o.state.point == state.point && o.state.context == state.context);
    Some(if shared { "untouched" } else { "diverged" })
}

/// The changed rule in one line per version, for reports.
pub fn changed_rule() -> [(&'static str, String); 2] {
    [
        (
            "v1",
            format!(
                "an order shipped at most {} h ago is cancelled / re-addressed like an unshipped one \
                 (cancel_order, update_address); later, ask the customer",
                rules::V1_SHIPPED_WINDOW_HOURS
            ),
        ),
        (
            "v2",
            format!(
                "a shipped order goes through the carrier up to {} h after shipping \
                 (cancel_shipment then refund_order, or redirect_shipment) and the customer is \
                 told (send_message); later, ask the customer",
                rules::V2_CARRIER_WINDOW_HOURS
            ),
        ),
    ]
}

#[cfg(test)]
mod tests;
