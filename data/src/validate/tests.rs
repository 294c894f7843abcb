use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;
use crate::quarantine::{Quarantine, errors_path};
use crate::states_io::{StateReader, write_states};

fn good(id: &str) -> Value {
    json!({
        "id": id,
        "task_id": "task-0",
        "point": "tool",
        "context": "user: cancel my order",
        "candidates": [{"id": "lookup_order", "label": "lookup_order"}, {"id": "cancel_order", "label": "cancel_order"}],
        "answer": "cancel_order",
        "teacher": [0.25, 0.75],
    })
}

/// Validates `lines` (as one JSONL file, after a good first row) and returns the bad row, which
/// must be row 2, and checks that the good rows around it survive.
fn only_bad(line: &Value, opts: ValidateOptions) -> BadRow {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("states.jsonl");
    let text = format!("{}\n{}\n{}\n", good("first"), line, good("last"));
    fs::write(&path, text).unwrap();
    let items: Vec<_> = StateReader::open(std::slice::from_ref(&path))
        .unwrap()
        .validated(opts)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(items.len(), 3);
    assert!(
        items[0].is_ok() && items[2].is_ok(),
        "good rows pass: {items:?}"
    );
    let bad = items.into_iter().nth(1).unwrap().unwrap_err();
    assert_eq!(bad.row, 2);
    assert_eq!(*bad.file, path);
    bad
}

fn errors_of(mutate: impl FnOnce(&mut Value)) -> Vec<(String, String)> {
    errors_with(mutate, ValidateOptions::default())
}

fn errors_with(mutate: impl FnOnce(&mut Value), opts: ValidateOptions) -> Vec<(String, String)> {
    let mut v = good("middle");
    mutate(&mut v);
    only_bad(&v, opts)
        .errors
        .into_iter()
        .map(|e| (e.field, e.reason))
        .collect()
}

fn one(field: &str, reason: &str) -> Vec<(String, String)> {
    vec![(field.to_string(), reason.to_string())]
}

#[test]
fn rule_missing_field() {
    assert_eq!(
        errors_of(|v| drop(v.as_object_mut().unwrap().remove("context"))),
        one("context", "required field is missing")
    );
}

#[test]
fn rule_answer_among_candidates() {
    assert_eq!(
        errors_of(|v| v["answer"] = json!("refund_order")),
        one("answer", "\"refund_order\" is not among the candidate ids")
    );
}

#[test]
fn rule_duplicate_candidate_ids() {
    assert_eq!(
        errors_of(|v| v["candidates"][1]["id"] = json!("lookup_order")),
        vec![
            (
                "candidates[1].id".to_string(),
                "duplicate id \"lookup_order\" (also candidates[0])".to_string()
            ),
            (
                "answer".to_string(),
                "\"cancel_order\" is not among the candidate ids".to_string()
            ),
        ]
    );
}

#[test]
fn rule_fewer_than_two_options() {
    assert_eq!(
        errors_of(|v| {
            v["candidates"] = json!([{"id": "cancel_order", "label": "cancel"}]);
            v["teacher"] = json!([1.0]);
        }),
        one("candidates", "1 option(s); a decision needs at least 2")
    );
}

#[test]
fn rule_more_than_max_options_default_and_configured() {
    let many = |n: usize| {
        move |v: &mut Value| {
            v["candidates"] = (0..n)
                .map(|i| json!({"id": format!("t{i}"), "label": format!("t{i}")}))
                .collect();
            v["answer"] = json!("t0");
            v["teacher"] = Value::Null;
        }
    };
    assert_eq!(
        errors_of(many(17)),
        one("candidates", "17 options; at most 16 allowed (max_options)")
    );
    let four = ValidateOptions {
        max_options: 4,
        ..ValidateOptions::default()
    };
    assert_eq!(
        errors_with(many(5), four),
        one("candidates", "5 options; at most 4 allowed (max_options)")
    );
    // 16 is fine by default.
    let mut v = good("x");
    many(16)(&mut v);
    assert!(
        check_state(
            &crate::states_io::state_from_json(&v).unwrap(),
            DEFAULT_MAX_OPTIONS
        )
        .is_empty()
    );
}

#[test]
fn rule_empty_label_and_empty_candidate_id() {
    assert_eq!(
        errors_of(|v| v["candidates"][0]["label"] = json!("")),
        one("candidates[0].label", "is empty")
    );
    assert_eq!(
        errors_of(|v| v["candidates"][0]["id"] = json!("")),
        one("candidates[0].id", "is empty")
    );
}

#[test]
fn rule_teacher_length() {
    assert_eq!(
        errors_of(|v| v["teacher"] = json!([0.2, 0.3, 0.5])),
        one("teacher", "has 3 values for 2 candidates")
    );
}

