use std::fs;

use super::*;
use crate::Quarantine;
use crate::{Fallback, Outcome, OutcomeStatus, ReceiptResult, Shadow, Validation};

/// Both shapes in one file, good and bad, as a harness would leave them.
const MIXED: &str = r#"{"id":"c1","at":"2026-11-30T12:00:00Z","point":"tool","model":"laya","candidates":["a","b"],"result":{"kind":"pick","id":"a","confidence":0.93},"validation":"accepted","outcome":{"status":"success","durationMs":1200,"retries":1}}
{"id":"c2","at":"2026-11-30T12:00:01Z","point":"tool","candidates":["a","b"],"result":{"kind":"abstain"},"validation":"accepted"}
{"id":"c3","at":"2026-11-30T12:00:02+01:00","point":"route","candidates":["x","y"],"result":{"kind":"pick","id":"y","confidence":0.5},"validation":"accepted","fallback":{"used":true,"to":"x","reason":"auth failed"},"outcome":{"status":"success"}}
{"id":"c4","at":"2026-11-30T12:00:03Z","point":"tool","candidates":["a","b"],"result":{"kind":"pick","id":"b","confidence":0.3},"validation":"rejected-stale","futureField":{"x":1}}

{"schemaVersion":1,"id":"k1","taskRevision":3,"backend":"laya","stage":"preStep","candidates":[{"id":"inspect","summary":"read first"},{"id":"verify","summary":"run tests"}],"result":{"kind":"selected","candidate_id":"verify"},"validation":"accepted","confidence":0.7,"selectedProbability":0.81,"fit":"good","observedOutcome":"tests passed","createdAt":1764504000123}
{"schemaVersion":1,"id":"k2","backend":"jev","stage":"intake","candidates":[{"id":"r1","summary":"sonnet"}],"result":{"kind":"abstained"},"validation":"accepted","fallback":"selector abstained","createdAt":1764504000000}
{"schemaVersion":1,"id":"k3","backend":"laya","stage":"toolBoundary","candidates":[{"id":"t1","summary":"x"},{"id":"t2","summary":"y"}],"result":{"kind":"selected","candidate_id":"t1"},"validation":"stale","confidence":0.99,"createdAt":1764504000000}
{"schemaVersion":1,"id":"k4","backend":"host","stage":"completion","candidates":[{"id":"t1","summary":"x"}],"result":{"kind":"selected","candidate_id":"t1"},"validation":"unauthorized","selectedProbability":1.0,"observedOutcome":"user closed the window","createdAt":1764504000000}
{"schemaVersion":1,"id":"k5","stage":"context","candidates":[{"id":"t1","summary":"x"}],"result":{"kind":"selected","candidate_id":"ghost"},"validation":"rejected","confidence":0.4,"createdAt":1764504000000}
{"schemaVersion":1,"id":"k6","stage":"preStep","candidates":[{"id":"t1","summary":"x"}],"result":{"kind":"selected","candidate_id":"t1"},"validation":"expired","confidence":0.0,"observedOutcome":"task failed: timeout","createdAt":1764504000000}
{"id":"b1","at":"2026-11-30T12:00:00Z","point":"tool","candidates":["a"],"result":{"kind":"pick","id":"a","confidence":1.5},"validation":"accepted"}
{"id":"b2","at":"2026-11-30T12:00:00Z","point":"tool","candidates":["a"],"result":{"kind":"pick","id":"a","confidence":0.5},"validation":"maybe"}
{"id":"b3","at":"2026-11-30T12:00:00Z","point":"tool","candidates":["a"],"result":{"kind":"pick","id":"z","confidence":0.5},"validation":"accepted"}
{"id":"b4","at":"2026-11-30T12:00:00Z","point":"tool","result":{"kind":"abstain"},"validation":"accepted"}
{"id":"b5","at":"2026-11-30T12:00:00Z","point":"tool",
{"schemaVersion":1,"id":"b6","stage":"preStep","candidates":[{"id":"t1","summary":"x"}],"result":{"kind":"selected","candidate_id":"t1"},"validation":"accepted","createdAt":1764504000000}
{"schemaVersion":1,"id":"b7","stage":"postStep","candidates":[{"id":"t1","summary":"x"}],"result":{"kind":"abstained"},"validation":"accepted","createdAt":1764504000000}
{"schemaVersion":1,"id":"b8","stage":"preStep","candidates":[{"id":"t1","summary":"x"}],"result":{"kind":"selected","candidate_id":"t1"},"validation":"accepted","selectedProbability":-0.1,"createdAt":1764504000000}
{"id":"b9","at":"yesterday","point":"tool","candidates":["a"],"result":{"kind":"abstain"},"validation":"accepted"}
{"id":"b10","at":"2026-11-30T12:00:00Z","point":"tool","candidates":["a"],"result":{"kind":"abstain"},"validation":"accepted","outcome":{"status":"won"}}
"#;

fn patterns() -> OutcomePatterns {
    OutcomePatterns::new(
        &["^task completed", "^tests passed"],
        &["^task failed", "error"],
    )
    .unwrap()
}

fn read_mixed() -> (Vec<Receipt>, Vec<BadRow>, ReadSummary, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.jsonl");
    fs::write(&path, MIXED).unwrap();
    let opts = ReadOptions {
        outcome: patterns(),
        progress: false,
    };
    let (good, bad, summary) = read_receipts(&[path], &opts).unwrap();
    (good, bad, summary, dir)
}

fn by_id<'a>(good: &'a [Receipt], id: &str) -> &'a Receipt {
    good.iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("{id} not read"))
}

