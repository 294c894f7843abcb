//! A state from one JSON Lines line. The line is read as a `serde_json::Value` first and each
//! field taken out by hand, so that a missing or mistyped field is reported by name (and every
//! such field of the row at once), not as a generic deserialisation message.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BadRow, FieldError, Row};
use crate::state::{Candidate, State};

pub(super) fn parse_line(
    file: &Arc<PathBuf>,
    row: u64,
    line: Vec<u8>,
) -> Result<Row<State>, BadRow> {
    // Fast path: straight into a State (same field rules as `state_from_json`); anything it
    // refuses goes the slow way, which names every problem.
    let parsed = match serde_json::from_slice::<State>(&line) {
        Ok(state) => Ok(state),
        Err(_) => match serde_json::from_slice::<Value>(&line) {
            Ok(v) => state_from_json(&v),
            Err(e) => Err(vec![syntax_error(&line, &e)]),
        },
    };
    match parsed {
        Ok(state) => Ok(Row::from_line(file.clone(), row, line, state)),
        Err(errors) => Err(BadRow::from_line(file.clone(), row, line, errors)),
    }
}

/// A state from a JSON object with the contract's field names. Unknown fields are ignored (the
/// contract lets fields be added); `null` counts as absent for optional fields.
pub fn state_from_json(v: &Value) -> Result<State, Vec<FieldError>> {
    let Some(obj) = v.as_object() else {
        return Err(vec![FieldError::new(
            "(row)",
            format!("expected a JSON object, found {}", kind(v)),
        )]);
    };
    let mut errors = Vec::new();
    let id = required_str(obj, "id", &mut errors);
    let task_id = required_str(obj, "task_id", &mut errors);
    let point = required_str(obj, "point", &mut errors);
    let context = required_str(obj, "context", &mut errors);
    let candidates = candidates(obj, &mut errors);
    let answer = optional_str(obj, "answer", &mut errors);
    let teacher = teacher(obj, &mut errors);
    let after_error = match obj.get("after_error") {
        None | Some(Value::Null) => Some(false),
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            errors.push(FieldError::new(
                "after_error",
                format!("expected true or false, found {}", kind(other)),
            ));
            None
        }
    };
    let rules = optional_str(obj, "rules", &mut errors);
    let split = optional_str(obj, "split", &mut errors);
    match (
        id,
        task_id,
        point,
        context,
        candidates,
        answer,
        teacher,
        after_error,
        rules,
        split,
    ) {
        (
            Some(id),
            Some(task_id),
            Some(point),
            Some(context),
            Some(candidates),
            Some(answer),
            Some(teacher),
            Some(after_error),
            Some(rules),
            Some(split),
        ) if errors.is_empty() => Ok(State {
            id,
            task_id,
            point,
            context,
            candidates,
            answer,
            teacher,
            after_error,
            rules,
            split,
        }),
        _ => Err(errors),
    }
}

fn required_str(
    obj: &Map<String, Value>,
    field: &str,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    match obj.get(field) {
        Some(Value::String(s)) => Some(s.clone()),
        None => {
            errors.push(FieldError::new(field, "required field is missing"));
            None
        }
        Some(Value::Null) => {
            errors.push(FieldError::new(field, "required field is null"));
            None
        }
        Some(other) => {
            errors.push(FieldError::new(
                field,
                format!("expected a string, found {}", kind(other)),
            ));
            None
        }
    }
}

/// `Some(None)` when absent or null, `None` when mistyped (error recorded).
fn optional_str(
    obj: &Map<String, Value>,
    field: &str,
    errors: &mut Vec<FieldError>,
) -> Option<Option<String>> {
    match obj.get(field) {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) => Some(Some(s.clone())),
        Some(other) => {
            errors.push(FieldError::new(
                field,
                format!("expected a string or null, found {}", kind(other)),
            ));
            None
        }
    }
}

