//! Burn's fusion plans a GPU forward pass of the model whole: no stretch of a layer falls back to
//! one launch per operation, as whole stretches did while the RMSNorm was written `x / rms · w`
//! (docs/results.md, "Burn's fusion and the norm's order"). Read from the planner's own log,
//! which a `burn.toml` in the folder where `decision` starts turns on.

#[path = "support/checkers.rs"]
mod checkers;
#[path = "support/cli.rs"]
mod cli;

#[test]
fn a_gpu_forward_pass_runs_as_the_fusion_planner_planned_it() {
    let test = "a_gpu_forward_pass_runs_as_the_fusion_planner_planned_it";
    let dir = tempfile::tempdir().unwrap();
    cli::gen_states(dir.path(), 4, 3);
    let log = dir.path().join("fusion.log");
    std::fs::write(
        dir.path().join("burn.toml"),
        format!(
            "[fusion.logger]\nlevel = \"medium\"\nfile = {:?}\nappend = false\n",
            log.to_str().unwrap()
        ),
    )
    .unwrap();
    let o = cli::score_tiny_base(dir.path(), "wgpu", "scores.jsonl", &[]);
    let out = cli::text(&o);
    if out.contains("no usable GPU adapter") {
        checkers::not_run(test, "vulkan", &out);
        return;
    }
    assert!(o.status.success(), "{out}");
    let log = std::fs::read_to_string(&log).expect("the fusion planner's log");
    // the planner logged each plan it chose, so a missing fallback line means none happened
    assert!(log.contains("selected composed strategy"), "{log}");
    let fallbacks: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("falling back to unfused"))
        .collect();
    assert!(
        fallbacks.is_empty(),
        "the planner ran stretches unfused: {fallbacks:?}"
    );
}
