//! `decision eval` from the command line: what it measures and what its shadow receipts say
//! when states have no answer, when a prompt is over `max_tokens`, and which split it names.

use std::path::{Path, PathBuf};
use std::process::Output;

#[path = "support/cli.rs"]
mod cli;

use serde_json::Value;

fn tiny_base() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models/tiny-base")
        .display()
        .to_string()
}

/// A state of the tiny base's world, with `words` extra words of context and `answer`.
fn state(id: &str, words: usize, answer: Option<&str>) -> String {
    let context = format!("customer : where is my order ? {}", "order ".repeat(words));
    let mut v = serde_json::json!({
        "id": id, "task_id": format!("task-{id}"), "point": "tool", "context": context,
        "candidates": [
            {"id": "lookup_order", "label": "lookup_order"},
            {"id": "ask_customer", "label": "ask_customer"}
        ]
    });
    if let Some(a) = answer {
        v["answer"] = a.into();
    }
    v.to_string()
}

fn write(dir: &Path, name: &str, lines: &[String]) {
    std::fs::write(dir.join(name), lines.join("\n") + "\n").unwrap();
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_prompt_over_max_tokens_is_an_abstention_and_ids_name_the_model() {
    let dir = tempfile::tempdir().unwrap();
    // the tiny base's decision.json allows 512 prompt tokens; 600 words are over
    write(
        dir.path(),
        "states.jsonl",
        &[
            state("long", 600, Some("lookup_order")),
            state("short", 0, Some("lookup_order")),
            state("open", 0, None),
        ],
    );
    let o = cli::decision_ok(
        dir.path(),
        &[
            "eval",
            "--model",
            &tiny_base(),
            "--data",
            "states.jsonl",
            "--name",
            "tiny",
            "--receipts",
            "r.jsonl",
        ],
    );
    let err = stderr(&o);
    assert!(
        err.contains("1 of 3 states have prompts over max_tokens = 512"),
        "{err}"
    );
    assert!(err.contains("1 of 3 states have no answer"), "{err}");
    let receipts: Vec<Value> = std::fs::read_to_string(dir.path().join("r.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = receipts.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["eval:tiny:long", "eval:tiny:short", "eval:tiny:open"]);
    assert_eq!(
        receipts[0]["result"],
        serde_json::json!({"kind": "abstain"})
    );
    assert_eq!(receipts[0]["shadow"]["reference"], "lookup_order");
    assert_eq!(receipts[1]["result"]["kind"], "pick");
    assert!(receipts[2].get("shadow").is_none());
}

#[test]
fn states_without_answers_are_not_measured_and_split_needs_data() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "open.jsonl",
        &[state("a", 0, None), state("b", 0, None)],
    );
    let o = cli::decision_in(
        dir.path(),
        &["eval", "--model", &tiny_base(), "--data", "open.jsonl"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("none of its 2 states has an answer"),
        "{}",
        stderr(&o)
    );
    // a state offering more options than the model labels is a bad row, named where it is
    let wide = serde_json::json!({
        "id": "w", "task_id": "tw", "point": "tool", "context": "c", "answer": "c1",
        "candidates": (0..20).map(|i| serde_json::json!({"id": format!("c{i}"), "label": "x"}))
            .collect::<Vec<_>>()
    });
    write(dir.path(), "wide.jsonl", &[wide.to_string()]);
    let o = cli::decision_in(
        dir.path(),
        &["eval", "--model", &tiny_base(), "--data", "wide.jsonl"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("wide.jsonl row 1: candidates: 20 options; at most 16 allowed"),
        "{}",
        stderr(&o)
    );
    // --split picks a split of --data: without it, eval takes a run's validation states
    let o = cli::decision_in(dir.path(), &["eval", "--run", "r", "--split", "test"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--data"), "{}", stderr(&o));
}
