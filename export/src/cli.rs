//! `decision export` and `decision bundle verify`: their arguments, and printing what the library
//! calls return. The export itself is [`crate::run`]; the bundle check [`crate::verify`].

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

use crate::run::ExportOptions;
use crate::verify;

/// Export a trained decision model as the bundle the desktop harness loads.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  decision export --run runs/tiny-lora-v2 --formats onnx,peft --out demo-out/bundle
  decision export --model Qwen/Qwen3-0.6B --adapter my-lora --thresholds thresholds.json \\
      --formats onnx,peft --dtype f16 --check-data states.parquet --out bundle
  DECISION_PYTHON=.ci/venv-coreml/bin/python \\
      decision export --run runs/tiny-lora-v2 --formats onnx,coreml --out demo-out/bundle

The model files apply decision.json's `temperature`; a harness that calibrates per decision
point computes softmax(option_logits * temperature / temperatures[point]).
Before manifest.json is written, each model file is run in-process on sample states and compared
with the training-side forward pass (max |dp| <= 1e-4 for f32 weights, <= 2e-3 for f16, same
picks); on failure nothing is published. model.onnx runs in tract. model.mlpackage (Core ML runs
only on Apple platforms) is always checked for structure in Rust, and its option_probs are
reproduced with coremltools (scripts/check_coreml.py) when $DECISION_PYTHON (else python3) imports
coremltools; manifest.json's verified_with says which checks ran.")]
pub struct ExportArgs {
    #[command(flatten)]
    pub options: ExportOptions,
}

/// Inspect a bundle.
#[derive(Debug, Subcommand)]
pub enum BundleCmd {
    /// Check hashes, JSON schemas, tokenizer label ids and the model interface; exit 1 on any mismatch
    #[command(after_help = "Example:\n  decision bundle verify demo-out/bundle")]
    Verify {
        /// The bundle folder
        bundle: PathBuf,
    },
}

impl BundleCmd {
    pub fn run(&self) -> Result<ExitCode> {
        match self {
            BundleCmd::Verify { bundle } => {
                if !bundle.is_dir() {
                    bail!("{}: not a folder", bundle.display());
                }
                let v = verify::verify(bundle);
                for n in &v.notes {
                    eprintln!("note: {n}");
                }
                if v.ok() {
                    println!(
                        "ok: {} verified ({} files)",
                        bundle.display(),
                        v.files_checked
                    );
                    Ok(ExitCode::SUCCESS)
                } else {
                    for p in &v.problems {
                        eprintln!("{}: {p}", bundle.display());
                    }
                    eprintln!(
                        "FAILED: {} problem(s) in {}",
                        v.problems.len(),
                        bundle.display()
                    );
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

impl ExportArgs {
    /// Run the export and print its summary.
    pub fn run(&self) -> Result<ExitCode> {
        for line in crate::run(&self.options)? {
            if line.starts_with("warning: ") {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
