//! A `decision train` run whose stderr is not a terminal (a log file, a batch job, CI) reports in
//! lines what a terminal sees as a bar: what was set up, and each logged step's loss and rate.

#[path = "support/cli.rs"]
mod cli;
use cli::decision_ok;

#[test]
fn a_run_without_a_terminal_logs_its_steps_in_lines() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cli::gen_states(d, 4, 11);
    cli::write_tiny_base_run(
        d,
        "log",
        r#"[lora]
rank = 4
alpha = 8.0
targets = ["q_proj", "v_proj"]
[train]
mode = "lora"
max_steps = 5
batch_size = 2
log_every = 2
eval_every = 4
backend = "cpu"
dtype = "auto"
[eval]
permutations = 0
max_states = 4
"#,
    );
    let o = decision_ok(d, &["train", "--config", "run.toml", "--out", "run"]);
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();

    let set_up = lines
        .iter()
        .position(|l| l.starts_with("set up in "))
        .unwrap_or_else(|| panic!("no set-up line:\n{err}"));
    assert!(
        lines[set_up]
            .contains("bf16 base, 7168 trained (LoRA r4 on q_proj, v_proj); 5 steps of 2 x up to"),
        "{}",
        lines[set_up]
    );

    // A line at each logged step (every second, and the last), with metrics.jsonl's loss; each
    // metrics line records the dtype `auto` resolved to (bf16 on the CPU).
    let metrics = std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap();
    let logged: Vec<(u64, f64)> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| m["kind"] == "train")
        .inspect(|m| assert_eq!(m["dtype"], "bf16", "{m}"))
        .map(|m| (m["step"].as_u64().unwrap(), m["loss"].as_f64().unwrap()))
        .collect();
    assert_eq!(
        logged.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [2, 4, 5]
    );
    let steps: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("step "))
        .collect();
    assert_eq!(steps.len(), 4, "three steps and one evaluation:\n{err}");
    for (step, loss) in logged {
        let line = steps
            .iter()
            .find(|l| l.starts_with(&format!("step {step}/5 ")))
            .unwrap_or_else(|| panic!("no line for step {step}:\n{err}"));
        assert!(
            line.contains(&format!("loss {loss:.4} ")) && line.contains(" tokens/s "),
            "{line}"
        );
        assert!(lines.iter().position(|l| l == line).unwrap() > set_up);
    }
    assert!(
        steps
            .iter()
            .any(|l| l.starts_with("step 4: valid accuracy ")),
        "{err}"
    );
}
