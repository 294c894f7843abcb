//! Progress bars for long work: drawn on stderr when it is a terminal, silent in pipes, logs and
//! tests. The one place bars are made, for every crate.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// True when progress should be drawn (stderr is a terminal).
pub fn enabled() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar over `total` units (`unit` names them: "rows", "states", "steps"), or a spinner that
/// counts when the total is unknown. Hidden unless stderr is a terminal.
pub fn bar(total: Option<u64>, unit: &str) -> ProgressBar {
    let pb = match total {
        Some(n) => styled(
            ProgressBar::new(n),
            &format!(
                "{{bar:40}} {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, {{eta}} left) {{msg}}"
            ),
        ),
        None => {
            let pb = styled(
                ProgressBar::new_spinner(),
                &format!("{{spinner}} {{human_pos}} {unit} ({{per_sec}}) {{msg}}"),
            );
            if enabled() {
                pb.enable_steady_tick(Duration::from_millis(200));
            }
            pb
        }
    };
    if !enabled() {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

/// A bar of `total` steps of one task, led by what it does ("writing ONNX weights"). Hidden
/// unless stderr is a terminal.
pub fn task(total: u64, what: &str) -> ProgressBar {
    let pb = bar(Some(total), "");
    pb.set_style(
        ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} ({elapsed}, {eta} left)")
            .expect("valid template"),
    );
    pb.set_message(what.to_string());
    pb
}

fn styled(pb: ProgressBar, template: &str) -> ProgressBar {
    pb.set_style(ProgressStyle::with_template(template).expect("valid template"));
    pb
}