#[test]
fn rule_teacher_value_outside_unit_interval() {
    assert_eq!(
        errors_of(|v| v["teacher"] = json!([-0.5, 1.5])),
        one("teacher[0]", "-0.5 is outside [0, 1]")
            .into_iter()
            .chain(one("teacher[1]", "1.5 is outside [0, 1]"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn rule_teacher_sum() {
    assert_eq!(
        errors_of(|v| v["teacher"] = json!([0.3, 0.6])),
        one(
            "teacher",
            "sums to 0.8999999999999999, not 1 (within 0.001)"
        )
    );
    // within tolerance is fine
    let mut v = good("x");
    v["teacher"] = json!([0.2995, 0.7]);
    assert!(check_state(&crate::states_io::state_from_json(&v).unwrap(), 16).is_empty());
}

#[test]
fn rule_nan_in_teacher() {
    // JSON Lines: Python's json writes NaN; the reader names the field.
    let text = good("middle")
        .to_string()
        .replace("[0.25,0.75]", "[NaN,0.75]");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.jsonl");
    fs::write(&path, format!("{text}\n")).unwrap();
    let bad = StateReader::open(&[path])
        .unwrap()
        .validated(ValidateOptions::default())
        .next()
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!((bad.row, bad.errors[0].field.as_str()), (1, "teacher"));
    assert!(bad.errors[0].reason.contains("NaN"));
    // Parquet holds real NaNs: the rule names the element.
    let mut s = crate::states_io::state_from_json(&good("p")).unwrap();
    s.teacher = Some(vec![f64::NAN, 0.75]);
    let path = dir.path().join("nan.parquet");
    write_states(&path, [&s]).unwrap();
    let bad = StateReader::open(&[path])
        .unwrap()
        .validated(ValidateOptions::default())
        .next()
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(bad.row, 1);
    assert_eq!(
        bad.errors,
        [crate::states_io::FieldError::new("teacher[0]", "is NaN")]
    );
}

#[test]
fn rule_point_pattern() {
    for bad in ["Tool", "1tool", "to-ol", "", "tool "] {
        assert_eq!(
            errors_of(|v| v["point"] = json!(bad)),
            one("point", &format!("{bad:?} does not match [a-z][a-z0-9_]*")),
            "{bad:?}"
        );
    }
    for ok in ["tool", "args", "stop_2", "t"] {
        assert!(point_name_ok(ok), "{ok}");
    }
}

#[test]
fn rule_split_value() {
    assert_eq!(
        errors_of(|v| v["split"] = json!("training")),
        one("split", "\"training\" is not one of train, valid, test")
    );
}

#[test]
fn rule_empty_id_and_task_id() {
    assert_eq!(errors_of(|v| v["id"] = json!("")), one("id", "is empty"));
    assert_eq!(
        errors_of(|v| v["task_id"] = json!("")),
        one("task_id", "is empty")
    );
}

#[test]
fn rule_duplicate_id_across_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    fs::write(&a, format!("{}\n{}\n", good("s1"), good("s2"))).unwrap();
    fs::write(&b, format!("{}\n{}\n", good("s3"), good("s2"))).unwrap();
    let items: Vec<_> = StateReader::open(&[a.clone(), b.clone()])
        .unwrap()
        .validated(ValidateOptions::default())
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(items.iter().filter(|r| r.is_ok()).count(), 3);
    let bad = items.into_iter().nth(3).unwrap().unwrap_err();
    assert_eq!((bad.file.as_path(), bad.row), (b.as_path(), 2));
    assert_eq!(
        bad.errors,
        [FieldError::new(
            "id",
            format!("duplicate id \"s2\" (first at {} row 2)", a.display())
        )]
    );
}

#[test]
fn rule_a_task_in_two_splits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let with = |id: &str, split: Option<&str>| {
        let mut v = good(id);
        if let Some(s) = split {
            v["split"] = json!(s);
        }
        v.to_string()
    };
    // task-0 hashes to train (pinned in split.rs): no split and "train" agree, "test" does not.
    fs::write(
        &path,
        [
            with("a", None),
            with("b", Some("train")),
            with("c", Some("test")),
        ]
        .join("\n"),
    )
    .unwrap();
    let items: Vec<_> = StateReader::open(std::slice::from_ref(&path))
        .unwrap()
        .validated(ValidateOptions::default())
        .map(|r| r.unwrap())
        .collect();
    assert!(items[0].is_ok() && items[1].is_ok());
    let bad = items[2].as_ref().unwrap_err();
    assert_eq!(bad.row, 3);
    assert_eq!(bad.errors[0].field, "split");
    assert_eq!(
        bad.errors[0].reason,
        format!(
            "split is \"test\" but task \"task-0\" is already in \"train\" (at {} row 1); a split never cuts a task in two",
            path.display()
        )
    );
    // The other way round: explicit test first, then a row with no split that hashes to train.
    fs::write(&path, [with("a", Some("test")), with("b", None)].join("\n")).unwrap();
    let bad = StateReader::open(&[path])
        .unwrap()
        .validated(ValidateOptions::default())
        .nth(1)
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        bad.errors[0]
            .reason
            .starts_with("no split given, so the task's hash puts it in \"train\""),
        "{:?}",
        bad.errors
    );
}

#[test]
fn every_problem_of_a_row_is_listed() {
    let errs = errors_of(|v| {
        v["id"] = json!("");
        v["point"] = json!("Tool");
        v["answer"] = json!("nope");
        v["teacher"] = json!([0.5]);
    });
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["id", "point", "answer", "teacher", "teacher"]);
}