#[test]
fn contract_lines_are_read_as_written() {
    let (good, _, _, _d) = read_mixed();
    let c1 = by_id(&good, "c1");
    assert_eq!(c1.point, "tool");
    assert_eq!(c1.model.as_deref(), Some("laya"));
    assert_eq!(
        c1.result,
        ReceiptResult::Pick {
            id: "a".into(),
            confidence: 0.93
        }
    );
    assert_eq!(
        c1.outcome,
        Some(Outcome {
            status: OutcomeStatus::Success,
            duration_ms: Some(1200),
            retries: Some(1)
        })
    );
    assert_eq!(by_id(&good, "c2").result, ReceiptResult::Abstain);
    let c3 = by_id(&good, "c3");
    assert_eq!(
        c3.fallback,
        Some(Fallback {
            used: true,
            to: Some("x".into()),
            reason: Some("auth failed".into())
        })
    );
    assert!(c3.fallback_used());
    let c4 = by_id(&good, "c4");
    assert_eq!(c4.validation, Validation::RejectedStale);
    assert_eq!(c4.outcome, None, "no outcome = pending");
}

#[test]
fn keel_events_are_mapped() {
    let (good, _, _, _d) = read_mixed();
    let k1 = by_id(&good, "k1");
    assert_eq!(k1.point, "pre_step");
    assert_eq!(k1.model.as_deref(), Some("laya"));
    assert_eq!(k1.candidates, vec!["inspect", "verify"]);
    assert_eq!(
        k1.result,
        ReceiptResult::Pick {
            id: "verify".into(),
            confidence: 0.81
        },
        "selectedProbability wins over confidence"
    );
    assert_eq!(k1.validation, Validation::Accepted);
    assert_eq!(k1.at, "2025-11-30T12:00:00.123Z");
    assert_eq!(
        k1.outcome.as_ref().map(|o| o.status),
        Some(OutcomeStatus::Success)
    );
    assert_eq!(k1.observed_outcome.as_deref(), Some("tests passed"));

    let k2 = by_id(&good, "k2");
    assert_eq!(k2.point, "intake");
    assert_eq!(k2.result, ReceiptResult::Abstain);
    assert_eq!(
        k2.fallback,
        Some(Fallback {
            used: true,
            to: None,
            reason: Some("selector abstained".into())
        })
    );

    let k3 = by_id(&good, "k3");
    assert_eq!(k3.point, "tool_boundary");
    assert_eq!(k3.validation, Validation::RejectedStale);
    assert_eq!(
        k3.result,
        ReceiptResult::Pick {
            id: "t1".into(),
            confidence: 0.99
        }
    );
    assert_eq!(k3.outcome, None);

    let k4 = by_id(&good, "k4");
    assert_eq!(k4.point, "completion");
    assert_eq!(k4.validation, Validation::RejectedUnauthorized);
    assert_eq!(k4.outcome, None, "text matching no pattern stays unknown");
    assert_eq!(
        k4.observed_outcome.as_deref(),
        Some("user closed the window")
    );

    let k5 = by_id(&good, "k5");
    assert_eq!(
        k5.validation,
        Validation::RejectedOutOfSet,
        "an out-of-set pick the host rejected is consistent"
    );
    let k6 = by_id(&good, "k6");
    assert_eq!(k6.validation, Validation::RejectedExpired);
    assert_eq!(
        k6.result,
        ReceiptResult::Pick {
            id: "t1".into(),
            confidence: 0.0
        }
    );
    assert_eq!(
        k6.outcome.as_ref().map(|o| o.status),
        Some(OutcomeStatus::Failure)
    );
}

