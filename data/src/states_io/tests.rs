use std::fs;
use std::sync::Arc;

use ::parquet::arrow::ArrowWriter;
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use arrow_array::{ArrayRef, Int64Array, LargeStringArray, ListArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use super::*;
use crate::state::Candidate;
use crate::validate::ValidateOptions;

pub(crate) fn sample_state(i: usize) -> State {
    State {
        id: format!("s{i}"),
        task_id: format!("task-{}", i / 3),
        point: ["tool", "args", "stop"][i % 3].into(),
        context: format!("customer: where is order #{i}?\n\u{e9}t\u{e9} \"quoted\" \t tab"),
        candidates: (0..2 + i % 5)
            .map(|k| Candidate {
                id: format!("opt_{k}"),
                label: format!("option {k} of {i}"),
            })
            .collect(),
        answer: (!i.is_multiple_of(4)).then(|| "opt_1".to_string()),
        teacher: i.is_multiple_of(2).then(|| {
            let n = 2 + i % 5;
            (0..n).map(|_| 1.0 / n as f64).collect()
        }),
        after_error: i % 3 == 1,
        rules: (!i.is_multiple_of(5)).then(|| {
            if i.is_multiple_of(2) {
                "v1".into()
            } else {
                "2026-11-cancel".into()
            }
        }),
        split: match (i / 3) % 7 {
            0 => Some("train".into()),
            1 => Some("test".into()),
            _ => None,
        },
    }
}

fn read_all(paths: &[PathBuf]) -> Vec<Result<Row<State>, BadRow>> {
    StateReader::open(paths)
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

#[test]
fn round_trip_jsonl_parquet_jsonl_keeps_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let states: Vec<State> = (0..50).map(sample_state).collect();
    let (j1, pq, j2) = (
        dir.path().join("a.jsonl"),
        dir.path().join("b.parquet"),
        dir.path().join("c.json"),
    );
    assert_eq!(write_states(&j1, &states).unwrap(), 50);
    let from_jsonl: Vec<State> = read_all(std::slice::from_ref(&j1))
        .into_iter()
        .map(|r| r.unwrap().value)
        .collect();
    assert_eq!(from_jsonl, states);
    write_states(&pq, &from_jsonl).unwrap();
    let from_parquet = read_states(std::slice::from_ref(&pq), ValidateOptions::default()).unwrap();
    assert_eq!(from_parquet, states);
    write_states(&j2, &from_parquet).unwrap();
    assert_eq!(
        fs::read(&j1).unwrap(),
        fs::read(&j2).unwrap(),
        "JSONL -> Parquet -> JSONL is byte-identical"
    );
    // The Parquet file says what it holds.
    let meta = SerializedFileReader::new(fs::File::open(&pq).unwrap())
        .unwrap()
        .metadata()
        .file_metadata()
        .clone();
    let kv = meta.key_value_metadata().unwrap();
    assert!(
        kv.iter()
            .any(|k| k.key == "schema" && k.value.as_deref() == Some(STATES_SCHEMA_ID))
    );
}

#[test]
fn parquet_streams_across_many_row_groups_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.parquet");
    let n = 5_000;
    let mut w = StateWriter::create_with_row_group_rows(&path, 300).unwrap();
    for i in 0..n {
        w.write(&sample_state(i)).unwrap();
    }
    assert_eq!(w.finish().unwrap(), n as u64);
    let groups = SerializedFileReader::new(fs::File::open(&path).unwrap())
        .unwrap()
        .metadata()
        .num_row_groups();
    assert_eq!(groups, n.div_ceil(300), "row groups of 300 rows");

    let reader = StateReader::open(std::slice::from_ref(&path)).unwrap();
    assert_eq!(reader.row_count_hint(), Some(n as u64));
    let mut count = 0;
    for (k, item) in reader.enumerate() {
        let row = item.unwrap().unwrap();
        assert_eq!(
            row.row,
            k as u64 + 1,
            "rows numbered from 1 across row groups and batches"
        );
        assert_eq!(row.value, sample_state(k));
        // A row holds on to its decoded batch only: never more than one batch's worth of rows.
        let Raw::Batch(batch, _) = &row.raw else {
            panic!("Parquet rows keep their batch")
        };
        assert!(batch.num_rows() <= super::parquet::READ_BATCH_ROWS);
        count += 1;
    }
    assert_eq!(count, n);
}

