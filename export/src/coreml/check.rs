//! The coremltools check of a package: `scripts/check_coreml.py`, run with a Python that has
//! coremltools (from `$DECISION_PYTHON`, else `python3`).
//!
//! Core ML itself runs only on Apple platforms. The script does what can be done elsewhere:
//! coremltools loads the package (`load_spec`, `MLModel(…, skip_model_load=True)`), its milproto
//! frontend rebuilds the program with type inference (unknown parameters, wrong declared types and
//! unreadable weight blobs fail there), and the ops are evaluated one by one with their value
//! inference on sample states, whose `option_probs` must match the reference's. The script is
//! compiled into the binary, so an installed `decision` needs no checkout to run it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::parity::{Batch, Scorer};

/// The check script (also committed as `scripts/check_coreml.py`).
pub(crate) const SCRIPT: &str = include_str!("../../../scripts/check_coreml.py");
/// Environment variable naming the Python interpreter to use.
pub(crate) const PYTHON_ENV: &str = "DECISION_PYTHON";

/// One sample state: unpadded tokens (batch 1), and the reference's answer. The field names are
/// those `decision score --emit-tokens` writes, so its output can be checked directly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckSample {
    pub id: String,
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    pub option_token_ids: Vec<i64>,
    /// The reference's option probabilities (at `temperature`).
    pub probs: Vec<f32>,
    /// The reference's option logits, divided by `temperature`.
    pub option_logits: Vec<f32>,
    pub temperature: f64,
}

/// Score `batches` with `reference` and turn every row into a batch-1 sample (padding removed).
pub fn samples_from(
    reference: &dyn Scorer,
    batches: &[Batch],
    temperature: f64,
) -> Result<Vec<CheckSample>> {
    let mut out = Vec::new();
    for b in batches {
        let scores = reference.score(b).context("running the reference")?;
        for r in 0..b.batch {
            let span = r * b.seq..(r + 1) * b.seq;
            let input_ids: Vec<i64> = b.input_ids[span.clone()]
                .iter()
                .zip(&b.attention_mask[span])
                .filter(|(_, m)| **m != 0)
                .map(|(t, _)| *t)
                .collect();
            out.push(CheckSample {
                id: format!("sample-{}", out.len() + 1),
                attention_mask: vec![1; input_ids.len()],
                input_ids,
                option_token_ids: b.option_token_ids[r * b.options..(r + 1) * b.options].to_vec(),
                probs: scores.probs[r].clone(),
                option_logits: scores.logits[r].clone(),
                temperature,
            });
        }
    }
    Ok(out)
}

/// A Python that can run the check, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Python {
    Ready {
        interpreter: PathBuf,
        /// `coremltools X, numpy Y`.
        versions: String,
    },
    Missing {
        reason: String,
    },
}

/// Find the interpreter (`$DECISION_PYTHON`, else `python3`) and check that it imports
/// coremltools and numpy.
pub fn find_python() -> Python {
    let (interpreter, from_env) = match std::env::var_os(PYTHON_ENV) {
        Some(p) if !p.is_empty() => (PathBuf::from(p), true),
        _ => (PathBuf::from("python3"), false),
    };
    let probe = Command::new(&interpreter)
        .args([
            "-c",
            "import coremltools, numpy; print('coremltools', coremltools.__version__ + ', numpy', numpy.__version__)",
        ])
        .env("PYTHONWARNINGS", "ignore")
        .output();
    let hint = "install it with `pip install -r scripts/requirements-coreml.txt` and/or point \
                $DECISION_PYTHON at that interpreter";
    match probe {
        Err(e) => Python::Missing {
            reason: format!(
                "no Python interpreter `{}`{} ({e}); {hint}",
                interpreter.display(),
                if from_env {
                    " (from $DECISION_PYTHON)"
                } else {
                    ""
                }
            ),
        },
        Ok(out) if !out.status.success() => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            Python::Missing {
                reason: format!(
                    "`{}` cannot import coremltools and numpy ({last}); {hint}",
                    interpreter.display()
                ),
            }
        }
        Ok(out) => Python::Ready {
            interpreter,
            versions: String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_string(),
        },
    }
}

