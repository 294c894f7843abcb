//! Train / valid / test splits. A state's explicit `split` wins; otherwise the split comes from a
//! stable hash of its `task_id`, so every state of a task lands in the same split, on every
//! machine, in every run.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

use crate::stable_hash::unit_interval;
use crate::state::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    Train,
    Valid,
    Test,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Valid, Split::Test];

    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        }
    }

    /// The contract's spellings only: `train`, `valid`, `test`.
    pub fn parse(s: &str) -> Option<Split> {
        Split::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Shares of tasks that go to train, valid and test when a state names no split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitRatios {
    pub train: f64,
    pub valid: f64,
    pub test: f64,
}

impl Default for SplitRatios {
    fn default() -> Self {
        SplitRatios {
            train: 0.8,
            valid: 0.1,
            test: 0.1,
        }
    }
}

impl SplitRatios {
    /// Checked ratios: each in [0, 1], summing to 1 within 1e-6.
    pub fn new(train: f64, valid: f64, test: f64) -> Result<Self> {
        for (name, v) in [("train", train), ("valid", valid), ("test", test)] {
            if !(0.0..=1.0).contains(&v) {
                bail!("split ratio {name} = {v} is outside [0, 1]");
            }
        }
        let sum = train + valid + test;
        if (sum - 1.0).abs() > 1e-6 {
            bail!("split ratios {train}, {valid}, {test} sum to {sum}, not 1");
        }
        Ok(SplitRatios { train, valid, test })
    }

    /// The split a task goes to when none is given: a stable hash of `task_id` placed on [0, 1).
    pub fn split_of_task(&self, task_id: &str) -> Split {
        let u = unit_interval(task_id);
        if u < self.train {
            Split::Train
        } else if u < self.train + self.valid {
            Split::Valid
        } else {
            Split::Test
        }
    }

    /// The state's split: its explicit `split` when it has a valid one, else the task's hash.
    /// (Validation rejects unknown `split` values before this is asked.)
    pub fn split_of(&self, state: &State) -> Split {
        match state.split.as_deref().and_then(Split::parse) {
            Some(s) => s,
            None => self.split_of_task(&state.task_id),
        }
    }
}

/// `"0.8,0.1,0.1"` (the form the command line takes).
impl FromStr for SplitRatios {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.len() != 3 {
            bail!(
                "expected three comma-separated ratios train,valid,test (e.g. 0.8,0.1,0.1), got {s:?}"
            );
        }
        let mut v = [0.0; 3];
        for (slot, p) in v.iter_mut().zip(&parts) {
            *slot = p
                .parse()
                .map_err(|_| anyhow::anyhow!("{p:?} is not a number in {s:?}"))?;
        }
        SplitRatios::new(v[0], v[1], v[2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Candidate;
    use std::collections::HashMap;

    fn state(id: &str, task: &str, split: Option<&str>) -> State {
        State {
            id: id.into(),
            task_id: task.into(),
            point: "tool".into(),
            context: String::new(),
            candidates: vec![
                Candidate {
                    id: "a".into(),
                    label: "a".into(),
                },
                Candidate {
                    id: "b".into(),
                    label: "b".into(),
                },
            ],
            answer: None,
            teacher: None,
            after_error: false,
            rules: None,
            split: split.map(String::from),
        }
    }

    #[test]
    fn a_task_never_lands_in_two_splits() {
        let ratios = SplitRatios::default();
        let mut seen: HashMap<String, Split> = HashMap::new();
        // Many states per task, tasks interleaved, as a recorded dataset would have them.
        for step in 0..5 {
            for t in 0..2000 {
                let task = format!("task-{t}");
                let s = ratios.split_of(&state(&format!("{task}/{step}"), &task, None));
                let first = *seen.entry(task.clone()).or_insert(s);
                assert_eq!(first, s, "{task} in {first} and {s}");
            }
        }
    }

    #[test]
    fn hashed_shares_follow_the_ratios() {
        let ratios = SplitRatios::new(0.7, 0.2, 0.1).unwrap();
        let mut counts: HashMap<Split, usize> = HashMap::new();
        let n = 20_000;
        for t in 0..n {
            *counts
                .entry(ratios.split_of_task(&format!("t{t}")))
                .or_default() += 1;
        }
        let share = |s| counts.get(&s).copied().unwrap_or(0) as f64 / n as f64;
        // Binomial standard deviation at n = 20000 is at most 0.0035; 0.015 is > 4 sigma.
        assert!((share(Split::Train) - 0.7).abs() < 0.015, "{counts:?}");
        assert!((share(Split::Valid) - 0.2).abs() < 0.015, "{counts:?}");
        assert!((share(Split::Test) - 0.1).abs() < 0.015, "{counts:?}");
    }

    #[test]
    fn explicit_split_wins_and_hash_is_stable() {
        let ratios = SplitRatios::default();
        // Pinned (Python: see `stable_hash::unit_interval`): if these move, datasets reshuffle.
        for (task, split) in [
            ("task-0", Split::Train),
            ("task-3", Split::Train),
            ("task-5", Split::Test),
            ("task-8", Split::Test),
            ("task-9", Split::Valid),
            ("task-18", Split::Valid),
        ] {
            assert_eq!(ratios.split_of_task(task), split, "{task}");
            assert_eq!(ratios.split_of(&state("x", task, None)), split, "{task}");
        }
        assert_eq!(
            ratios.split_of(&state("x", "task-0", Some("test"))),
            Split::Test
        );
        assert_eq!(
            ratios.split_of(&state("x", "task-5", Some("valid"))),
            Split::Valid
        );
        let all_train = SplitRatios::new(1.0, 0.0, 0.0).unwrap();
        assert!((0..100).all(|t| all_train.split_of_task(&format!("{t}")) == Split::Train));
    }

    #[test]
    fn ratios_parse_and_refuse_bad_values() {
        assert_eq!(
            "0.8, 0.1, 0.1".parse::<SplitRatios>().unwrap(),
            SplitRatios::default()
        );
        assert!("0.8,0.1".parse::<SplitRatios>().is_err());
        assert!("0.8,0.1,0.2".parse::<SplitRatios>().is_err());
        assert!("1.2,-0.1,-0.1".parse::<SplitRatios>().is_err());
        assert!("a,b,c".parse::<SplitRatios>().is_err());
    }
}