#[test]
fn folder_of_shards_reads_in_name_order_and_skips_hidden_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    write_states(shards.join("part-002.parquet"), &[sample_state(2)]).unwrap();
    write_states(shards.join("part-000.jsonl"), &[sample_state(0)]).unwrap();
    write_states(shards.join("part-001.json"), &[sample_state(1)]).unwrap();
    fs::write(shards.join(".part-003.parquet.tmp-1"), b"half a file").unwrap();
    fs::write(shards.join("README.md"), b"not a shard").unwrap();
    // subfolders are read, a partition folder of another column too; hidden and `_` ones not
    write_states(shards.join("late/part-000.jsonl"), &[sample_state(3)]).unwrap();
    write_states(shards.join("day=2026-11-02/p.parquet"), &[sample_state(4)]).unwrap();
    write_states(shards.join("_temporary/0/p.parquet"), &[sample_state(5)]).unwrap();
    write_states(shards.join(".cache/p.parquet"), &[sample_state(6)]).unwrap();
    let reader = StateReader::open(std::slice::from_ref(&shards)).unwrap();
    let names: Vec<String> = reader
        .files()
        .iter()
        .map(|p| p.strip_prefix(&shards).unwrap().display().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "day=2026-11-02/p.parquet",
            "late/part-000.jsonl",
            "part-000.jsonl",
            "part-001.json",
            "part-002.parquet"
        ]
    );
    let ids: Vec<String> = reader.map(|r| r.unwrap().unwrap().value.id).collect();
    assert_eq!(ids, ["s4", "s3", "s0", "s1", "s2"]);
    // a partition folder of a contract column would lose its value: refused, naming it
    write_states(shards.join("late/split=test/p.jsonl"), &[sample_state(7)]).unwrap();
    let err = StateReader::open(std::slice::from_ref(&shards))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("split=test: a partition folder: `split` is read from the files' rows"),
        "{err}"
    );

    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let err = StateReader::open(&[empty]).err().unwrap().to_string();
    assert!(err.contains("no .parquet, .jsonl or .json shard"), "{err}");
    let err = StateReader::open(&[dir.path().join("x.csv")])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("cannot read"), "{err}");
    fs::write(dir.path().join("x.csv"), b"").unwrap();
    let err = StateReader::open(&[dir.path().join("x.csv")])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("unknown format"), "{err}");
}

#[test]
fn jsonl_rows_are_numbered_by_line_and_keep_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let a = serde_json::to_string(&sample_state(1)).unwrap();
    let b = serde_json::to_string(&sample_state(2))
        .unwrap()
        .replace(",", " ,  ");
    // a blank line, a CRLF line, no final newline
    fs::write(&path, format!("{a}\n\n  \n{b}\r\n{a}")).unwrap();
    let rows: Vec<Row<State>> = read_all(&[path]).into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(rows.iter().map(|r| r.row).collect::<Vec<_>>(), [1, 4, 5]);
    assert_eq!(rows[1].value, sample_state(2));
    assert_eq!(&*rows[1].raw(), format!("{b}\r").as_bytes());
    assert_eq!(&*rows[2].raw(), a.as_bytes());
}

fn bad_of(line: &str) -> BadRow {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let good = serde_json::to_string(&sample_state(1)).unwrap();
    fs::write(&path, format!("{good}\n{line}\n{good}\n")).unwrap();
    let rows = read_all(std::slice::from_ref(&path));
    assert_eq!(rows.len(), 3, "nothing dropped");
    assert!(rows[0].is_ok() && rows[2].is_ok());
    let bad = rows.into_iter().nth(1).unwrap().unwrap_err();
    assert_eq!(bad.row, 2);
    assert_eq!(*bad.file, path);
    assert_eq!(&*bad.raw(), line.as_bytes());
    bad
}

