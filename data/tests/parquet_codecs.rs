//! Parquet as other tools write it (issue 19): the decision-states and receipts readers read
//! every codec pyarrow writes (uncompressed, snappy, gzip, brotli, lz4, zstd), in data page v1
//! and v2, across several row groups. The fixtures and the values they must read back as come
//! from pyarrow (scripts/make_parquet_fixtures.py, version in scripts/requirements-parquet.txt).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use decision_data::receipts_io::{ReadOptions, read_receipts};
use decision_data::{Receipt, ReceiptResult, ValidateOptions, read_states};
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::{Map, Value, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data/codecs")
}

fn expected() -> Value {
    serde_json::from_str(&fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap()
}

/// The codecs the file's column chunks declare, as parquet-rs names them (`SNAPPY`, `GZIP`, ...).
fn codecs(path: &Path) -> BTreeSet<String> {
    let r = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    let md = r.metadata();
    let mut out = BTreeSet::new();
    for g in md.row_groups() {
        for c in g.columns() {
            let name = format!("{:?}", c.compression());
            out.insert(name.split('(').next().unwrap().to_string());
        }
    }
    out
}

/// pyarrow's codec names for what parquet-rs calls them: pyarrow's `lz4` is the LZ4_RAW codec
/// (pyarrow writes the legacy, Hadoop-framed LZ4 not at all).
fn parquet_rs_name(pyarrow: &str) -> &str {
    match pyarrow {
        "LZ4" => "LZ4_RAW",
        other => other,
    }
}

/// A JSON object without its null members (serde skips absent optional fields).
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), without_nulls(x)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        x => x.clone(),
    }
}

/// A receipt in the flattened columns of contracts section 3.
fn flat(r: &Receipt) -> Value {
    let (kind, id, confidence) = match &r.result {
        ReceiptResult::Pick { id, confidence } => ("pick", json!(id), json!(confidence)),
        ReceiptResult::Abstain => ("abstain", Value::Null, Value::Null),
    };
    let f = r.fallback.as_ref();
    let o = r.outcome.as_ref();
    json!({
        "id": r.id, "at": r.at, "point": r.point, "model": r.model,
        "candidates": r.candidates, "result_kind": kind, "result_id": id,
        "confidence": confidence, "validation": r.validation.as_str(),
        "fallback_used": f.map(|f| f.used), "fallback_to": f.and_then(|f| f.to.clone()),
        "fallback_reason": f.and_then(|f| f.reason.clone()),
        "outcome_status": o.map(|o| o.status.as_str()),
        "outcome_duration_ms": o.and_then(|o| o.duration_ms),
        "outcome_retries": o.and_then(|o| o.retries),
        "shadow_reference": r.shadow.as_ref().map(|s| s.reference.clone()),
        "observed_outcome": r.observed_outcome,
    })
}

#[test]
fn every_fixture_is_listed_and_every_codec_is_covered() {
    let e = expected();
    let listed: BTreeSet<String> = e["files"].as_object().unwrap().keys().cloned().collect();
    let on_disk: BTreeSet<String> = fs::read_dir(fixtures())
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".parquet"))
        .collect();
    assert_eq!(listed, on_disk);
    let mut covered = BTreeSet::new();
    for (name, f) in e["files"].as_object().unwrap() {
        let declared: BTreeSet<String> = f["codec"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| parquet_rs_name(c.as_str().unwrap()).to_string())
            .collect();
        assert_eq!(codecs(&fixtures().join(name)), declared, "{name}");
        covered.extend(declared);
    }
    let want: BTreeSet<String> = [
        "UNCOMPRESSED",
        "SNAPPY",
        "GZIP",
        "BROTLI",
        "LZ4_RAW",
        "ZSTD",
    ]
    .map(String::from)
    .into();
    assert_eq!(covered, want);
}

#[test]
fn states_in_every_codec_read_as_pyarrow_wrote_them() {
    let e = expected();
    let want: Vec<Value> = e["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(without_nulls)
        .collect();
    assert_eq!(want.len(), 7);
    let mut n = 0;
    for (name, f) in e["files"].as_object().unwrap() {
        if f["kind"] != "states" {
            continue;
        }
        assert!(f["row_groups"].as_u64().unwrap() > 1, "{name}");
        let got = read_states(&[fixtures().join(name)], ValidateOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let got: Vec<Value> = got
            .iter()
            .map(|s| serde_json::to_value(s).unwrap())
            .collect();
        assert_eq!(got, want, "{name}");
        n += 1;
    }
    assert_eq!(n, 6, "one states file per codec");
}

#[test]
fn receipts_in_every_codec_read_as_pyarrow_wrote_them() {
    let e = expected();
    let want = e["receipts"].as_array().unwrap();
    assert_eq!(want.len(), 8);
    let mut n = 0;
    for (name, f) in e["files"].as_object().unwrap() {
        if f["kind"] != "receipts" {
            continue;
        }
        let (good, bad, summary) = read_receipts(&[fixtures().join(name)], &ReadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(
            bad.is_empty(),
            "{name}: {:?}",
            bad.iter().map(|b| b.to_string()).collect::<Vec<_>>()
        );
        assert_eq!((summary.records, summary.parquet), (8, 8), "{name}");
        let got: Vec<Value> = good.iter().map(flat).collect();
        assert_eq!(&got, want, "{name}");
        n += 1;
    }
    assert_eq!(n, 6, "one receipts file per codec");
}
