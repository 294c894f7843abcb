//! Reference checkers that a test needs but a machine may lack (coremltools, a Vulkan driver,
//! torch + transformers). Included by the tests that use them (`#[path] mod checkers;`), so every
//! crate's tests skip, and fail, the same way.
//!
//! On a developer machine a missing checker is reported as `NOT RUN` on stderr (past the test
//! harness's capture) and the test returns early. `$DECISION_REQUIRE_CHECKERS` lists the checkers
//! that must be there (comma- or space-separated names, e.g. `coremltools,vulkan`; `.ci/run`
//! sets it to what it installs): for those, a missing checker fails the test.

#![allow(dead_code)]

/// The environment variable listing the checkers that must be present.
pub const REQUIRE_ENV: &str = "DECISION_REQUIRE_CHECKERS";

/// Whether `$DECISION_REQUIRE_CHECKERS` names `checker`.
pub fn required(checker: &str) -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| {
        v.split(|c: char| c == ',' || c.is_whitespace())
            .any(|name| name == checker)
    })
}

/// `test` could not run `checker` (`reason` says why): a failure when the checker is required,
/// else a loud `NOT RUN` line, after which the caller returns.
pub fn not_run(test: &str, checker: &str, reason: &str) {
    if required(checker) {
        panic!(
            "{test}: {checker} is required (${REQUIRE_ENV} names it) but could not run: {reason}"
        );
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** NOT RUN {test}: {checker} is not available: {reason}.\n*** (${REQUIRE_ENV}={checker} \
         turns this into a failure; .ci/run sets it for the checkers it installs)\n"
    );
}

/// The environment variable naming the folder of Qwen3's real tokenizer files.
pub const QWEN3_TOKENIZER_ENV: &str = "DECISION_QWEN3_TOKENIZER";

/// Qwen3's real tokenizer folder (`tokenizer.json`, `tokenizer_config.json`), as
/// `make qwen3-tokenizer` (scripts/fetch_qwen3_tokenizer.sh) leaves it: `$DECISION_QWEN3_TOKENIZER`,
/// else `target/qwen3-tokenizer` of the workspace. `None` (after [`not_run`] under the checker
/// name `qwen3-tokenizer`) when it is not there.
pub fn qwen3_tokenizer(test: &str) -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os(QWEN3_TOKENIZER_ENV) {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            let root = here
                .ancestors()
                .find(|d| d.join("Cargo.lock").is_file())
                .unwrap_or(here);
            root.join("target/qwen3-tokenizer")
        }
    };
    if dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file() {
        Some(dir)
    } else {
        not_run(
            test,
            "qwen3-tokenizer",
            &format!(
                "{} has no tokenizer.json and tokenizer_config.json (run `make qwen3-tokenizer`, \
                 or set ${QWEN3_TOKENIZER_ENV})",
                dir.display()
            ),
        );
        None
    }
}

/// A Python that imports torch and transformers: `$DECISION_PYTHON`, else `python3`; the error
/// says why not.
pub fn transformers_python() -> Result<std::path::PathBuf, String> {
    let py = std::env::var_os("DECISION_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("python3"));
    match std::process::Command::new(&py)
        .args(["-c", "import torch, transformers"])
        .output()
    {
        Ok(o) if o.status.success() => Ok(py),
        Ok(o) => Err(format!(
            "{} cannot import torch and transformers: {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
        Err(e) => Err(format!("{}: {e}", py.display())),
    }
}