/// What the script reports (`--report`): whether it passed, where it stopped, and the figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// The package checked, as given.
    #[serde(default)]
    pub package: String,
    pub passed: bool,
    /// The step that failed (`manifest`, `load_spec`, `mlmodel`, `interface`, `weights`,
    /// `milproto`, `explicit_parameters`, `samples`, `values`, `parity`).
    #[serde(default)]
    pub failed_step: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// The steps that passed, in order.
    #[serde(default)]
    pub steps: Vec<String>,
    #[serde(default)]
    pub runtime: String,
    /// Sample evaluations (each state as given, and left-padded).
    #[serde(default)]
    pub samples: usize,
    #[serde(default)]
    pub max_abs_dp: Option<f64>,
    #[serde(default)]
    pub max_abs_dlogit: Option<f64>,
    /// The sample with the largest |Δp|.
    #[serde(default)]
    pub worst: Option<String>,
    #[serde(default)]
    pub tolerance: Option<f64>,
    #[serde(default)]
    pub pick_mismatches: usize,
    #[serde(default)]
    pub near_ties: usize,
    #[serde(default)]
    pub operations: usize,
    #[serde(default)]
    pub weight_blobs: usize,
    /// Ops evaluated with numpy because coremltools has no value inference for them.
    #[serde(default)]
    pub numpy_fallbacks: Vec<String>,
    /// Sample states given, and how many of them were evaluated (fewer under a budget).
    #[serde(default)]
    pub states_given: usize,
    #[serde(default)]
    pub states_checked: usize,
    /// States also evaluated left-padded.
    #[serde(default)]
    pub padded: usize,
    /// Shortest and longest state evaluated, in tokens.
    #[serde(default)]
    pub tokens: Vec<usize>,
    /// The budget given (multiply-adds; 0: none), and whether it left states out.
    #[serde(default)]
    pub budget: f64,
    #[serde(default)]
    pub budget_limited: bool,
    /// Multiply-adds per token of the linear layers.
    #[serde(default)]
    pub macs_per_token: u64,
    /// Products evaluated by numpy in fp32, and the other ops by coremltools' value inference.
    #[serde(default)]
    pub f32_products: usize,
    #[serde(default)]
    pub other_ops: usize,
    /// Seconds the value step took.
    #[serde(default)]
    pub values_seconds: f64,
}

impl CheckReport {
    /// What the value check evaluated, in words (for the summary and `verified_with`).
    pub fn describe_values(&self) -> String {
        let tokens = match self.tokens.as_slice() {
            [a, b] if a == b => format!("{a} tokens"),
            [a, b] => format!("{a}-{b} tokens"),
            _ => "? tokens".into(),
        };
        let left_out = if self.budget_limited {
            format!(
                "; the budget of {:.1e} multiply-adds ({} per token) left {} out",
                self.budget,
                self.macs_per_token,
                self.states_given - self.states_checked
            )
        } else {
            String::new()
        };
        let fallbacks = if self.numpy_fallbacks.is_empty() {
            String::new()
        } else {
            format!(", {} by numpy", self.numpy_fallbacks.join(", "))
        };
        format!(
            "{} of {} sample states ({tokens}) evaluated op by op, {} of them also left-padded{left_out}: \
             {} evaluations in {:.0} s; {} linear / matmul ops by numpy in fp32 rounded to their dtype, \
             {} other ops by coremltools' value inference{fallbacks}",
            self.states_checked,
            self.states_given,
            self.padded,
            self.samples,
            self.values_seconds,
            self.f32_products,
            self.other_ops,
        )
    }

    /// An error naming the failed step (and, for parity, by how much it missed).
    pub fn ensure(&self) -> Result<()> {
        if self.passed {
            return Ok(());
        }
        bail!(
            "the coremltools check of model.mlpackage failed at step `{}`: {}{}",
            self.failed_step.as_deref().unwrap_or("?"),
            self.error.as_deref().unwrap_or("no message"),
            match (self.max_abs_dp, self.tolerance) {
                (Some(dp), Some(tol)) if self.failed_step.as_deref() == Some("parity") => format!(
                    " (max |Δp| = {dp:.3e}, tolerance {tol:.0e}, {:.1}× over)",
                    dp / tol
                ),
                _ => String::new(),
            }
        )
    }
}

