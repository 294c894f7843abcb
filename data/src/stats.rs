//! What a states dataset holds: counts by decision point, rules version, split and after-error;
//! how many options states offer and where the answer sits; how often the teacher is right.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::split::SplitRatios;
use crate::state::State;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Valid states counted below.
    pub states: u64,
    /// Rows left out because they are unreadable or break a rule.
    pub bad_rows: u64,
    /// States with an answer.
    pub labelled: u64,
    pub after_error: u64,
    pub by_point: BTreeMap<String, u64>,
    /// By `rules`; states without one are under `(none)`.
    pub by_rules: BTreeMap<String, u64>,
    /// By split, told apart by how the split was decided.
    pub by_split: BTreeMap<String, SplitCount>,
    /// Number of options -> states.
    pub options: BTreeMap<usize, u64>,
    /// 1-based position of the answer among the candidates -> labelled states.
    pub answer_position: BTreeMap<usize, u64>,
    pub teacher: TeacherStats,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SplitCount {
    /// States naming this split.
    pub explicit: u64,
    /// States placed here by the hash of their `task_id`.
    pub hashed: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TeacherStats {
    /// States with a teacher vector.
    pub with_teacher: u64,
    /// Labelled states with a teacher vector: the base of `accuracy`.
    pub judged: u64,
    /// Of those, states where the teacher's arg-max (the first, on ties) is the answer.
    pub correct: u64,
    /// Of those, states whose answer has the teacher's highest probability, ties included
    /// ([`teacher_agrees`]): the states whose target `teacher_blend` blends.
    pub agrees: u64,
    /// `correct / judged`; `None` when nothing could be judged.
    pub accuracy: Option<f64>,
}

pub const NO_RULES: &str = "(none)";

impl Stats {
    pub fn new() -> Self {
        Stats::default()
    }

    /// Counts one valid state.
    pub fn add(&mut self, s: &State, ratios: &SplitRatios) {
        self.states += 1;
        *self.by_point.entry(s.point.clone()).or_default() += 1;
        *self
            .by_rules
            .entry(s.rules.clone().unwrap_or_else(|| NO_RULES.into()))
            .or_default() += 1;
        let split = ratios.split_of(s);
        let entry = self.by_split.entry(split.as_str().to_string()).or_default();
        if s.split.is_some() {
            entry.explicit += 1;
        } else {
            entry.hashed += 1;
        }
        if s.after_error {
            self.after_error += 1;
        }
        *self.options.entry(s.candidates.len()).or_default() += 1;
        let answer = s.answer_index();
        if let Some(a) = answer {
            self.labelled += 1;
            *self.answer_position.entry(a + 1).or_default() += 1;
        }
        if let Some(t) = &s.teacher {
            self.teacher.with_teacher += 1;
            if let Some(a) = answer {
                self.teacher.judged += 1;
                if argmax(t) == Some(a) {
                    self.teacher.correct += 1;
                }
                if teacher_agrees(a, t) {
                    self.teacher.agrees += 1;
                }
                self.teacher.accuracy =
                    Some(self.teacher.correct as f64 / self.teacher.judged as f64);
            }
        }
    }

    /// Counts one row that was left out.
    pub fn add_bad(&mut self) {
        self.bad_rows += 1;
    }

    /// A plain-text report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let pct = |n: u64, of: u64| {
            if of == 0 {
                0.0
            } else {
                100.0 * n as f64 / of as f64
            }
        };
        let total = self.states;
        out += &format!("states       {total}\n");
        if self.bad_rows > 0 {
            out += &format!(
                "bad rows     {} (left out; `decision data validate` lists them)\n",
                self.bad_rows
            );
        }
        out += &format!(
            "labelled     {} ({:.1}%)\n",
            self.labelled,
            pct(self.labelled, total)
        );
        out += &format!(
            "after_error  {} ({:.1}%)\n",
            self.after_error,
            pct(self.after_error, total)
        );
        let table = |out: &mut String, title: &str, rows: Vec<(String, u64)>, of: u64| {
            *out += &format!("\n{title}\n");
            for (k, n) in rows {
                *out += &format!("  {k:<20} {n:>10} {:>6.1}%\n", pct(n, of));
            }
        };
        table(
            &mut out,
            "by point",
            self.by_point.iter().map(|(k, n)| (k.clone(), *n)).collect(),
            total,
        );
        table(
            &mut out,
            "by rules",
            self.by_rules.iter().map(|(k, n)| (k.clone(), *n)).collect(),
            total,
        );
        out += "\nby split (explicit + hashed from task_id)\n";
        for (k, c) in &self.by_split {
            let n = c.explicit + c.hashed;
            out += &format!(
                "  {k:<20} {n:>10} {:>6.1}%   ({} explicit, {} hashed)\n",
                pct(n, total),
                c.explicit,
                c.hashed
            );
        }
        table(
            &mut out,
            "options per state",
            self.options
                .iter()
                .map(|(k, n)| (k.to_string(), *n))
                .collect(),
            total,
        );
        table(
            &mut out,
            "answer position (1 = first option)",
            self.answer_position
                .iter()
                .map(|(k, n)| (k.to_string(), *n))
                .collect(),
            self.labelled,
        );
        out += "\nteacher\n";
        out += &format!("  with teacher         {:>10}\n", self.teacher.with_teacher);
        match self.teacher.accuracy {
            Some(acc) => {
                out += &format!(
                    "  accuracy             {:>10.4}   (arg-max = answer on {} of {} labelled states)\n",
                    acc, self.teacher.correct, self.teacher.judged
                );
                out += &format!(
                    "  blended              {:>10}   (answer ranked first, ties included: \
                     teacher_blend applies)\n",
                    self.teacher.agrees
                );
            }
            None => {
                out += "  accuracy                    n/a   (no labelled state has a teacher)\n"
            }
        }
        out
    }
}

