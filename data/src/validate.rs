//! The rules of contracts section 1. Per row ([`check_state`]): candidates (2 ..= `max_options`,
//! unique non-empty ids, non-empty labels), `answer` among the candidate ids, the teacher vector
//! (aligned length, each value a number in [0, 1], summing to 1 within 1e-3), the `point` pattern
//! `[a-z][a-z0-9_]*`, `split` one of `train` / `valid` / `test`, non-empty `id` and `task_id`.
//! Across the dataset ([`Validator`]): `id` unique, and no task in two splits (explicit splits
//! that disagree, or an explicit split that disagrees with the hashed split of the task's other
//! rows). Missing and mistyped fields are caught by the readers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::split::{Split, SplitRatios};
use crate::stable_hash::fnv1a_128;
use crate::state::State;
use crate::states_io::{BadRow, FieldError, ReadItem, Row};

/// The harness's own cap on options per decision.
pub const DEFAULT_MAX_OPTIONS: usize = 16;
/// How far a teacher vector's sum may be from 1.
pub const TEACHER_SUM_TOLERANCE: f64 = 1e-3;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidateOptions {
    /// Most candidates a state may offer.
    pub max_options: usize,
    /// Ratios used to place states without an explicit split (to check that no task is cut).
    pub ratios: SplitRatios,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions {
            max_options: DEFAULT_MAX_OPTIONS,
            ratios: SplitRatios::default(),
        }
    }
}

/// Everything wrong with one state on its own (empty when it is fine).
pub fn check_state(s: &State, max_options: usize) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut err = |field: String, reason: String| errors.push(FieldError { field, reason });

    if s.id.is_empty() {
        err("id".into(), "is empty".into());
    }
    if s.task_id.is_empty() {
        err("task_id".into(), "is empty".into());
    }
    if !point_name_ok(&s.point) {
        err(
            "point".into(),
            format!("{:?} does not match [a-z][a-z0-9_]*", s.point),
        );
    }

    let n = s.candidates.len();
    if n < 2 {
        err(
            "candidates".into(),
            format!("{n} option(s); a decision needs at least 2"),
        );
    } else if n > max_options {
        err(
            "candidates".into(),
            format!("{n} options; at most {max_options} allowed (max_options)"),
        );
    }
    let mut first_at: HashMap<&str, usize> = HashMap::with_capacity(n);
    for (i, c) in s.candidates.iter().enumerate() {
        if c.id.is_empty() {
            err(format!("candidates[{i}].id"), "is empty".into());
        } else if let Some(j) = first_at.insert(c.id.as_str(), i) {
            first_at.insert(c.id.as_str(), j);
            err(
                format!("candidates[{i}].id"),
                format!("duplicate id {:?} (also candidates[{j}])", c.id),
            );
        }
        if c.label.is_empty() {
            err(format!("candidates[{i}].label"), "is empty".into());
        }
    }

    if let Some(answer) = &s.answer
        && !s.candidates.iter().any(|c| &c.id == answer)
    {
        err(
            "answer".into(),
            format!("{answer:?} is not among the candidate ids"),
        );
    }

    if let Some(teacher) = &s.teacher {
        if teacher.len() != n {
            err(
                "teacher".into(),
                format!("has {} values for {n} candidates", teacher.len()),
            );
        }
        let mut all_finite = true;
        for (i, &p) in teacher.iter().enumerate() {
            if p.is_nan() {
                all_finite = false;
                err(format!("teacher[{i}]"), "is NaN".into());
            } else if !(0.0..=1.0).contains(&p) {
                all_finite &= p.is_finite();
                err(format!("teacher[{i}]"), format!("{p} is outside [0, 1]"));
            }
        }
        let sum: f64 = teacher.iter().sum();
        if all_finite && !teacher.is_empty() && (sum - 1.0).abs() > TEACHER_SUM_TOLERANCE {
            err(
                "teacher".into(),
                format!("sums to {sum}, not 1 (within {TEACHER_SUM_TOLERANCE})"),
            );
        }
    }

    if let Some(split) = &s.split
        && Split::parse(split).is_none()
    {
        err(
            "split".into(),
            format!("{split:?} is not one of train, valid, test"),
        );
    }
    errors
}