fn good_json() -> serde_json::Value {
    serde_json::to_value(sample_state(1)).unwrap()
}

#[test]
fn jsonl_missing_and_mistyped_fields_are_named() {
    for field in ["id", "task_id", "point", "context", "candidates"] {
        let mut v = good_json();
        v.as_object_mut().unwrap().remove(field);
        let bad = bad_of(&v.to_string());
        assert_eq!(
            bad.errors,
            [FieldError::new(field, "required field is missing")],
            "{field}"
        );
    }
    let mut v = good_json();
    v["id"] = serde_json::json!(5);
    v["teacher"] = serde_json::json!([0.5, "0.5"]);
    v["after_error"] = serde_json::json!("yes");
    v["candidates"][1] = serde_json::json!({"id": "x"});
    let bad = bad_of(&v.to_string());
    let got: Vec<(&str, &str)> = bad
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("id", "expected a string, found the number 5"),
            ("candidates[1].label", "required field is missing"),
            ("teacher[1]", "expected a number, found the string \"0.5\""),
            (
                "after_error",
                "expected true or false, found the string \"yes\""
            ),
        ]
    );
    let mut v = good_json();
    v["candidates"] = serde_json::json!("a,b");
    assert_eq!(bad_of(&v.to_string()).errors[0].field, "candidates");
    // Optional fields may be null; unknown fields are ignored.
    let mut v = good_json();
    v["answer"] = serde_json::Value::Null;
    v["rules"] = serde_json::Value::Null;
    v["after_error"] = serde_json::Value::Null;
    v["recorded_by"] = serde_json::json!("harness 3.1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.jsonl");
    fs::write(&path, v.to_string()).unwrap();
    let row = read_all(&[path]).pop().unwrap().unwrap();
    assert_eq!(
        (row.value.answer, row.value.rules, row.value.after_error),
        (None, None, false)
    );
}

#[test]
fn jsonl_syntax_errors_name_the_field_and_nan() {
    let good = serde_json::to_string(&sample_state(2)).unwrap();
    let with_nan = good.replacen("\"teacher\":[", "\"teacher\":[NaN,", 1);
    assert_ne!(with_nan, good);
    let bad = bad_of(&with_nan);
    assert_eq!(bad.errors.len(), 1);
    assert_eq!(bad.errors[0].field, "teacher");
    assert!(
        bad.errors[0]
            .reason
            .starts_with("NaN is not a number JSON allows"),
        "{:?}",
        bad.errors
    );

    let bad = bad_of(&good.replacen("\"point\":\"stop\"", "\"point\":stop", 1));
    assert_eq!(bad.errors[0].field, "point");
    assert!(
        bad.errors[0].reason.starts_with("not valid JSON"),
        "{:?}",
        bad.errors
    );

    let bad = bad_of(&good[..good.len() / 2]);
    assert!(
        bad.errors[0].reason.starts_with("not valid JSON"),
        "{:?}",
        bad.errors
    );

    let bad = bad_of("[1, 2]");
    assert_eq!(
        bad.errors,
        [FieldError::new(
            "(row)",
            "expected a JSON object, found a list"
        )]
    );
}

