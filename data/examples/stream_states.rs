//! Streams a states dataset and counts its rows, nothing else: shows the reader API and measures
//! the reader's own memory (`/usr/bin/time -v cargo run --example stream_states -- FILE`).
//!
//! Usage: stream_states PATH...

use std::path::PathBuf;

use decision_data::StateReader;

fn main() -> anyhow::Result<()> {
    let paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    anyhow::ensure!(!paths.is_empty(), "usage: stream_states PATH...");
    let (mut good, mut bad, mut bytes) = (0u64, 0u64, 0usize);
    for item in StateReader::open(&paths)? {
        match item? {
            Ok(row) => {
                good += 1;
                bytes += row.value.context.len();
            }
            Err(b) => {
                bad += 1;
                eprintln!("{b}");
            }
        }
    }
    println!("{good} readable rows, {bad} unreadable, {bytes} bytes of context");
    Ok(())
}