#[test]
fn bad_records_name_row_field_and_reason_and_keep_their_bytes() {
    let (good, bad, summary, dir) = read_mixed();
    let lines: Vec<&str> = MIXED.lines().collect();
    let expect: &[(u64, &str, &str)] = &[
        (12, "result.confidence", "outside [0, 1]"),
        (13, "validation", "unknown value \"maybe\""),
        (14, "result.id", "not offered"),
        (15, "candidates", "missing"),
        (16, "(line)", "unparsable JSON"),
        (
            17,
            "selectedProbability",
            "needs selectedProbability or confidence",
        ),
        (18, "stage", "unknown value \"postStep\""),
        (19, "selectedProbability", "outside [0, 1]"),
        (20, "at", "not an RFC 3339 time"),
        (21, "outcome.status", "unknown value \"won\""),
    ];
    assert_eq!(bad.len(), expect.len(), "{bad:#?}");
    for (b, (row, field, reason)) in bad.iter().zip(expect) {
        assert_eq!(b.row, *row, "{b}");
        assert_eq!(b.errors.len(), 1, "{b}");
        assert_eq!(b.errors[0].field, *field, "{b}");
        assert!(b.errors[0].reason.contains(reason), "{b}");
        assert!(b.file.ends_with("mixed.jsonl"));
        assert_eq!(
            &*b.raw(),
            lines[*row as usize - 1].as_bytes(),
            "bytes kept exactly"
        );
    }
    assert_eq!(good.len(), 10);
    assert_eq!(summary.records, 20, "the blank line is not a record");
    assert_eq!(summary.bad, 10);
    assert_eq!(summary.contract, 4);
    assert_eq!(summary.keel, 6);
    assert_eq!(
        summary.records,
        summary.bad + summary.contract + summary.keel
    );
    assert_eq!(summary.sha256, sha256_of_files(&summary.files).unwrap());

    // The quarantine holds the bad lines unchanged, in order.
    let q = dir.path().join("thresholds.quarantine.jsonl");
    let mut w = Quarantine::create(&q).unwrap();
    for b in &bad {
        w.add(b).unwrap();
    }
    assert_eq!(w.finish().unwrap(), 10);
    let expected: String = expect
        .iter()
        .map(|(row, _, _)| format!("{}\n", lines[*row as usize - 1]))
        .collect();
    assert_eq!(fs::read_to_string(&q).unwrap(), expected);
}

