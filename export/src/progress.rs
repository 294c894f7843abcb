//! Progress bars for long work: shown when stderr is a terminal, silent in pipes and tests.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps labelled `what`, hidden unless stderr is a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}") {
            bar.set_style(style.progress_chars("=> "));
        }
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_message(what.to_string());
    bar
}