/// `[a-z][a-z0-9_]*`
pub fn point_name_ok(p: &str) -> bool {
    let mut bytes = p.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Checks rows one after another, remembering what the dataset-wide rules need: a 128-bit hash
/// of every id seen (with where it was first seen) and the split of every task. Memory grows with
/// the number of distinct ids (about 40 bytes each), not with the size of the rows.
pub struct Validator {
    opts: ValidateOptions,
    files: Vec<Arc<PathBuf>>,
    ids: HashMap<u128, Place>,
    tasks: HashMap<u128, (Split, Place)>,
}

/// Where a row is: index into `files`, and 1-based row.
#[derive(Clone, Copy)]
struct Place {
    file: u32,
    row: u64,
}

impl Validator {
    pub fn new(opts: ValidateOptions) -> Self {
        Validator {
            opts,
            files: Vec::new(),
            ids: HashMap::new(),
            tasks: HashMap::new(),
        }
    }

    /// The row back when it passes every rule, or as a [`BadRow`] listing every rule it breaks.
    pub fn check(&mut self, row: Row<State>) -> Result<Row<State>, BadRow> {
        let mut errors = check_state(&row.value, self.opts.max_options);
        let here = Place {
            file: self.file_index(&row.file),
            row: row.row,
        };
        let s = &row.value;

        if !s.id.is_empty() {
            let key = fnv1a_128(s.id.as_bytes());
            match self.ids.get(&key).copied() {
                Some(first) => errors.push(FieldError::new(
                    "id",
                    format!(
                        "duplicate id {:?} (first at {})",
                        s.id,
                        self.describe(first)
                    ),
                )),
                None => {
                    self.ids.insert(key, here);
                }
            }
        }

        // A row with an unknown split value is already reported above and places nothing.
        let explicit = s.split.as_deref().map(Split::parse);
        if !s.task_id.is_empty() && explicit != Some(None) {
            let split = explicit
                .flatten()
                .unwrap_or_else(|| self.opts.ratios.split_of_task(&s.task_id));
            let key = fnv1a_128(s.task_id.as_bytes());
            match self.tasks.get(&key).copied() {
                Some((first_split, first_place)) if first_split != split => {
                    let how = if explicit.is_some() {
                        "split is"
                    } else {
                        "no split given, so the task's hash puts it in"
                    };
                    errors.push(FieldError::new(
                        "split",
                        format!(
                            "{how} \"{split}\" but task {:?} is already in \"{first_split}\" (at {}); a split never cuts a task in two",
                            s.task_id,
                            self.describe(first_place)
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    self.tasks.insert(key, (split, here));
                }
            }
        }

        if errors.is_empty() {
            Ok(row)
        } else {
            Err(row.into_bad(errors))
        }
    }

    fn file_index(&mut self, file: &Arc<PathBuf>) -> u32 {
        if let Some(last) = self.files.last()
            && Arc::ptr_eq(last, file)
        {
            return (self.files.len() - 1) as u32;
        }
        if let Some(i) = self.files.iter().position(|f| f == file) {
            return i as u32;
        }
        self.files.push(file.clone());
        (self.files.len() - 1) as u32
    }

    fn describe(&self, p: Place) -> String {
        format!("{} row {}", self.files[p.file as usize].display(), p.row)
    }
}

/// A stream of rows with every rule applied (see [`crate::states_io::StateReader::validated`]).
pub struct Validated<I> {
    inner: I,
    validator: Validator,
}

impl<I> Validated<I> {
    pub fn new(inner: I, opts: ValidateOptions) -> Self {
        Validated {
            inner,
            validator: Validator::new(opts),
        }
    }
}

impl<I: Iterator<Item = ReadItem>> Iterator for Validated<I> {
    type Item = ReadItem;

    fn next(&mut self) -> Option<ReadItem> {
        Some(match self.inner.next()? {
            Ok(Ok(row)) => Ok(self.validator.check(row)),
            other => other,
        })
    }
}

#[cfg(test)]
mod tests;