/// How the script evaluates `linear` / `matmul` (its `--products`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Products {
    /// numpy in fp32 for products of 2^22 multiply-adds and more, coremltools' value inference
    /// (numpy in the op's own dtype, fp16 without BLAS) below.
    #[default]
    Auto,
    /// numpy in fp32 for every product, rounded to the op's dtype.
    F32,
    /// coremltools' value inference for every product.
    Coremltools,
}

impl Products {
    fn arg(self) -> &'static str {
        match self {
            Products::Auto => "auto",
            Products::F32 => "f32",
            Products::Coremltools => "coremltools",
        }
    }
}

/// The multiply-adds of linear layers the export's check evaluates at most. All sample states,
/// each also left-padded, fit under it up to about the Qwen3-0.6B size; past it the script
/// checks fewer and says how many (at the 4B shape: 10 of 27 probe states, 6 minutes on two busy
/// cores).
pub(crate) const EXPORT_BUDGET: f64 = 2.5e12;

/// The script's settings besides the package and the samples.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CheckArgs {
    /// Max |Δp| allowed; `None` lets each package's weight type decide (2e-3 for fp16, 1e-4 for
    /// fp32, as [`crate::parity::tolerance`]).
    pub tolerance: Option<f32>,
    /// The token the script left-pads a sample with for its second evaluation.
    pub pad_id: u32,
    /// At most about this many multiply-adds of linear layers over all evaluations (0: no limit).
    pub budget: f64,
    pub products: Products,
}

/// Run the check script on `package` with `samples`. Returns the script's report (passed or
/// not); an error only when the script could not report at all.
pub fn run_check(
    interpreter: &Path,
    package: &Path,
    samples: &[CheckSample],
    args: CheckArgs,
) -> Result<CheckReport> {
    let mut reports = run_checks(interpreter, &[package], samples, args)?;
    Ok(reports.remove(0))
}

/// [`run_check`] for several packages in one Python process (coremltools takes seconds to
/// import); one report per package, in order.
pub fn run_checks(
    interpreter: &Path,
    packages: &[&Path],
    samples: &[CheckSample],
    args: CheckArgs,
) -> Result<Vec<CheckReport>> {
    if packages.is_empty() {
        return Ok(Vec::new());
    }
    let scratch = tempfile::tempdir().context("a temporary folder for the Core ML check")?;
    let script = scratch.path().join("check_coreml.py");
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let samples_path = scratch.path().join("samples.jsonl");
    let mut f = std::fs::File::create(&samples_path)
        .with_context(|| format!("writing {}", samples_path.display()))?;
    for s in samples {
        serde_json::to_writer(&mut f, s)?;
        f.write_all(b"\n")?;
    }
    drop(f);
    let report_path = scratch.path().join("report.json");
    let mut cmd = Command::new(interpreter);
    cmd.arg(&script)
        .args(packages)
        .arg("--samples")
        .arg(&samples_path)
        .arg("--pad-id")
        .arg(args.pad_id.to_string())
        .arg("--products")
        .arg(args.products.arg())
        .arg("--budget")
        .arg(args.budget.to_string())
        .arg("--report")
        .arg(&report_path)
        .env("PYTHONWARNINGS", "ignore");
    if let Some(t) = args.tolerance {
        cmd.arg("--tolerance").arg(t.to_string());
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", interpreter.display()))?;
    let text = match std::fs::read_to_string(&report_path) {
        Ok(t) => t,
        Err(_) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(15).collect();
            bail!(
                "the Core ML check script exited with {} without a report:\n{}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    };
    let reports: Vec<CheckReport> = if packages.len() == 1 {
        vec![serde_json::from_str(&text).context("the Core ML check's report is not valid JSON")?]
    } else {
        serde_json::from_str(&text).context("the Core ML check's report is not valid JSON")?
    };
    if reports.len() != packages.len() {
        bail!(
            "the Core ML check reported on {} packages, {} were given",
            reports.len(),
            packages.len()
        );
    }
    Ok(reports)
}
