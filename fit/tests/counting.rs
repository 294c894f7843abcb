//! Counting honestly (issue 19): each receipt id counts once however often the input holds it
//! (the same file twice, overlapping folders, a receipt in two shards, JSON Lines and Parquet);
//! the same id with another body is a bad record; an input without a valid receipt is an error
//! that writes nothing; every output is checked before the read and published together, last.

use std::fs;
use std::path::{Path, PathBuf};

use decision_data::Receipt;
use decision_data::receipts_io::write_receipts;
use decision_fit::policy::Status;
use decision_fit::{FitArgs, fit};
use serde_json::{Value, json};

fn line(id: &str, point: &str, conf: f64, outcome: &str) -> String {
    json!({
        "id": id, "at": "2026-11-30T12:00:00Z", "point": point, "candidates": ["a", "b"],
        "result": {"kind": "pick", "id": "a", "confidence": conf}, "validation": "accepted",
        "outcome": {"status": outcome},
    })
    .to_string()
}

fn write_lines(path: &Path, lines: &[String]) -> PathBuf {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, lines.join("\n") + "\n").unwrap();
    path.to_path_buf()
}

/// 10 successes at 0.95 for `tool`: below min_count 30 once, a fitted 0.9 when counted 4 times.
fn ten(prefix: &str) -> Vec<String> {
    (0..10)
        .map(|i| line(&format!("{prefix}{i}"), "tool", 0.95, "success"))
        .collect()
}

fn config(dir: &Path) -> PathBuf {
    let p = dir.join("fit.toml");
    fs::write(
        &p,
        "[defaults]\nbound = \"none\"\ntarget = 0.9\nmin_count = 30\n",
    )
    .unwrap();
    p
}

fn args(receipts: Vec<PathBuf>, config: PathBuf, out: PathBuf) -> FitArgs {
    FitArgs {
        receipts,
        config,
        out,
        previous: None,
        report: None,
    }
}

/// Every name in `dir` (recursively), relative to it, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_same_receipts_given_four_times_count_once() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path());
    let r = write_lines(&d.path().join("in/r.jsonl"), &ten("t"));
    let out = d.path().join("t.json");

    let once = fit(&args(vec![r.clone()], cfg.clone(), out.clone())).unwrap();
    let tool = &once.thresholds.points["tool"];
    assert_eq!((tool.status, tool.judged), (Status::InsufficientData, 10));

    // the same file four times
    let four = fit(&args(vec![r.clone(); 4], cfg.clone(), out.clone())).unwrap();
    let t = &four.thresholds;
    let tool = &t.points["tool"];
    assert_eq!(
        (tool.status, tool.threshold, tool.judged),
        (Status::InsufficientData, None, 10),
        "four copies of 10 receipts are still 10 receipts"
    );
    assert_eq!(
        (
            t.source.records,
            t.source.duplicates,
            t.source.bad,
            t.source.valid
        ),
        (40, 30, 0, 10)
    );
    let w: Value = serde_json::from_str(&fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(w["source"]["duplicates"], 30);
    assert_eq!(w["source"]["records"], 40);
    assert_eq!(w["source"]["valid"], 10);

    // overlapping folders, and the receipts again in a Parquet shard: the same bodies across
    // both readers are recognised as copies
    let receipts: Vec<Receipt> = ten("t")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let inner = d.path().join("in/month");
    fs::create_dir_all(&inner).unwrap();
    fs::copy(&r, inner.join("a.jsonl")).unwrap();
    write_receipts(inner.join("b.parquet"), &receipts).unwrap();
    // plus 25 new ones in the inner folder: 35 distinct ids in all
    let mut more = ten("t");
    more.extend((0..25).map(|i| line(&format!("n{i}"), "tool", 0.95, "success")));
    write_lines(&inner.join("c.jsonl"), &more);
    let got = fit(&args(
        vec![d.path().join("in"), inner.clone(), r.clone()],
        cfg.clone(),
        out.clone(),
    ))
    .unwrap();
    let t = &got.thresholds;
    // in/ with its subfolder: month/a.jsonl (10), month/b.parquet (10), month/c.jsonl (35),
    // r.jsonl (10); in/month again: a, b, c (55); in/r.jsonl (10)
    assert_eq!(t.source.files.len(), 8);
    assert_eq!(
        (t.source.records, t.source.duplicates, t.source.valid),
        (130, 95, 35)
    );
    let tool = &t.points["tool"];
    assert_eq!(
        (tool.status, tool.threshold, tool.judged),
        (Status::Fitted, Some(0.9), 35)
    );
}

