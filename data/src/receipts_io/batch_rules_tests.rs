//! The column-wise rules (`batch_rules.rs`) against the row-wise ones (`Flat::fill`, the
//! reference): on random rows, bad in every way the rules know, in every encoding the readers
//! take, a row the column-wise rules accept must be one the row-wise rules accept, with the same
//! point and facts; and they must accept nearly all the good rows (else the fast path is not
//! the path). Then a whole `decision fit` scan of such rows as Parquet against the sequential
//! row-wise read: the same counts, bad rows (field, reason and bytes) and hash.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::types::{Int8Type, Int32Type, UInt16Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float32Array, Float64Array, Int32Array,
    Int64Array, LargeListArray, LargeStringArray, ListArray, PrimitiveArray, RecordBatch,
    StringArray, StringViewArray, TimestampMillisecondArray, UInt32Array,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::Field;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::batch_rules::BatchRules;
use super::columns::{Cols, empty_receipt, fill};
use super::scan::{self, Facts, Input, Tally};
use super::tests::{Multiset, write_row_groups};
use super::*;

/// One row's values as a writer may leave them (any of them bad or absent).
#[derive(Clone, Debug)]
struct Raw {
    id: Option<String>,
    at: Option<String>,
    /// `at` as milliseconds, for the timestamp encoding.
    at_ms: Option<i64>,
    point: Option<String>,
    model: Option<String>,
    candidates: Option<Vec<Option<String>>>,
    kind: Option<String>,
    result_id: Option<String>,
    confidence: Option<f64>,
    validation: Option<String>,
    fallback_used: Option<bool>,
    fallback_to: Option<String>,
    fallback_reason: Option<String>,
    status: Option<String>,
    duration_ms: Option<i64>,
    retries: Option<i64>,
    shadow: Option<String>,
    observed: Option<String>,
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [(u32, T)]) -> &'a T {
    let total: u32 = items.iter().map(|(w, _)| w).sum();
    let mut x = rng.random_range(0..total);
    for (w, v) in items {
        if x < *w {
            return v;
        }
        x -= w;
    }
    unreachable!()
}

fn s(x: &str) -> Option<String> {
    Some(x.to_string())
}