/// Index of the largest value, the first on ties; `None` for an empty vector. The one rule for
/// a pick from scores (decision-train, the worker, the parity gate, the simulation).
pub fn argmax<T: PartialOrd + Copy>(v: &[T]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &x) in v.iter().enumerate() {
        if best.is_none_or(|b| x > v[b]) {
            best = Some(i);
        }
    }
    best
}

/// Whether the teacher ranks `answer` first, ties for first place included: the states whose
/// training target blends the teacher's distribution (contracts section 2, "its arg-max is the
/// answer"; with a tie, the answer is one of the arg-maxes). The one rule, for the loss and for
/// `data stats`.
pub fn teacher_agrees<T: PartialOrd + Copy>(answer: usize, teacher: &[T]) -> bool {
    let Some(&ta) = teacher.get(answer) else {
        return false;
    };
    teacher.iter().all(|&t| t <= ta)
}

/// [`argmax`] of scores that are never empty (index 0 for an empty slice).
pub fn first_max<T: PartialOrd + Copy>(v: &[T]) -> usize {
    argmax(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Candidate;

    fn state(n: usize, answer: Option<usize>, teacher: Option<Vec<f64>>) -> State {
        State {
            id: "x".into(),
            task_id: "task-0".into(),
            point: "tool".into(),
            context: String::new(),
            candidates: (0..n)
                .map(|i| Candidate {
                    id: format!("c{i}"),
                    label: format!("c{i}"),
                })
                .collect(),
            answer: answer.map(|a| format!("c{a}")),
            teacher,
            after_error: false,
            rules: None,
            split: None,
        }
    }

    #[test]
    fn the_teacher_agrees_when_the_answer_ties_for_first() {
        assert!(teacher_agrees(1, &[0.4, 0.4, 0.2]));
        assert!(teacher_agrees(0, &[0.4f32, 0.4, 0.2]));
        assert!(!teacher_agrees(2, &[0.4, 0.4, 0.2]));
        assert!(!teacher_agrees(3, &[0.4, 0.4, 0.2]));
    }

    #[test]
    fn argmax_takes_first_on_ties() {
        assert_eq!(argmax(&[0.2, 0.4, 0.4]), Some(1));
        assert_eq!(argmax(&[0.9, 0.1]), Some(0));
        assert_eq!(argmax::<f64>(&[]), None);
        assert_eq!(first_max(&[0.2f32, 0.4, 0.4]), 1);
        assert_eq!(first_max::<f64>(&[]), 0);
    }

    #[test]
    fn counts_histograms_and_teacher_accuracy() {
        let r = SplitRatios::default();
        let mut st = Stats::new();
        st.add(&state(2, Some(0), Some(vec![0.9, 0.1])), &r); // teacher right
        st.add(&state(3, Some(2), Some(vec![0.5, 0.3, 0.2])), &r); // teacher wrong
        st.add(&state(3, None, Some(vec![0.5, 0.3, 0.2])), &r); // unlabelled: not judged
        st.add(&state(2, Some(1), Some(vec![0.5, 0.5])), &r); // a tie: blended, not right
        let mut s = state(4, Some(1), None);
        s.after_error = true;
        s.rules = Some("v2".into());
        s.split = Some("test".into());
        s.point = "stop".into();
        st.add(&s, &r);
        st.add_bad();
        assert_eq!(st.states, 5);
        assert_eq!(st.bad_rows, 1);
        assert_eq!(st.labelled, 4);
        assert_eq!(st.after_error, 1);
        assert_eq!(st.by_point["tool"], 4);
        assert_eq!(st.by_point["stop"], 1);
        assert_eq!(st.by_rules[NO_RULES], 4);
        assert_eq!(st.by_rules["v2"], 1);
        assert_eq!(st.by_split["test"].explicit, 1);
        // task-0 hashes to train (pinned in split.rs).
        assert_eq!(st.by_split["train"].hashed, 4);
        assert_eq!(st.options, BTreeMap::from([(2, 2), (3, 2), (4, 1)]));
        assert_eq!(st.answer_position, BTreeMap::from([(1, 1), (2, 2), (3, 1)]));
        assert_eq!(
            (
                st.teacher.with_teacher,
                st.teacher.judged,
                st.teacher.correct,
                st.teacher.agrees
            ),
            (4, 3, 1, 2)
        );
        assert_eq!(st.teacher.accuracy, Some(1.0 / 3.0));
        let text = st.render();
        assert!(
            text.contains("accuracy") && text.contains("0.3333"),
            "{text}"
        );
        assert!(text.contains("blended                       2"), "{text}");
    }
}
