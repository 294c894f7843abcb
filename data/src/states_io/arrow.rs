//! The Arrow form of decision states: the schema we write, states to a record batch, a batch back
//! to states (accepting what other writers produce: large, view or dictionary strings, large
//! lists, float32 or integer teachers, extra columns, optional columns missing or null-typed), and
//! one row as JSON for quarantine.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type};
use arrow_array::types::{UInt8Type, UInt16Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, ListArray, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef};

use super::FieldError;
use crate::state::{Candidate, State};
use crate::string_column::StrCol;

/// The `schema` string a states file we write carries (Parquet key-value metadata).
pub const STATES_SCHEMA_ID: &str = "decision-states/1";

fn candidate_fields() -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("label", DataType::Utf8, false),
    ])
}

fn candidates_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(candidate_fields()),
        false,
    )))
}

fn teacher_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Float64, false)))
}

/// The Arrow schema of a states file, in the contract's field order:
/// `id`, `task_id`, `point`, `context`: utf8; `candidates`: list<struct<id: utf8, label: utf8>>;
/// `answer`: utf8, nullable; `teacher`: list<float64>, nullable; `after_error`: bool;
/// `rules`, `split`: utf8, nullable.
pub fn state_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("task_id", DataType::Utf8, false),
        Field::new("point", DataType::Utf8, false),
        Field::new("context", DataType::Utf8, false),
        Field::new("candidates", candidates_type(), false),
        Field::new("answer", DataType::Utf8, true),
        Field::new("teacher", teacher_type(), true),
        Field::new("after_error", DataType::Boolean, false),
        Field::new("rules", DataType::Utf8, true),
        Field::new("split", DataType::Utf8, true),
    ]))
}

/// States as one record batch of [`state_schema`].
pub fn states_to_batch(states: &[State]) -> Result<RecordBatch, ArrowError> {
    let strings = |f: fn(&State) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(states.iter().map(f)))
    };
    let optional = |f: fn(&State) -> Option<&str>| -> ArrayRef {
        Arc::new(states.iter().map(f).collect::<StringArray>())
    };

    let all = || states.iter().flat_map(|s| s.candidates.iter());
    let ids = StringArray::from_iter_values(all().map(|c| c.id.as_str()));
    let labels = StringArray::from_iter_values(all().map(|c| c.label.as_str()));
    let candidate_struct = StructArray::try_new(
        candidate_fields(),
        vec![Arc::new(ids), Arc::new(labels)],
        None,
    )?;
    let DataType::List(candidate_item) = candidates_type() else {
        unreachable!()
    };
    let candidates = ListArray::try_new(
        candidate_item,
        OffsetBuffer::from_lengths(states.iter().map(|s| s.candidates.len())),
        Arc::new(candidate_struct),
        None,
    )?;

    let teacher_values = Float64Array::from_iter_values(
        states
            .iter()
            .flat_map(|s| s.teacher.iter().flatten().copied()),
    );
    let DataType::List(teacher_item) = teacher_type() else {
        unreachable!()
    };
    let teacher = ListArray::try_new(
        teacher_item,
        OffsetBuffer::from_lengths(
            states
                .iter()
                .map(|s| s.teacher.as_ref().map_or(0, Vec::len)),
        ),
        Arc::new(teacher_values),
        Some(NullBuffer::from(
            states
                .iter()
                .map(|s| s.teacher.is_some())
                .collect::<Vec<bool>>(),
        )),
    )?;
    let after_error = BooleanArray::from(states.iter().map(|s| s.after_error).collect::<Vec<_>>());

    RecordBatch::try_new(
        state_schema(),
        vec![
            strings(|s| s.id.as_str()),
            strings(|s| s.task_id.as_str()),
            strings(|s| s.point.as_str()),
            strings(|s| s.context.as_str()),
            Arc::new(candidates),
            optional(|s| s.answer.as_deref()),
            Arc::new(teacher),
            Arc::new(after_error),
            optional(|s| s.rules.as_deref()),
            optional(|s| s.split.as_deref()),
        ],
    )
}

/// A list column (32- or 64-bit offsets): the item range of each row and the child values.
struct List<'a> {
    offsets: Offsets<'a>,
    nulls: Option<&'a NullBuffer>,
    values: &'a ArrayRef,
}

enum Offsets<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl<'a> List<'a> {
    fn of(a: &'a dyn Array) -> Option<Self> {
        match a.data_type() {
            DataType::List(_) => {
                let l = a.as_list::<i32>();
                Some(List {
                    offsets: Offsets::I32(l.value_offsets()),
                    nulls: l.nulls(),
                    values: l.values(),
                })
            }
            DataType::LargeList(_) => {
                let l = a.as_list::<i64>();
                Some(List {
                    offsets: Offsets::I64(l.value_offsets()),
                    nulls: l.nulls(),
                    values: l.values(),
                })
            }
            _ => None,
        }
    }

    /// Child indices of row `i`, or `None` when the row is null.
    fn range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        if self.nulls.is_some_and(|n| n.is_null(i)) {
            return None;
        }
        Some(match self.offsets {
            Offsets::I32(o) => o[i] as usize..o[i + 1] as usize,
            Offsets::I64(o) => o[i] as usize..o[i + 1] as usize,
        })
    }
}

