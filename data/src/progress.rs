//! Progress bars for long work: drawn on stderr when it is a terminal, silent in pipes and logs.

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
        Some(n) => {
            let pb = ProgressBar::new(n);
            pb.set_style(
                ProgressStyle::with_template(&format!(
                    "{{bar:40}} {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, {{eta}} left) {{msg}}"
                ))
                .expect("valid template"),
            );
            pb
        }
        None => {
            let pb = ProgressBar::new_spinner();
            pb.set_style(
                ProgressStyle::with_template(&format!(
                    "{{spinner}} {{human_pos}} {unit} ({{per_sec}}) {{msg}}"
                ))
                .expect("valid template"),
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