/// Mostly good rows; every field is now and then absent or bad in one of the ways the rules
/// refuse, or in a way only the full rules decide (an `at` chrono accepts in a form the fast
/// check does not know).
fn random_rows(n: usize, seed: u64) -> Vec<Raw> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let id = pick(
                &mut rng,
                &[(96, Some(format!("r{i}"))), (2, None), (2, s(""))],
            )
            .clone();
            let sec = rng.random_range(0..60);
            let at = pick(
                &mut rng,
                &[
                    (85, Some(format!("2026-11-30T12:00:{sec:02}Z"))),
                    (4, Some(format!("2026-11-30T12:00:{sec:02}.25+01:00"))),
                    (3, s("2026-11-30t12:00:00z")),
                    (2, s("2026-11-30 12:00:00Z")),
                    (2, s("yesterday")),
                    (2, s("2026-02-30T00:00:00Z")),
                    (2, None),
                ],
            )
            .clone();
            let at_ms = *pick(
                &mut rng,
                &[
                    (95, Some(1_764_504_000_000 + i as i64)),
                    (3, None),
                    (2, Some(i64::MAX)),
                ],
            );
            let point = pick(
                &mut rng,
                &[
                    (30, s("tool")),
                    (30, s("args")),
                    (20, s("route")),
                    (12, s("stop_2")),
                    (2, s("Tool")),
                    (2, s("2x")),
                    (2, s("")),
                    (2, None),
                ],
            )
            .clone();
            let pool = ["a", "b", "c", "tool-0", "x y", "<|im_end|>"];
            let candidates = match rng.random_range(0..100) {
                0..=1 => None,
                2..=3 => Some(vec![s("a"), None]),
                _ => {
                    let k = rng.random_range(1..=4);
                    Some((0..k).map(|j| s(pool[(i + j * 7) % pool.len()])).collect())
                }
            };
            let offered: Vec<String> = candidates.iter().flatten().flatten().cloned().collect();
            let kind = pick(
                &mut rng,
                &[
                    (75, s("pick")),
                    (19, s("abstain")),
                    (3, s("maybe")),
                    (3, None),
                ],
            )
            .clone();
            let result_id = match rng.random_range(0..100) {
                0..=84 if !offered.is_empty() => {
                    Some(offered[rng.random_range(0..offered.len())].clone())
                }
                85..=92 => s("ghost"),
                _ => None,
            };
            let confidence = match rng.random_range(0..100) {
                0..=2 => None,
                3 => Some(f64::NAN),
                4 => Some(1.5),
                5 => Some(-0.1),
                6 => Some(f64::INFINITY),
                7 => Some(1.0),
                8 => Some(0.0),
                9 => Some(-0.0),
                _ => Some(f64::from(rng.random_range(0..1_000_000u32)) / 999_999.0),
            };
            let validation = pick(
                &mut rng,
                &[
                    (70, s("accepted")),
                    (7, s("rejected-out-of-set")),
                    (6, s("rejected-stale")),
                    (6, s("rejected-expired")),
                    (5, s("rejected-unauthorized")),
                    (4, s("rejected-gate")),
                    (3, s("maybe")),
                    (3, None),
                ],
            )
            .clone();
            let fallback_used = *pick(&mut rng, &[(70, None), (15, Some(true)), (15, Some(false))]);
            let fallback_to =
                fallback_used.and_then(|_| pick(&mut rng, &[(1, s("x")), (1, None)]).clone());
            let fallback_reason = pick(
                &mut rng,
                &[
                    (4, s("auth failed")),
                    (2, s("Selector abstained; host scored the 0G catalog")),
                    (1, s("selector_abstained")),
                    (4, None),
                ],
            )
            .clone();
            // a reason without `fallback_used` is no fallback (the row-wise rules build none)
            let status = pick(
                &mut rng,
                &[
                    (40, None),
                    (25, s("success")),
                    (20, s("failure")),
                    (10, s("abandoned")),
                    (5, s("won")),
                ],
            )
            .clone();
            let duration_ms = *pick(&mut rng, &[(50, None), (45, Some(1200)), (5, Some(-5))]);
            let retries = *pick(
                &mut rng,
                &[
                    (50, None),
                    (45, Some(2)),
                    (3, Some(-1)),
                    (2, Some(5_000_000_000)),
                ],
            );
            let shadow = match rng.random_range(0..10) {
                0..=5 => None,
                6..=7 => result_id.clone(),
                _ => s(pool[rng.random_range(0..pool.len())]),
            };
            let observed = pick(
                &mut rng,
                &[
                    (70, None),
                    (10, s("tests passed")),
                    (10, s("task failed: timeout")),
                    (10, s("user closed the window")),
                ],
            )
            .clone();
            let model = pick(
                &mut rng,
                &[(3, s("laya")), (3, s("jev")), (2, s("host")), (3, None)],
            )
            .clone();
            Raw {
                id,
                at,
                at_ms,
                point,
                model,
                candidates,
                kind,
                result_id,
                confidence,
                validation,
                fallback_used,
                fallback_to,
                fallback_reason,
                status,
                duration_ms,
                retries,
                shadow,
                observed,
            }
        })
        .collect()
}

/// How a batch's columns are encoded.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Encoding {
    /// Plain strings and lists, 64-bit numbers: what other writers leave.
    Plain,
    /// 32-bit dictionaries whose values repeat and hold a null (rows point at either copy).
    Dictionary,
    /// 8- and 16-bit dictionaries of large strings, large lists, `at` as a timestamp.
    NarrowKeys,
    /// String views, a 32-bit float confidence, 32-bit integers.
    Views,
}

/// A dictionary column of `rows` with keys of type `K`: each text is in the dictionary twice
/// (rows alternate between the copies), and a null value stands for every other null row.
fn dictionary<K: arrow_array::types::ArrowDictionaryKeyType>(
    rows: &[Option<&str>],
    large: bool,
) -> ArrayRef
where
    K::Native: TryFrom<usize>,
{
    let mut values: Vec<Option<&str>> = vec![None];
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut flip = false;
    let key = |k: usize| K::Native::try_from(k).ok().expect("few values");
    let keys: Vec<Option<K::Native>> = rows
        .iter()
        .map(|r| {
            flip = !flip;
            match r {
                None if flip => None,
                None => Some(key(0)),
                Some(t) => {
                    let first = *at.entry(t).or_insert_with(|| {
                        values.push(Some(t));
                        values.push(Some(t));
                        values.len() - 2
                    });
                    Some(key(first + usize::from(flip)))
                }
            }
        })
        .collect();
    let values: ArrayRef = if large {
        Arc::new(LargeStringArray::from(values))
    } else {
        Arc::new(StringArray::from(values))
    };
    Arc::new(
        DictionaryArray::<K>::try_new(keys.into_iter().collect::<PrimitiveArray<K>>(), values)
            .unwrap(),
    )
}

