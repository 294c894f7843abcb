//! `decision`: the command line. This file only parses arguments and dispatches.

use clap::Parser;

#[derive(Parser)]
#[command(name = "decision", version, about = "Train, calibrate and ship the decision model behind an agent harness")]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