fn candidates(obj: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<Vec<Candidate>> {
    let items = match obj.get("candidates") {
        Some(Value::Array(items)) => items,
        None => {
            errors.push(FieldError::new("candidates", "required field is missing"));
            return None;
        }
        Some(Value::Null) => {
            errors.push(FieldError::new("candidates", "required field is null"));
            return None;
        }
        Some(other) => {
            errors.push(FieldError::new(
                "candidates",
                format!(
                    "expected a list of {{id, label}} objects, found {}",
                    kind(other)
                ),
            ));
            return None;
        }
    };
    let before = errors.len();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(c) = item.as_object() else {
            errors.push(FieldError::new(
                format!("candidates[{i}]"),
                format!("expected an {{id, label}} object, found {}", kind(item)),
            ));
            continue;
        };
        let mut field = |name: &str| match c.get(name) {
            Some(Value::String(s)) => Some(s.clone()),
            None | Some(Value::Null) => {
                errors.push(FieldError::new(
                    format!("candidates[{i}].{name}"),
                    "required field is missing",
                ));
                None
            }
            Some(other) => {
                errors.push(FieldError::new(
                    format!("candidates[{i}].{name}"),
                    format!("expected a string, found {}", kind(other)),
                ));
                None
            }
        };
        let id = field("id");
        let label = field("label");
        if let (Some(id), Some(label)) = (id, label) {
            out.push(Candidate { id, label });
        }
    }
    (errors.len() == before).then_some(out)
}

fn teacher(obj: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<Option<Vec<f64>>> {
    let items = match obj.get("teacher") {
        None | Some(Value::Null) => return Some(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            errors.push(FieldError::new(
                "teacher",
                format!("expected a list of numbers or null, found {}", kind(other)),
            ));
            return None;
        }
    };
    let before = errors.len();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item.as_f64() {
            Some(x) => out.push(x),
            None => errors.push(FieldError::new(
                format!("teacher[{i}]"),
                format!("expected a number, found {}", kind(item)),
            )),
        }
    }
    (errors.len() == before).then_some(Some(out))
}

/// What a JSON value is, for messages: `a string "abc"`, `a number 5`, `a list`, ...
fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => {
            let shown: String = s.chars().take(40).collect();
            let more = if shown.len() < s.len() { "…" } else { "" };
            format!("the string {shown:?}{more}")
        }
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// A line that is not JSON: name the top-level field the parser stopped in, and say so plainly
/// when the cause is a NaN / Infinity (Python's `json` writes them; JSON has no such values).
fn syntax_error(line: &[u8], e: &serde_json::Error) -> FieldError {
    // serde_json counts columns in bytes from 1 within the line.
    let offset = e.column().saturating_sub(1).min(line.len());
    let field = top_level_key_at(line, offset).unwrap_or_else(|| "(row)".into());
    let rest = &line[offset..];
    let tokens: [&[u8]; 3] = [b"NaN", b"Infinity", b"-Infinity"];
    let non_finite = tokens.into_iter().find(|t| rest.starts_with(t));
    let reason = match non_finite {
        Some(t) => format!(
            "{} is not a number JSON allows (a NaN or infinite value)",
            String::from_utf8_lossy(t)
        ),
        None => format!("not valid JSON: {e}"),
    };
    FieldError::new(field, reason)
}

/// The key of the top-level object member that contains byte `offset` of `line`, if any.
fn top_level_key_at(line: &[u8], offset: usize) -> Option<String> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut expecting_key = false;
    let mut key_start: Option<usize> = None;
    let mut current = None;
    for (i, &b) in line.iter().enumerate().take(offset) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if let Some(start) = key_start.take() {
                    current = Some(String::from_utf8_lossy(&line[start..i]).into_owned());
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                if depth == 1 && expecting_key {
                    key_start = Some(i + 1);
                    expecting_key = false;
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 && b == b'{' {
                    expecting_key = true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => expecting_key = true,
            _ => {}
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_at_offset_tracks_top_level_members_only() {
        let line = br#"{"id": "a", "candidates": [{"id": "x"}], "teacher": [0.5, NaN]}"#;
        let at = |needle: &str| {
            let pos = line
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap();
            top_level_key_at(line, pos)
        };
        assert_eq!(at("\"a\""), Some("id".into()));
        assert_eq!(at("\"x\""), Some("candidates".into()));
        assert_eq!(at("NaN"), Some("teacher".into()));
        assert_eq!(top_level_key_at(line, 0), None);
    }
}