fn write_batch(path: &Path, batch: &RecordBatch) {
    let mut w =
        ArrowWriter::try_new(fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

#[test]
fn parquet_from_other_writers_large_strings_extra_and_missing_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.parquet");
    // pyarrow/polars style: large strings, no optional columns at all, one extra column.
    let canonical = states_to_batch(&[sample_state(1), sample_state(2)]).unwrap();
    let large = |v: [&str; 2]| -> ArrayRef { Arc::new(LargeStringArray::from(v.to_vec())) };
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::LargeUtf8, false),
            Field::new("task_id", DataType::LargeUtf8, false),
            Field::new("point", DataType::LargeUtf8, false),
            Field::new("context", DataType::LargeUtf8, false),
            canonical
                .schema()
                .field_with_name("candidates")
                .unwrap()
                .clone(),
            Field::new("episode_step", DataType::Int64, false),
        ])),
        vec![
            large(["s1", "s2"]),
            large(["t", "t"]),
            large(["tool", "stop"]),
            large(["ctx 1", "ctx 2"]),
            canonical.column_by_name("candidates").unwrap().clone(),
            Arc::new(Int64Array::from(vec![7, 8])),
        ],
    )
    .unwrap();
    write_batch(&path, &batch);
    let rows: Vec<Row<State>> = read_all(std::slice::from_ref(&path))
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    let s = &rows[1].value;
    assert_eq!(
        (s.id.as_str(), s.point.as_str(), s.context.as_str()),
        ("s2", "stop", "ctx 2")
    );
    assert_eq!(s.candidates, sample_state(2).candidates);
    assert_eq!(
        (
            s.answer.as_ref(),
            s.teacher.as_ref(),
            s.after_error,
            s.split.as_ref()
        ),
        (None, None, false, None)
    );
    // The raw form of a Parquet row is JSON with every column, extra ones too.
    let raw: serde_json::Value = serde_json::from_slice(&rows[0].raw()).unwrap();
    assert_eq!(raw["episode_step"], 7);
    assert_eq!(raw["candidates"][1]["label"], "option 1 of 1");
}

#[test]
fn parquet_missing_null_and_mistyped_columns_are_row_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.parquet");
    let canonical = states_to_batch(&[sample_state(1), sample_state(2)]).unwrap();
    let teacher_item = Arc::new(Field::new("item", DataType::Float64, true));
    let teacher = ListArray::from_iter_primitive::<arrow_array::types::Float64Type, _, _>(vec![
        Some(vec![Some(0.5), Some(f64::NAN)]),
        Some(vec![Some(1.0), None]),
    ]);
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            // no task_id column
            Field::new("point", DataType::Int64, false),
            Field::new("context", DataType::Utf8, false),
            canonical
                .schema()
                .field_with_name("candidates")
                .unwrap()
                .clone(),
            Field::new("teacher", DataType::List(teacher_item), true),
        ])),
        vec![
            Arc::new(StringArray::from(vec![Some("s1"), None])),
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(StringArray::from(vec!["c", "c"])),
            canonical.column_by_name("candidates").unwrap().clone(),
            Arc::new(teacher),
        ],
    )
    .unwrap();
    write_batch(&path, &batch);
    let bad: Vec<BadRow> = read_all(&[path])
        .into_iter()
        .map(|r| r.unwrap_err())
        .collect();
    assert_eq!(bad.len(), 2);
    let fields = |b: &BadRow| b.errors.iter().map(|e| e.field.clone()).collect::<Vec<_>>();
    assert_eq!(fields(&bad[0]), ["task_id", "point"]);
    assert_eq!(fields(&bad[1]), ["id", "task_id", "point", "teacher[1]"]);
    assert_eq!(bad[1].row, 2);
    assert_eq!(
        bad[0].errors[0].reason,
        "required field is missing (the file has no such column)"
    );
    assert_eq!(
        bad[0].errors[1].reason,
        "column has type Int64, expected a string (utf8)"
    );
    assert_eq!(bad[1].errors[0].reason, "required field is null");
    // Quarantine form: JSON with NaN spelled as Python does; it reads back as JSON Lines and the
    // NaN is then reported on `teacher`.
    let raw = String::from_utf8(bad[0].raw().into_owned()).unwrap();
    assert!(raw.contains("\"teacher\":[0.5,NaN]"), "{raw}");
    assert!(
        raw.contains("\"id\":\"s1\"") && raw.contains("\"point\":1"),
        "{raw}"
    );
    assert!(
        String::from_utf8(bad[1].raw().into_owned())
            .unwrap()
            .contains("\"id\":null")
    );
}