fn quarantine_lines(path: &Path) -> Vec<Vec<u8>> {
    let bytes = fs::read(path).unwrap();
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn quarantine_keeps_bad_rows_unchanged_and_drops_nothing_valid() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("mixed.jsonl");
    // Odd but valid spacing and key order, a CRLF line, unknown fields: bad rows must come out
    // byte for byte.
    let bad1 = r#"{ "id":"b1",  "task_id":"t9","point":"tool","context":"x","candidates":[{"id":"a","label":"a"}] }"#;
    let bad2 = "{\"id\":\"b2\",\"task_id\":\"t9\",\"point\":\"tool\",\"context\":\"\u{e9}\",\"candidates\":[{\"id\":\"a\",\"label\":\"a\"},{\"id\":\"b\",\"label\":\"b\"}],\"answer\":\"c\",\"extra\":1}\r";
    let bad3 = "not json at all";
    let goods: Vec<String> = (0..5).map(|i| good(&format!("g{i}")).to_string()).collect();
    let text = [
        &goods[0], bad1, &goods[1], &goods[2], bad2, bad3, &goods[3], &goods[4],
    ]
    .join("\n");
    fs::write(&src, text).unwrap();

    let q = dir.path().join("out").join("quarantine.jsonl");
    let mut quarantine = Quarantine::create(&q).unwrap();
    let mut kept = Vec::new();
    for item in StateReader::open(std::slice::from_ref(&src))
        .unwrap()
        .validated(ValidateOptions::default())
    {
        match item.unwrap() {
            Ok(row) => kept.push(row.value.id),
            Err(bad) => quarantine.add(&bad).unwrap(),
        }
    }
    assert_eq!(quarantine.finish().unwrap(), 3);
    assert_eq!(
        kept,
        ["g0", "g1", "g2", "g3", "g4"],
        "every valid row kept, in order"
    );
    assert_eq!(
        quarantine_lines(&q),
        [bad1.as_bytes(), bad2.as_bytes(), bad3.as_bytes()]
    );
    let reasons: Vec<Value> = fs::read_to_string(errors_path(&q))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reasons.len(), 3);
    assert_eq!(
        (
            reasons[0]["line"].as_u64(),
            reasons[0]["row"].as_u64(),
            reasons[0]["field"].as_str()
        ),
        (Some(1), Some(2), Some("candidates"))
    );
    assert_eq!(
        (
            reasons[1]["line"].as_u64(),
            reasons[1]["row"].as_u64(),
            reasons[1]["field"].as_str()
        ),
        (Some(2), Some(5), Some("answer"))
    );
    assert_eq!(
        (
            reasons[2]["line"].as_u64(),
            reasons[2]["row"].as_u64(),
            reasons[2]["field"].as_str()
        ),
        (Some(3), Some(6), Some("(row)"))
    );

    // The quarantine is itself a JSON Lines states file: fixed rows can be fed back.
    let again: Vec<_> = StateReader::open(std::slice::from_ref(&q))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(again.len(), 3);
}

#[test]
fn quarantine_of_parquet_rows_is_json_that_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.parquet");
    let mut bad = crate::states_io::state_from_json(&good("b")).unwrap();
    bad.answer = Some("missing".into());
    let ok = crate::states_io::state_from_json(&good("g")).unwrap();
    write_states(&src, [&ok, &bad]).unwrap();
    let q = dir.path().join("q.jsonl");
    let mut quarantine = Quarantine::create(&q).unwrap();
    let mut kept = 0;
    for item in StateReader::open(&[src])
        .unwrap()
        .validated(ValidateOptions::default())
    {
        match item.unwrap() {
            Ok(_) => kept += 1,
            Err(b) => {
                assert_eq!((b.row, b.errors[0].field.as_str()), (2, "answer"));
                quarantine.add(&b).unwrap()
            }
        }
    }
    quarantine.finish().unwrap();
    assert_eq!(kept, 1);
    let back: Vec<PathBuf> = vec![q];
    let rows: Vec<_> = StateReader::open(&back)
        .unwrap()
        .map(|r| r.unwrap().unwrap().value)
        .collect();
    assert_eq!(rows, [bad], "the Parquet row comes back as the same state");
}