struct CandidateCol<'a> {
    list: List<'a>,
    items: &'a StructArray,
    ids: StrCol<'a>,
    labels: StrCol<'a>,
}

/// A teacher's numbers: floats, or integers (a one-hot teacher written as `[0, 1]`, which the
/// JSON Lines reader accepts too).
enum Floats<'a> {
    F64(&'a arrow_array::Float64Array),
    F32(&'a arrow_array::Float32Array),
    I64(&'a arrow_array::Int64Array),
    I32(&'a arrow_array::Int32Array),
}

impl Floats<'_> {
    fn get(&self, i: usize) -> Option<f64> {
        match self {
            Floats::F64(a) => a.is_valid(i).then(|| a.value(i)),
            Floats::F32(a) => a.is_valid(i).then(|| f64::from(a.value(i))),
            Floats::I64(a) => a.is_valid(i).then(|| a.value(i) as f64),
            Floats::I32(a) => a.is_valid(i).then(|| f64::from(a.value(i))),
        }
    }
}

/// A column looked up by name: absent or null in every row (`Ok(None)`), usable, or of a type we
/// cannot read (`Err(message)`).
type Col<T> = Result<Option<T>, String>;

fn column<'a, T>(
    batch: &'a RecordBatch,
    name: &str,
    want: &str,
    f: impl FnOnce(&'a ArrayRef) -> Option<T>,
) -> Col<T> {
    let Some(a) = batch.column_by_name(name) else {
        return Ok(None);
    };
    // pyarrow and pandas write a column that is null in every row with the null type
    if a.data_type() == &DataType::Null {
        return Ok(None);
    }
    match f(a) {
        Some(t) => Ok(Some(t)),
        None => Err(format!(
            "column has type {}, expected {want}",
            a.data_type()
        )),
    }
}

/// Every row of a batch as a state, or the problems that keep it from being one (each naming
/// its field like the JSON Lines reader does).
pub(super) fn batch_to_states(batch: &RecordBatch) -> Vec<Result<State, Vec<FieldError>>> {
    let strs = |name: &str| column(batch, name, "a string (utf8)", StrCol::read);
    let (id, task_id, point, context) =
        (strs("id"), strs("task_id"), strs("point"), strs("context"));
    let (answer, rules, split) = (strs("answer"), strs("rules"), strs("split"));
    let candidates = column(
        batch,
        "candidates",
        "list<struct<id: utf8, label: utf8>>",
        |a| {
            let list = List::of(a)?;
            let items = list.values.as_struct_opt()?;
            let ids = StrCol::read(items.column_by_name("id")?)?;
            let labels = StrCol::read(items.column_by_name("label")?)?;
            Some(CandidateCol {
                list,
                items,
                ids,
                labels,
            })
        },
    );
    let teacher = column(batch, "teacher", "list<float64>", |a| {
        let list = List::of(a)?;
        let floats = match list.values.data_type() {
            DataType::Float64 => Floats::F64(list.values.as_primitive::<Float64Type>()),
            DataType::Float32 => Floats::F32(list.values.as_primitive::<Float32Type>()),
            DataType::Int64 => Floats::I64(list.values.as_primitive::<Int64Type>()),
            DataType::Int32 => Floats::I32(list.values.as_primitive::<Int32Type>()),
            _ => return None,
        };
        Some((list, floats))
    });
    let after_error = column(batch, "after_error", "bool", |a| a.as_boolean_opt());
    // a required field whose column is there but null-typed is null in this row, not missing
    let missing = |name: &str| {
        if batch.column_by_name(name).is_some() {
            "required field is null"
        } else {
            "required field is missing (the file has no such column)"
        }
    };

    (0..batch.num_rows())
        .map(|i| {
            let mut errors = Vec::new();
            let mut required = |name: &str, col: &Col<StrCol>| -> Option<String> {
                match col {
                    Ok(Some(c)) => match c.get(i) {
                        Some(s) => Some(s.to_owned()),
                        None => {
                            errors.push(FieldError::new(name, "required field is null"));
                            None
                        }
                    },
                    Ok(None) => {
                        errors.push(FieldError::new(name, missing(name)));
                        None
                    }
                    Err(e) => {
                        errors.push(FieldError::new(name, e.clone()));
                        None
                    }
                }
            };
            let id = required("id", &id);
            let task_id = required("task_id", &task_id);
            let point = required("point", &point);
            let context = required("context", &context);
            let mut optional = |name: &str, col: &Col<StrCol>| -> Option<String> {
                match col {
                    Ok(Some(c)) => c.get(i).map(str::to_owned),
                    Ok(None) => None,
                    Err(e) => {
                        errors.push(FieldError::new(name, e.clone()));
                        None
                    }
                }
            };
            let answer = optional("answer", &answer);
            let rules = optional("rules", &rules);
            let split = optional("split", &split);

            let cands = match &candidates {
                Ok(Some(c)) => match c.list.range(i) {
                    Some(range) => {
                        let mut out = Vec::with_capacity(range.len());
                        for (k, j) in range.enumerate() {
                            if c.items.is_null(j) {
                                errors.push(FieldError::new(
                                    format!("candidates[{k}]"),
                                    "candidate is null",
                                ));
                                continue;
                            }
                            let cid = c.ids.get(j);
                            let label = c.labels.get(j);
                            if cid.is_none() {
                                errors.push(FieldError::new(
                                    format!("candidates[{k}].id"),
                                    "required field is null",
                                ));
                            }
                            if label.is_none() {
                                errors.push(FieldError::new(
                                    format!("candidates[{k}].label"),
                                    "required field is null",
                                ));
                            }
                            if let (Some(cid), Some(label)) = (cid, label) {
                                out.push(Candidate {
                                    id: cid.to_owned(),
                                    label: label.to_owned(),
                                });
                            }
                        }
                        Some(out)
                    }
                    None => {
                        errors.push(FieldError::new("candidates", "required field is null"));
                        None
                    }
                },
                Ok(None) => {
                    errors.push(FieldError::new("candidates", missing("candidates")));
                    None
                }
                Err(e) => {
                    errors.push(FieldError::new("candidates", e.clone()));
                    None
                }
            };
            let teach = match &teacher {
                Ok(Some((list, floats))) => list.range(i).map(|range| {
                    let mut out = Vec::with_capacity(range.len());
                    for (k, j) in range.enumerate() {
                        match floats.get(j) {
                            Some(x) => out.push(x),
                            None => errors.push(FieldError::new(
                                format!("teacher[{k}]"),
                                "expected a number, found null",
                            )),
                        }
                    }
                    out
                }),
                Ok(None) => None,
                Err(e) => {
                    errors.push(FieldError::new("teacher", e.clone()));
                    None
                }
            };
            let after = match &after_error {
                Ok(Some(b)) => b.is_valid(i) && b.value(i),
                Ok(None) => false,
                Err(e) => {
                    errors.push(FieldError::new("after_error", e.clone()));
                    false
                }
            };
            match (id, task_id, point, context, cands) {
                (Some(id), Some(task_id), Some(point), Some(context), Some(candidates))
                    if errors.is_empty() =>
                {
                    Ok(State {
                        id,
                        task_id,
                        point,
                        context,
                        candidates,
                        answer,
                        teacher: teach,
                        after_error: after,
                        rules,
                        split,
                    })
                }
                _ => Err(errors),
            }
        })
        .collect()
}

/// Row `i` of `batch` as one JSON object holding every column, for quarantine files.
/// Non-finite floats are written `NaN`, `Infinity`, `-Infinity` (as Python's `json` does);
/// a column of a type JSON cannot hold is written as a string naming the type.
pub(super) fn row_to_json(batch: &RecordBatch, i: usize) -> String {
    let mut out = String::from("{");
    for (k, (field, col)) in batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .enumerate()
    {
        if k > 0 {
            out.push(',');
        }
        push_json_string(&mut out, field.name());
        out.push(':');
        push_value(&mut out, col.as_ref(), i);
    }
    out.push('}');
    out
}

fn push_json_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).expect("a string always serialises"));
}