#[test]
fn a_duplicate_id_with_another_body_is_a_bad_record() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path());
    let first = write_lines(&d.path().join("a.jsonl"), &ten("t"));
    let mut second = vec![
        line("x1", "tool", 0.95, "success"),
        // t3 again, but a failure: not the same receipt
        line("t3", "tool", 0.95, "failure"),
        // t4 again, unchanged: a plain duplicate
        line("t4", "tool", 0.95, "success"),
    ];
    second.push(line("t5", "args", 0.95, "success"));
    let second_path = write_lines(&d.path().join("b.jsonl"), &second);
    let out = d.path().join("t.json");
    let got = fit(&args(vec![first, second_path.clone()], cfg, out.clone())).unwrap();
    let t = &got.thresholds;
    assert_eq!(
        (
            t.source.records,
            t.source.bad,
            t.source.duplicates,
            t.source.valid
        ),
        (14, 2, 1, 11)
    );
    assert_eq!(t.points["tool"].judged, 11, "the first t3 is counted");
    assert_eq!(t.points["tool"].counts.judged, 11);
    assert!(
        !t.points.contains_key("args"),
        "the second t5 is not counted"
    );

    // quarantined byte for byte, and named like any other bad record: file, row, field
    let q = fs::read_to_string(d.path().join("t.quarantine.jsonl")).unwrap();
    assert_eq!(q, format!("{}\n{}\n", second[1], second[3]));
    let errors: Vec<Value> = fs::read_to_string(d.path().join("t.quarantine.errors.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["file"], second_path.display().to_string());
    assert_eq!(
        (errors[0]["row"].clone(), errors[1]["row"].clone()),
        (json!(2), json!(4))
    );
    assert_eq!(errors[0]["field"], "id");
    let reason = errors[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("\"t3\"") && reason.contains("different body"),
        "{reason}"
    );
    assert!(
        got.bad_lines[0].contains("b.jsonl row 2: id: duplicate id"),
        "{:?}",
        got.bad_lines
    );
}

#[test]
fn an_input_without_a_valid_receipt_is_an_error_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path());
    let empty = d.path().join("empty.jsonl");
    fs::write(&empty, "").unwrap();
    let blank = d.path().join("blank.jsonl");
    fs::write(&blank, "\n  \n\n").unwrap();
    let bad = write_lines(
        &d.path().join("bad.jsonl"),
        &[
            "not json".to_string(),
            line("b1", "tool", 1.5, "success"),
            line("b2", "Tool", 0.5, "success"),
        ],
    );
    let before = listing(d.path());
    for (input, what) in [
        (&empty, "no receipts at all"),
        (&blank, "no receipts at all"),
        (&bad, "3 records, every one bad"),
    ] {
        let out = d.path().join("out/t.json");
        let mut a = args(vec![input.clone()], cfg.clone(), out.clone());
        a.report = Some(d.path().join("report"));
        let e = format!("{:#}", fit(&a).err().expect("no valid receipt is an error"));
        assert!(
            e.contains("no valid receipts")
                && e.contains(what)
                && e.contains("nothing was written"),
            "{e}"
        );
        assert!(
            e.contains(&input.display().to_string()),
            "names the input: {e}"
        );
        assert_eq!(
            listing(d.path()),
            before,
            "{}: no thresholds, quarantine, report, temporary file or folder left",
            input.display()
        );
    }
    // the bad records are shown, named by file and row
    let e = format!(
        "{:#}",
        fit(&args(
            vec![bad.clone()],
            cfg.clone(),
            d.path().join("t.json")
        ))
        .err()
        .unwrap()
    );
    assert!(e.contains("bad.jsonl row 2: result.confidence"), "{e}");
    // and an existing thresholds.json stays as it was
    let out = d.path().join("t.json");
    fs::write(&out, "old").unwrap();
    assert!(fit(&args(vec![empty], cfg, out.clone())).is_err());
    assert_eq!(fs::read_to_string(&out).unwrap(), "old");
}

#[test]
fn an_unwritable_report_folder_stops_the_fit_before_the_read_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path());
    // not Parquet at all: reading it fails, so an error about the report proves the report was
    // checked first
    let corrupt = d.path().join("corrupt.parquet");
    fs::write(&corrupt, b"PAR1 not really").unwrap();
    let good = write_lines(&d.path().join("r.jsonl"), &ten("t"));
    fs::create_dir(d.path().join("in")).unwrap();
    let blocker = d.path().join("blocker");
    fs::write(&blocker, "a file, not a folder").unwrap();
    let out = d.path().join("t.json");
    fs::write(&out, "old thresholds").unwrap();
    let before = listing(d.path());

    let mut a = args(vec![corrupt.clone()], cfg.clone(), out.clone());
    a.report = Some(blocker.join("report"));
    let e = format!("{:#}", fit(&a).err().unwrap());
    assert!(
        e.contains("blocker"),
        "the report folder is refused first: {e}"
    );

    // with readable receipts: still refused, thresholds.json untouched, nothing left behind
    let mut a = args(vec![good.clone()], cfg.clone(), out.clone());
    a.report = Some(blocker.join("report"));
    let e = format!("{:#}", fit(&a).err().unwrap());
    assert!(e.contains("blocker"), "{e}");
    assert_eq!(fs::read_to_string(&out).unwrap(), "old thresholds");
    assert_eq!(listing(d.path()), before);

    // --out naming a folder: refused before the read too
    let e = format!(
        "{:#}",
        fit(&args(
            vec![corrupt.clone()],
            cfg.clone(),
            d.path().join("in")
        ))
        .err()
        .unwrap()
    );
    assert!(e.contains("is a folder"), "{e}");
    assert_eq!(listing(d.path()), before);

    // an --out in folders that do not exist yet: made for the run, removed again when it fails
    let mut a = args(
        vec![good.clone()],
        cfg.clone(),
        d.path().join("new/deep/t.json"),
    );
    a.report = Some(blocker.join("report"));
    assert!(fit(&a).is_err());
    assert_eq!(listing(d.path()), before);

    // and when everything can be written, everything is, folders included
    let mut a = args(vec![good], cfg, d.path().join("new/deep/t.json"));
    a.report = Some(d.path().join("new/report"));
    fit(&a).unwrap();
    for f in [
        "new/deep/t.json",
        "new/deep/t.quarantine.jsonl",
        "new/deep/t.quarantine.errors.jsonl",
        "new/report/report.md",
        "new/report/report.html",
    ] {
        assert!(d.path().join(f).is_file(), "{f}");
    }
    let md = fs::read_to_string(d.path().join("new/report/report.md")).unwrap();
    assert!(
        md.contains("10 records, 0 bad, 0 duplicates dropped"),
        "{md}"
    );
    assert!(
        !listing(d.path()).iter().any(|n| n.contains(".tmp-")),
        "no temporary file left: {:?}",
        listing(d.path())
    );
}
