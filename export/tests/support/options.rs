//! What the export tests share: the fixture models and `decision export`'s options for one of
//! them, parsed as the command line parses them (so the defaults are the CLI's own), ONNX only
//! with f32 weights unless a test sets otherwise.

use std::path::{Path, PathBuf};

use decision_export::{ExportOptions, Format, WeightDtype};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/export")
}

/// `decision export --model <fixture> --out <out> --formats onnx --dtype f32`.
pub fn options(fixture: &str, out: &Path) -> ExportOptions {
    let mut a = <ExportOptions as clap::FromArgMatches>::from_arg_matches(
        &<ExportOptions as clap::Args>::augment_args(clap::Command::new("export"))
            .try_get_matches_from([
                "export",
                "--model",
                fixtures().join(fixture).to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ])
            .unwrap(),
    )
    .unwrap();
    a.formats = vec![Format::Onnx];
    a.dtype = Some(WeightDtype::F32);
    a
}