fn push_float(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&serde_json::to_string(&x).expect("a finite float always serialises"));
    }
}

fn push_value(out: &mut String, a: &dyn Array, i: usize) {
    if a.is_null(i) {
        out.push_str("null");
        return;
    }
    macro_rules! int {
        ($t:ty) => {{
            let _ = write!(out, "{}", a.as_primitive::<$t>().value(i));
        }};
    }
    match a.data_type() {
        DataType::Boolean => out.push_str(if a.as_boolean().value(i) {
            "true"
        } else {
            "false"
        }),
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float32 => push_float(out, f64::from(a.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => push_float(out, a.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => push_json_string(out, a.as_string::<i32>().value(i)),
        DataType::LargeUtf8 => push_json_string(out, a.as_string::<i64>().value(i)),
        DataType::Utf8View => push_json_string(out, a.as_string_view().value(i)),
        DataType::Null => out.push_str("null"),
        DataType::Dictionary(..) => {
            // the row's value (quarantine only: all keys are normalised for the one row)
            let d = a.as_any_dictionary();
            match d.normalized_keys().get(i) {
                Some(&k) if k < d.values().len() => push_value(out, d.values().as_ref(), k),
                _ => out.push_str("null"),
            }
        }
        DataType::List(_) | DataType::LargeList(_) => {
            let list = List::of(a).expect("list type checked");
            out.push('[');
            for (k, j) in list.range(i).unwrap_or(0..0).enumerate() {
                if k > 0 {
                    out.push(',');
                }
                push_value(out, list.values.as_ref(), j);
            }
            out.push(']');
        }
        DataType::Struct(fields) => {
            let s = a.as_struct();
            out.push('{');
            for (k, (f, c)) in fields.iter().zip(s.columns()).enumerate() {
                if k > 0 {
                    out.push(',');
                }
                push_json_string(out, f.name());
                out.push(':');
                push_value(out, c.as_ref(), i);
            }
            out.push('}');
        }
        other => push_json_string(out, &format!("<{other} value>")),
    }
}