#[test]
fn parquet_from_pandas_null_typed_dictionary_and_integer_columns() {
    // pandas / pyarrow write a column that is None in every row with the null type, categoricals
    // as dictionaries (any key width), and a teacher of 0s and 1s as integers.
    use arrow_array::types::{Int8Type, Int32Type, Int64Type};
    use arrow_array::{DictionaryArray, NullArray};
    let dir = tempfile::tempdir().unwrap();
    let canonical = states_to_batch(&[sample_state(1), sample_state(2)]).unwrap();
    let candidates = canonical
        .schema()
        .field_with_name("candidates")
        .unwrap()
        .clone();
    let null = |name: &str| Field::new(name, DataType::Null, true);
    let dict = |k: DataType, name: &str| {
        Field::new(
            name,
            DataType::Dictionary(Box::new(k), Box::new(DataType::Utf8)),
            false,
        )
    };
    let int_item = Arc::new(Field::new("item", DataType::Int64, true));
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            dict(DataType::Int8, "task_id"),
            dict(DataType::Int32, "point"),
            Field::new("context", DataType::Utf8, false),
            candidates.clone(),
            null("answer"),
            Field::new("teacher", DataType::List(int_item), true),
            null("after_error"),
            null("rules"),
            null("split"),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["s1", "s2"])),
            Arc::new(DictionaryArray::<Int8Type>::from_iter(["t", "t"])),
            Arc::new(DictionaryArray::<Int32Type>::from_iter(["stop", "tool"])),
            Arc::new(StringArray::from(vec!["ctx 1", "ctx 2"])),
            canonical.column_by_name("candidates").unwrap().clone(),
            Arc::new(NullArray::new(2)),
            Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
                Some(vec![Some(0), Some(1), Some(0)]),
                Some(vec![Some(0), None, Some(1), Some(0)]),
            ])),
            Arc::new(NullArray::new(2)),
            Arc::new(NullArray::new(2)),
            Arc::new(NullArray::new(2)),
        ],
    )
    .unwrap();
    let path = dir.path().join("pandas.parquet");
    write_batch(&path, &batch);
    let rows = read_all(std::slice::from_ref(&path));
    let s = &rows[0].as_ref().unwrap().value;
    assert_eq!(
        (s.task_id.as_str(), s.point.as_str(), s.context.as_str()),
        ("t", "stop", "ctx 1")
    );
    assert_eq!(
        (s.answer.as_ref(), s.teacher.as_deref(), s.after_error),
        (None, Some(&[0.0, 1.0, 0.0][..]), false)
    );
    assert_eq!((s.rules.as_ref(), s.split.as_ref()), (None, None));
    // The second row's null teacher item is its only error, and its quarantine form holds the
    // dictionary's values and the null-typed columns as null.
    let bad = rows[1].as_ref().unwrap_err();
    let fields: Vec<&str> = bad.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["teacher[1]"]);
    let raw: serde_json::Value = serde_json::from_slice(&bad.raw()).unwrap();
    assert_eq!(
        (
            &raw["task_id"],
            &raw["point"],
            &raw["answer"],
            &raw["split"]
        ),
        (
            &"t".into(),
            &"tool".into(),
            &serde_json::Value::Null,
            &serde_json::Value::Null
        )
    );
    assert_eq!(raw["teacher"], serde_json::json!([0, null, 1, 0]));

    // A required column of the null type is null in every row, not missing.
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("task_id", DataType::Utf8, false),
            Field::new("point", DataType::Utf8, false),
            null("context"),
            candidates,
        ])),
        vec![
            Arc::new(StringArray::from(vec!["s1", "s2"])),
            Arc::new(StringArray::from(vec!["t", "t"])),
            Arc::new(StringArray::from(vec!["stop", "tool"])),
            Arc::new(NullArray::new(2)),
            canonical.column_by_name("candidates").unwrap().clone(),
        ],
    )
    .unwrap();
    let path = dir.path().join("no-context.parquet");
    write_batch(&path, &batch);
    for r in read_all(&[path]) {
        let bad = r.unwrap_err();
        assert_eq!(bad.errors.len(), 1);
        assert_eq!(
            (bad.errors[0].field.as_str(), bad.errors[0].reason.as_str()),
            ("context", "required field is null")
        );
    }
}