fn sample() -> Vec<Receipt> {
    let (good, _, _, _d) = read_mixed();
    let mut all = good;
    all.push(Receipt {
        id: "s1".into(),
        at: "2026-11-30T12:00:00Z".into(),
        point: "args".into(),
        model: None,
        candidates: vec!["o1".into(), "o2".into(), "o3".into()],
        result: ReceiptResult::Pick {
            id: "o2".into(),
            confidence: 0.3,
        },
        validation: Validation::Accepted,
        fallback: Some(Fallback {
            used: false,
            to: None,
            reason: None,
        }),
        outcome: Some(Outcome {
            status: OutcomeStatus::Abandoned,
            duration_ms: None,
            retries: Some(0),
        }),
        shadow: Some(Shadow {
            reference: "o1".into(),
        }),
        observed_outcome: None,
    });
    all
}

#[test]
fn jsonl_and_parquet_round_trips_keep_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let all = sample();
    let opts = ReadOptions {
        outcome: patterns(),
        progress: false,
    };
    for name in ["r.parquet", "r.jsonl"] {
        let p = dir.path().join(name);
        assert_eq!(write_receipts(&p, &all).unwrap(), all.len() as u64);
        let (back, bad, s) = read_receipts(&[p], &opts).unwrap();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(back, all, "{name}");
        assert_eq!(s.records, all.len() as u64);
    }
    // a folder of shards reads in name order
    let shards = dir.path().join("shards");
    fs::create_dir(&shards).unwrap();
    write_receipts(shards.join("b.jsonl"), &all[5..]).unwrap();
    write_receipts(shards.join("a.parquet"), &all[..5]).unwrap();
    let (back, _, s) = read_receipts(&[shards], &opts).unwrap();
    assert_eq!(back, all);
    assert_eq!((s.parquet, s.contract), (5, all.len() as u64 - 5));
}

#[test]
fn parquet_bad_rows_are_reported_and_kept_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = sample();
    // The Parquet writer writes what it is given; make row 3 inconsistent and row 5 out of range.
    if let ReceiptResult::Pick { id, .. } = &mut all[2].result {
        *id = "not-offered".into();
    }
    all[2].validation = Validation::Accepted;
    all[4].result = ReceiptResult::Pick {
        id: "inspect".into(),
        confidence: f64::NAN,
    };
    let p = dir.path().join("bad.parquet");
    write_receipts(&p, &all).unwrap();
    let (good, bad, s) = read_receipts(&[p], &ReadOptions::default()).unwrap();
    assert_eq!(good.len(), all.len() - 2);
    assert_eq!(s.bad, 2);
    assert_eq!(
        (bad[0].row, bad[0].errors[0].field.as_str()),
        (3, "result_id")
    );
    assert_eq!(
        (bad[1].row, bad[1].errors[0].field.as_str()),
        (5, "confidence")
    );
    let row: serde_json::Value = serde_json::from_slice(&bad[0].raw()).unwrap();
    assert_eq!(row["id"], all[2].id.as_str());
    assert_eq!(row["result_id"], "not-offered");
    assert_eq!(row["candidates"], serde_json::json!(all[2].candidates));
}

#[test]
fn unknown_extension_and_missing_columns_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.csv");
    fs::write(&p, "id\n").unwrap();
    let e = read_receipts(&[p], &ReadOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("unknown format"), "{e:#}");

    // A Parquet file of receipts' columns but for `validation`: the file is refused, naming it.
    let p = dir.path().join("no-validation.parquet");
    write_receipts(&p, &sample()).unwrap();
    let batch = parquet_batch(&p);
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| batch.schema().field(i).name() != "validation")
        .collect();
    write_batch(&p, &batch.project(&keep).unwrap());
    let e = read_receipts(&[p], &ReadOptions::default()).unwrap_err();
    assert!(
        format!("{e:#}").contains("column `validation` is missing"),
        "{e:#}"
    );
}

fn parquet_batch(path: &std::path::Path) -> arrow_array::RecordBatch {
    let f = fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut batches: Vec<_> = reader.map(Result::unwrap).collect();
    assert_eq!(batches.len(), 1, "a small file reads as one batch");
    batches.remove(0)
}