fn strings(rows: &[Option<&str>], enc: Encoding, low_cardinality: bool) -> ArrayRef {
    match (enc, low_cardinality) {
        (Encoding::Dictionary, true) => dictionary::<Int32Type>(rows, false),
        (Encoding::NarrowKeys, true) => dictionary::<Int8Type>(rows, true),
        (Encoding::NarrowKeys, false) => Arc::new(LargeStringArray::from(rows.to_vec())),
        (Encoding::Views, _) => Arc::new(StringViewArray::from(rows.to_vec())),
        _ => Arc::new(StringArray::from(rows.to_vec())),
    }
}

fn batch_of(rows: &[Raw], enc: Encoding) -> RecordBatch {
    let col = |f: fn(&Raw) -> Option<&str>| rows.iter().map(f).collect::<Vec<_>>();
    let low = |f: fn(&Raw) -> Option<&str>| strings(&col(f), enc, true);
    let high = |f: fn(&Raw) -> Option<&str>| strings(&col(f), enc, false);
    let at: ArrayRef = match enc {
        Encoding::NarrowKeys => Arc::new(
            TimestampMillisecondArray::from(rows.iter().map(|r| r.at_ms).collect::<Vec<_>>())
                .with_timezone("UTC"),
        ),
        _ => high(|r| r.at.as_deref()),
    };
    // the candidates: one list per row over all rows' items
    let mut offsets = vec![0usize];
    let mut items: Vec<Option<&str>> = Vec::new();
    let mut valid = Vec::new();
    for r in rows {
        if let Some(c) = &r.candidates {
            items.extend(c.iter().map(Option::as_deref));
        }
        offsets.push(items.len());
        valid.push(r.candidates.is_some());
    }
    let nulls = Some(arrow_buffer::NullBuffer::from(valid));
    let item_array = match enc {
        Encoding::NarrowKeys => dictionary::<UInt16Type>(&items, false),
        _ => strings(&items, enc, true),
    };
    let item_field = Arc::new(Field::new("item", item_array.data_type().clone(), true));
    let candidates: ArrayRef = match enc {
        Encoding::NarrowKeys => Arc::new(LargeListArray::new(
            item_field,
            OffsetBuffer::new(offsets.iter().map(|&o| o as i64).collect::<Vec<_>>().into()),
            item_array,
            nulls,
        )),
        _ => Arc::new(ListArray::new(
            item_field,
            OffsetBuffer::new(offsets.iter().map(|&o| o as i32).collect::<Vec<_>>().into()),
            item_array,
            nulls,
        )),
    };
    let confidence: ArrayRef = match enc {
        Encoding::Views => Arc::new(Float32Array::from(
            rows.iter()
                .map(|r| r.confidence.map(|c| c as f32))
                .collect::<Vec<_>>(),
        )),
        _ => Arc::new(Float64Array::from(
            rows.iter().map(|r| r.confidence).collect::<Vec<_>>(),
        )),
    };
    let (duration, retries): (ArrayRef, ArrayRef) = match enc {
        Encoding::Views => (
            Arc::new(Int32Array::from(
                rows.iter()
                    .map(|r| r.duration_ms.map(|d| d as i32))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(UInt32Array::from(
                rows.iter()
                    .map(|r| r.retries.and_then(|d| u32::try_from(d).ok()))
                    .collect::<Vec<_>>(),
            )),
        ),
        _ => (
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.duration_ms).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.retries).collect::<Vec<_>>(),
            )),
        ),
    };
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", high(|r| r.id.as_deref())),
        ("at", at),
        ("point", low(|r| r.point.as_deref())),
        ("model", low(|r| r.model.as_deref())),
        ("candidates", candidates),
        ("result_kind", low(|r| r.kind.as_deref())),
        ("result_id", low(|r| r.result_id.as_deref())),
        ("confidence", confidence),
        ("validation", low(|r| r.validation.as_deref())),
        (
            "fallback_used",
            Arc::new(BooleanArray::from(
                rows.iter().map(|r| r.fallback_used).collect::<Vec<_>>(),
            )),
        ),
        ("fallback_to", low(|r| r.fallback_to.as_deref())),
        ("fallback_reason", low(|r| r.fallback_reason.as_deref())),
        ("outcome_status", low(|r| r.status.as_deref())),
        ("outcome_duration_ms", duration),
        ("outcome_retries", retries),
        ("shadow_reference", low(|r| r.shadow.as_deref())),
        ("observed_outcome", low(|r| r.observed.as_deref())),
    ];
    RecordBatch::try_from_iter_with_nullable(columns.into_iter().map(|(n, a)| (n, a, true)))
        .unwrap()
}

fn patterns() -> OutcomePatterns {
    OutcomePatterns::new(&["^tests passed"], &["^task failed"]).unwrap()
}