#[test]
fn not_parquet_is_a_fatal_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.parquet");
    fs::write(&path, b"this is not parquet").unwrap();
    let mut reader = StateReader::open(&[path]).unwrap();
    let err = format!("{:#}", reader.next().unwrap().unwrap_err());
    assert!(
        err.contains("fake.parquet: not a readable Parquet file"),
        "{err}"
    );
}

#[test]
fn writers_are_atomic() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["out.parquet", "out.jsonl"] {
        let path = dir.path().join(name);
        write_states(&path, &[sample_state(0)]).unwrap();
        let before = fs::read(&path).unwrap();
        {
            let mut w = StateWriter::create(&path).unwrap();
            for i in 0..10 {
                w.write(&sample_state(i)).unwrap();
            }
            // dropped without finish: the old file stays, no temporary is left behind
        }
        assert_eq!(fs::read(&path).unwrap(), before, "{name}");
        write_states(&path, &[sample_state(1), sample_state(2)]).unwrap();
        let ids: Vec<String> = read_all(std::slice::from_ref(&path))
            .into_iter()
            .map(|r| r.unwrap().value.id)
            .collect();
        assert_eq!(ids, ["s1", "s2"]);
    }
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no temporary files left"
    );
    assert!(StateWriter::create(dir.path().join("out.csv")).is_err());
}

#[test]
fn jsonl_with_a_byte_order_mark_reads_its_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bom.jsonl");
    let mut bytes = UTF8_BOM.to_vec();
    for i in 0..2 {
        bytes.extend(serde_json::to_vec(&sample_state(i)).unwrap());
        bytes.push(b'\n');
    }
    fs::write(&path, &bytes).unwrap();
    let rows = read_all(&[path]);
    assert_eq!(rows.len(), 2);
    for (i, r) in rows.into_iter().enumerate() {
        let row =
            r.unwrap_or_else(|b| panic!("row {}: {:?}", i + 1, b.lines().collect::<Vec<_>>()));
        assert_eq!(row.value, sample_state(i));
    }
    // Only a leading mark is dropped: one before a later line is still an error.
    let path = dir.path().join("bom-late.jsonl");
    let mut bytes = serde_json::to_vec(&sample_state(0)).unwrap();
    bytes.push(b'\n');
    bytes.extend(UTF8_BOM);
    bytes.extend(serde_json::to_vec(&sample_state(1)).unwrap());
    fs::write(&path, &bytes).unwrap();
    let rows = read_all(&[path]);
    assert!(rows[0].is_ok() && rows[1].is_err());
}

/// A corrupt file from `decision-fuzz states-parquet` (fuzz/corpus/states-parquet/finding-*).
fn fuzz_finding(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus/states-parquet")
        .join(name)
}

/// Found by the fuzzer: parquet-rs panicked inside the read (a column chunk with a negative
/// start in the footer; definition levels past their page), which aborted `data validate`,
/// `train` and `eval`, or reserved 2 GiB for a page of a 9 KB file. Now the read ends with an
/// error naming the file.
#[test]
fn corrupt_parquet_that_panics_the_decoder_is_an_error() {
    for (name, why) in [
        // caught by the page check before the decoder runs (`parquet_pages`)
        (
            "finding-negative-column-chunk.parquet",
            "the footer puts its pages at bytes 2798..+-672",
        ),
        (
            "finding-def-levels-past-page.parquet",
            "corrupt Parquet data (the Parquet decoder failed",
        ),
        // a page header claiming 2^31 - 1 bytes: parquet-rs reserved them before decompressing
        (
            "finding-alloc-4feeeb6c1f99b68a.parquet",
            "claims 2147483647 bytes uncompressed",
        ),
    ] {
        let path = fuzz_finding(name);
        let reader = StateReader::open(std::slice::from_ref(&path)).unwrap();
        let errors: Vec<String> = reader
            .filter_map(|item| item.err().map(|e| format!("{e:#}")))
            .collect();
        assert_eq!(errors.len(), 1, "{name}: {errors:?}");
        assert!(errors[0].contains(why), "{name}: {}", errors[0]);
        assert!(errors[0].contains(name), "{}", errors[0]);
    }
}