fn write_batch(path: &std::path::Path, batch: &arrow_array::RecordBatch) {
    write_row_groups(path, batch, None);
}

/// `batch` as a Parquet file written by a plain Arrow writer, in row groups of at most `rows`.
pub(super) fn write_row_groups(
    path: &std::path::Path,
    batch: &arrow_array::RecordBatch,
    rows: Option<usize>,
) {
    let props = rows.map(|n| {
        parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(n))
            .build()
    });
    let f = fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), props).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// The encodings other writers use and the module says it reads: large strings and string
/// views, a large list of candidates, `at` as a timestamp of each unit, a 32-bit float
/// confidence, 32- and 64-bit, signed and unsigned integers, a column of nulls and an absent
/// optional column. Each file must read as the receipts it was made from.
#[test]
fn parquet_reads_the_encodings_other_writers_use() {
    use arrow_array::types::{
        TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
        TimestampSecondType,
    };
    use arrow_array::{
        ArrayRef, Float32Array, Int32Array, Int64Array, LargeListArray, LargeStringArray,
        NullArray, PrimitiveArray, RecordBatch, StringArray, StringViewArray, UInt32Array,
        UInt64Array,
    };
    use std::sync::Arc;

    const NOON: i64 = 1_764_504_000; // 2025-11-30T12:00:00Z
    let dir = tempfile::tempdir().unwrap();
    for (k, unit) in ["s", "ms", "us", "ns"].into_iter().enumerate() {
        // Row 2 is a quarter second later (one second for the second-resolution column).
        let scale = [1, 1_000, 1_000_000, 1_000_000_000][k];
        let later = if k == 0 { scale } else { scale / 4 };
        let times = vec![NOON * scale, NOON * scale + later];
        let at: ArrayRef = match unit {
            "s" => {
                Arc::new(PrimitiveArray::<TimestampSecondType>::from(times).with_timezone("UTC"))
            }
            "ms" => Arc::new(
                PrimitiveArray::<TimestampMillisecondType>::from(times).with_timezone("UTC"),
            ),
            "us" => Arc::new(
                PrimitiveArray::<TimestampMicrosecondType>::from(times).with_timezone("UTC"),
            ),
            _ => Arc::new(PrimitiveArray::<TimestampNanosecondType>::from(times)),
        };
        let values: ArrayRef = Arc::new(LargeStringArray::from(vec!["a", "b", "x"]));
        let candidates = LargeListArray::new(
            Arc::new(arrow_schema::Field::new(
                "item",
                arrow_schema::DataType::LargeUtf8,
                true,
            )),
            arrow_buffer::OffsetBuffer::new(vec![0i64, 2, 3].into()),
            values,
            None,
        );
        let (duration, retries): (ArrayRef, ArrayRef) = if k % 2 == 0 {
            (
                Arc::new(Int32Array::from(vec![Some(1200), None])),
                Arc::new(UInt32Array::from(vec![Some(2), None])),
            )
        } else {
            (
                Arc::new(UInt64Array::from(vec![Some(1200), None])),
                Arc::new(Int64Array::from(vec![Some(2), None])),
            )
        };
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("id", Arc::new(LargeStringArray::from(vec!["p1", "p2"]))),
            ("at", at),
            (
                "point",
                Arc::new(StringViewArray::from(vec!["tool", "route"])),
            ),
            ("candidates", Arc::new(candidates)),
            (
                "result_kind",
                Arc::new(StringArray::from(vec!["pick", "abstain"])),
            ),
            (
                "result_id",
                Arc::new(StringViewArray::from(vec![Some("a"), None])),
            ),
            (
                "confidence",
                Arc::new(Float32Array::from(vec![Some(0.75), None])),
            ),
            (
                "validation",
                Arc::new(LargeStringArray::from(vec!["accepted", "rejected-stale"])),
            ),
            ("fallback_used", Arc::new(NullArray::new(2))),
            (
                "outcome_status",
                Arc::new(StringArray::from(vec![Some("success"), None])),
            ),
            ("outcome_duration_ms", duration),
            ("outcome_retries", retries),
        ];
        let p = dir.path().join(format!("{unit}.parquet"));
        let columns = columns.into_iter().map(|(name, a)| (name, a, true));
        write_batch(
            &p,
            &RecordBatch::try_from_iter_with_nullable(columns).unwrap(),
        );
        let (good, bad, _) = read_receipts(&[p], &ReadOptions::default()).unwrap();
        assert!(bad.is_empty(), "{unit}: {bad:?}");
        let second_at = if k == 0 {
            "2025-11-30T12:00:01Z"
        } else {
            "2025-11-30T12:00:00.250Z"
        };
        let want = vec![
            Receipt {
                id: "p1".into(),
                at: "2025-11-30T12:00:00Z".into(),
                point: "tool".into(),
                model: None,
                candidates: vec!["a".into(), "b".into()],
                result: ReceiptResult::Pick {
                    id: "a".into(),
                    confidence: 0.75,
                },
                validation: Validation::Accepted,
                fallback: None,
                outcome: Some(Outcome {
                    status: OutcomeStatus::Success,
                    duration_ms: Some(1200),
                    retries: Some(2),
                }),
                shadow: None,
                observed_outcome: None,
            },
            Receipt {
                id: "p2".into(),
                at: second_at.into(),
                point: "route".into(),
                model: None,
                candidates: vec!["x".into()],
                result: ReceiptResult::Abstain,
                validation: Validation::RejectedStale,
                fallback: None,
                outcome: None,
                shadow: None,
                observed_outcome: None,
            },
        ];
        assert_eq!(good, want, "{unit}");
    }
}