/// Every row the column-wise rules accept, the row-wise rules accept with the same point and
/// facts; and the column-wise rules accept all the good rows but those whose `at` only
/// chrono's parser decides.
#[test]
fn the_column_wise_rules_accept_only_what_the_row_wise_rules_accept() {
    let rows = random_rows(4000, 11);
    let path = std::path::Path::new("memory");
    let patterns = patterns();
    for enc in [
        Encoding::Plain,
        Encoding::Dictionary,
        Encoding::NarrowKeys,
        Encoding::Views,
    ] {
        let batch = batch_of(&rows, enc);
        let rules = BatchRules::new(&batch, path, &patterns).unwrap();
        let cols = Cols::new(&batch, path).unwrap();
        let (mut r, mut buf) = (empty_receipt(), String::new());
        let (mut good, mut fast, mut left, mut bad) = (0, 0, 0, 0);
        let (mut by_model, mut by_reason) = (0, 0);
        for (i, row) in rows.iter().enumerate() {
            let slow = fill(&cols, i, &mut r, &mut buf, &patterns);
            match (rules.eval(i), slow) {
                (Some((p, facts)), Ok(())) => {
                    assert_eq!(rules.points[p as usize], r.point, "{enc:?} row {i}");
                    assert_eq!(facts, Facts::of(&r), "{enc:?} row {i}: {row:?}");
                    if facts.host_scored {
                        if r.model.as_deref() == Some("host") {
                            by_model += 1;
                        } else {
                            by_reason += 1;
                        }
                    }
                    good += 1;
                    fast += 1;
                }
                (Some(_), Err(e)) => {
                    panic!("{enc:?} row {i}: accepted, but the row-wise rules say {e:?}: {row:?}")
                }
                (None, Ok(())) => {
                    good += 1;
                    // only a time in a form the fast check leaves to chrono
                    let plain = enc == Encoding::NarrowKeys
                        || ["Z", ":00"]
                            .iter()
                            .any(|end| r.at.ends_with(end) && r.at.as_bytes()[10] == b'T');
                    if plain {
                        left += 1;
                    }
                }
                (None, Err(_)) => {
                    bad += 1;
                    r = empty_receipt();
                }
            }
        }
        assert_eq!(
            left, 0,
            "{enc:?}: good rows in the plain form left to the row-wise rules"
        );
        assert!(
            fast > good * 9 / 10 && bad > 1000,
            "{enc:?}: {fast} of {good} good rows accepted column-wise, {bad} bad"
        );
        // both of the host's marks are met, each on its own, among the rows read column-wise
        assert!(
            by_model > 50 && by_reason > 50,
            "{enc:?}: host-scored picks by model {by_model}, by fallback reason {by_reason}"
        );
    }
}

/// `decision fit`'s scan (column-wise, row groups read ahead and hashed in order) against the
/// sequential row-wise read, on random rows written as Parquet by a plain Arrow writer in row
/// groups of 97 rows (and again, so that every id repeats): the same receipts, the same summary
/// and hash, the same bad rows with the same field, reason and bytes.
#[test]
fn the_column_wise_scan_reads_parquet_as_the_row_wise_read_does() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(3000, 12);
    let mut paths = Vec::new();
    for (k, enc) in [Encoding::Plain, Encoding::Dictionary]
        .into_iter()
        .enumerate()
    {
        let path = dir.path().join(format!("{k}.parquet"));
        write_row_groups(&path, &batch_of(&rows, enc), Some(97));
        paths.push(path);
    }
    let opts = ReadOptions {
        outcome: patterns(),
        progress: false,
    };
    type BadKey = (String, u64, String, String, Vec<u8>);
    let key = |b: &BadRow| -> BadKey {
        (
            b.file.display().to_string(),
            b.row,
            b.errors[0].field.clone(),
            b.errors[0].reason.clone(),
            b.raw().to_vec(),
        )
    };
    let mut want = Multiset::default();
    let mut want_bad = Vec::new();
    let want_s = for_each_unique_receipt(&paths, &opts, |item| {
        match item {
            Ok(r) => want.add(&r.point, &Facts::of(r), 1),
            Err(b) => want_bad.push(key(b)),
        }
        Ok(())
    })
    .unwrap();
    assert!(want_s.bad > 1000 && want_s.duplicates > 500, "{want_s:?}");
    let inputs: Vec<Input> = paths.iter().cloned().map(Input::local).collect();
    let mut got_bad = Vec::new();
    let (got, got_s) = scan::scan_unique_receipts(&inputs, &opts, &Multiset::default, &mut |b| {
        got_bad.push(key(b));
        Ok(())
    })
    .unwrap();
    assert_eq!(got.nonzero(), want.nonzero());
    assert_eq!(got_s, want_s);
    // the scan reports the repeats with another body after the rest; the same set
    want_bad.sort();
    got_bad.sort();
    assert_eq!(got_bad, want_bad);
}
