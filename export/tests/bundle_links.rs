//! `bundle verify` refuses symbolic links, and `--force` never replaces what is not a bundle
//! (issue 19). Symbolic links as the test makes them are Unix's.
#![cfg(unix)]

use std::path::Path;

use decision_export::verify::verify;
use decision_export::{ExportOptions, run};

#[path = "support/options.rs"]
mod support;
use support::options;

fn args(out: &Path) -> ExportOptions {
    options("tiny", out)
}

#[test]
fn a_file_replaced_by_a_symlink_fails_verify() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    run(&args(&out)).unwrap();
    assert!(verify(&out).ok(), "{:?}", verify(&out).problems);

    // The same bytes, moved out of the bundle and linked back: every hash still matches.
    let outside = root.path().join("tokenizer.json");
    std::fs::rename(out.join("tokenizer.json"), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("tokenizer.json")).unwrap();
    let v = verify(&out);
    assert!(
        v.problems
            .iter()
            .any(|p| p.starts_with("tokenizer.json: a symbolic link")),
        "{:?}",
        v.problems
    );

    // --force replaces this bundle (it has a manifest), but not a folder without one.
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    std::fs::rename(&outside, out.join("tokenizer.json")).unwrap();
    let mut a = args(&out);
    a.force = true;
    run(&a).unwrap();
    assert!(verify(&out).ok());
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"keep").unwrap();
    let mut a = args(&other);
    a.force = true;
    let e = format!("{:#}", run(&a).unwrap_err());
    assert!(e.contains("notes.txt") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"keep");
}