/// One rule set for both formats: the same bad values are refused with the same reasons,
/// whether a JSON Lines record or a Parquet row carries them.
#[test]
fn json_lines_and_parquet_refuse_the_same_values_alike() {
    let dir = tempfile::tempdir().unwrap();
    let base = sample().into_iter().last().unwrap();
    let mut cases: Vec<(Receipt, &str, &str)> = Vec::new();
    let mut r = base.clone();
    r.id = String::new();
    cases.push((r, "id", "empty"));
    let mut r = base.clone();
    r.at = "yesterday".into();
    cases.push((r, "at", "is not an RFC 3339 time"));
    let mut r = base.clone();
    r.point = "Tool".into();
    cases.push((r, "point", "does not match"));
    let mut r = base.clone();
    r.result = ReceiptResult::Pick {
        id: "o1".into(),
        confidence: 1.5,
    };
    cases.push((r, "confidence", "1.5 is outside [0, 1]"));
    let mut r = base.clone();
    r.result = ReceiptResult::Pick {
        id: "zz".into(),
        confidence: 0.5,
    };
    cases.push((r, "id", "which was not offered"));
    for (i, (r, field, reason)) in cases.iter().enumerate() {
        let mut reasons = Vec::new();
        for ext in ["jsonl", "parquet"] {
            let p = dir.path().join(format!("case{i}.{ext}"));
            write_receipts(&p, std::slice::from_ref(r)).unwrap();
            let (good, bad, _) = read_receipts(&[p], &ReadOptions::default()).unwrap();
            assert!(good.is_empty(), "case {i} {ext}: read as good");
            let e = &bad[0].errors[0];
            assert!(e.field.ends_with(field), "case {i} {ext}: {e:?}");
            assert!(e.reason.contains(reason), "case {i} {ext}: {e:?}");
            reasons.push(e.reason.clone());
        }
        assert_eq!(reasons[0], reasons[1], "case {i}");
    }
}

#[test]
fn jsonl_with_a_byte_order_mark_reads_its_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bom.jsonl");
    let mut bytes = crate::states_io::UTF8_BOM.to_vec();
    bytes.extend(MIXED.as_bytes());
    fs::write(&path, &bytes).unwrap();
    let opts = ReadOptions {
        outcome: patterns(),
        progress: false,
    };
    let (good, bad, _) = read_receipts(&[path], &opts).unwrap();
    let (plain_good, plain_bad, _, _d) = read_mixed();
    assert_eq!(good, plain_good);
    assert_eq!(bad.len(), plain_bad.len());
    assert_eq!(by_id(&good, "c1").point, "tool");
}

/// A writer killed mid-append leaves a last line with no newline that is not JSON: it is
/// skipped with a warning and counted as torn, not as a bad record. The same bytes mid-file, or
/// a complete last line that is bad, stay bad records.
#[test]
fn a_torn_last_line_is_skipped_not_counted_bad() {
    let good = r#"{"id":"c1","at":"2026-11-30T12:00:00Z","point":"tool","candidates":["a","b"],"result":{"kind":"pick","id":"a","confidence":0.93},"validation":"accepted"}"#;
    let torn = r#"{"id":"c2","at":"2026-11-30T12:00:01Z","point":"to"#;
    let dir = tempfile::tempdir().unwrap();
    let read = |name: &str, text: String| {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        let opts = ReadOptions {
            outcome: patterns(),
            progress: false,
        };
        read_receipts(&[path], &opts).unwrap()
    };
    let (g, b, s) = read("torn.jsonl", format!("{good}\n{torn}"));
    assert_eq!((g.len(), b.len(), s.torn, s.records), (1, 0, 1, 1));
    let (g, b, s) = read("middle.jsonl", format!("{torn}\n{good}\n"));
    assert_eq!((g.len(), b.len(), s.torn), (1, 1, 0));
    let (g, b, s) = read("complete.jsonl", format!("{good}\n{torn}\n"));
    assert_eq!((g.len(), b.len(), s.torn), (1, 1, 0));
    // valid JSON without its newline is a record like any other
    let (g, _, s) = read(
        "no-newline.jsonl",
        format!("{good}\n{good}").replace("c1\"", "c9\""),
    );
    assert_eq!((g.len(), s.torn), (2, 0));
}

/// A corrupt file made from `fuzz/corpus/receipts-parquet/receipts-none.parquet` (8 receipts):
/// see fuzz/corpus/receipts-parquet/finding-*.
fn fuzz_finding(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus/receipts-parquet")
        .join(name)
}

/// Found with `decision-fuzz receipts-parquet`: a footer claiming 2^40 rows made `fit` reserve a
/// 37 TB id table up front (an abort). The claim no longer sizes the table; the 8 rows that are
/// there are read.
#[test]
fn a_footer_claiming_2e40_rows_reads_the_rows_there() {
    let path = fuzz_finding("finding-footer-claims-2e40-rows.parquet");
    let mut good = 0;
    let s = for_each_unique_receipt(std::slice::from_ref(&path), &ReadOptions::default(), |r| {
        good += u64::from(r.is_ok());
        Ok(())
    })
    .unwrap();
    assert_eq!((s.records, good), (8, 8));
}

/// Found with the fuzzer on states (the same decoder): a column chunk whose length in the footer
/// is negative (-1 here) panicked inside parquet-rs; now the page check refuses it before the
/// decoder runs, naming the file and the column chunk.
#[test]
fn a_negative_column_length_is_an_error_not_a_panic() {
    let path = fuzz_finding("finding-negative-column-length.parquet");
    let e = for_each_unique_receipt(std::slice::from_ref(&path), &ReadOptions::default(), |_| {
        Ok(())
    })
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("finding-negative-column-length.parquet")
            && e.contains("row group 0, column 0: the footer puts its pages at bytes 4..+-1"),
        "{e}"
    );
}

/// Counts a scan's receipts by point and facts (weights summed), so that two reads can be
/// compared receipt by receipt.
#[derive(Default)]
pub(super) struct Multiset(std::collections::BTreeMap<String, i64>);

impl Tally for Multiset {
    fn add(&mut self, point: &str, facts: &Facts, weight: i64) {
        *self.0.entry(format!("{point} {facts:?}")).or_default() += weight;
    }
    fn merge(&mut self, later: Self) {
        for (k, v) in later.0 {
            *self.0.entry(k).or_default() += v;
        }
    }
}

impl Multiset {
    pub(super) fn nonzero(self) -> std::collections::BTreeMap<String, i64> {
        self.0.into_iter().filter(|(_, v)| *v != 0).collect()
    }
}

/// The parallel scan of `decision fit` against the sequential read: the same unique receipts,
/// the same counts and hash, the same bad records (those met while reading in input order, then
/// the conflicting repeats), whatever the pieces (lines of a few hundred bytes, row groups of
/// three rows), the threads and the spilling of the id check.
#[test]
fn the_parallel_scan_counts_what_the_sequential_read_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mixed = dir.path().join("mixed.jsonl");
    fs::write(&mixed, MIXED).unwrap();
    // the same records again: duplicates, but c1 and k2 changed (conflicts) and a torn last line
    let again = dir.path().join("again.jsonl");
    let changed = MIXED
        .replace("\"confidence\":0.93", "\"confidence\":0.94")
        .replace(
            "\"fallback\":\"selector abstained\"",
            "\"fallback\":\"other\"",
        );
    fs::write(&again, format!("{changed}{{\"id\":\"torn")).unwrap();
    // the sample as Parquet in row groups of three rows, given twice
    let whole = dir.path().join("whole.parquet");
    write_receipts_parquet(&whole, &sample()).unwrap();
    let batch = parquet_batch(&whole);
    let grouped = dir.path().join("grouped.parquet");
    write_row_groups(&grouped, &batch, Some(3));
    let paths = vec![mixed, grouped.clone(), again, grouped];
    let opts = ReadOptions {
        outcome: patterns(),
        progress: false,
    };

    let mut want = Multiset::default();
    let mut want_bad: Vec<(String, u64, String)> = Vec::new();
    let mut conflicts = Vec::new();
    let want_s = for_each_unique_receipt(&paths, &opts, |item| {
        match item {
            Ok(r) => want.add(&r.point, &Facts::of(r), 1),
            Err(b) => {
                let key = (
                    b.file.display().to_string(),
                    b.row,
                    b.errors[0].field.clone(),
                );
                if b.errors[0].reason.contains("different body") {
                    conflicts.push(key);
                } else {
                    want_bad.push(key);
                }
            }
        }
        Ok(())
    })
    .unwrap();
    assert!(
        want_s.duplicates > 10 && conflicts.len() == 2,
        "{want_s:?} {conflicts:?}"
    );
    assert_eq!(want_s.torn, 1);
    want_bad.extend(conflicts);
    let want = want.nonzero();

    let inputs: Vec<Input> = paths.iter().cloned().map(Input::local).collect();
    for (threads, per_part, line_bytes) in [(1, 4096, 4 << 20), (3, 1, 300), (2, 2, 1)] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut got_bad = Vec::new();
        let (got, s) = pool
            .install(|| {
                scan::scan_with(
                    &inputs,
                    &opts,
                    &Multiset::default,
                    &mut |b| {
                        got_bad.push((
                            b.file.display().to_string(),
                            b.row,
                            b.errors[0].field.clone(),
                        ));
                        Ok(())
                    },
                    dedup::SpilledIds::with_buffer(per_part),
                    line_bytes,
                )
            })
            .unwrap();
        let case =
            format!("{threads} threads, {per_part} ids per partition, {line_bytes} B pieces");
        assert_eq!(got.nonzero(), want, "{case}");
        assert_eq!(s, want_s, "{case}");
        assert_eq!(got_bad, want_bad, "{case}");
    }
}
