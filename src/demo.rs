//! `decision demo`: the whole job on synthetic data, as a user would run it by hand. Every step
//! is this same binary run as a child process with the exact command line printed first, so the
//! demo is also a transcript of the workflow; a step that fails stops the demo and names the
//! command. The closing summary is read back from the files the steps wrote (eval reports,
//! thresholds.json, the bundle), never from the demo's own bookkeeping.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  decision demo                       # the full demo into demo-out/\n  \
decision demo --quick --out /tmp/d  # a few dozen steps per training run (tests)"
)]
pub struct DemoArgs {
    /// Folder for every output (created; the runs, receipts and bundle inside are replaced).
    #[arg(long, default_value = "demo-out")]
    pub out: PathBuf,
    /// Folder holding tiny.toml, tiny-lora-v2.toml and fit.toml.
    #[arg(long, default_value = "configs")]
    pub configs: PathBuf,
    /// Tasks (episodes) to generate per rules version; each gives about seven states.
    #[arg(long, default_value_t = 2000)]
    pub tasks: usize,
    /// Seed of the generated tasks.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Shortened run: 300 tasks, 40 steps per training run, no flip-rate permutations.
    #[arg(long)]
    pub quick: bool,
    /// Model formats of the bundle.
    #[arg(long, default_value = "onnx,coreml,peft")]
    pub formats: String,
}

struct Demo {
    exe: PathBuf,
    steps: Vec<(String, f64)>,
}

impl Demo {
    /// Run `decision ARGS...`, timed under `name`; a failure stops the demo naming the command.
    fn step(&mut self, name: &str, args: &[String]) -> Result<()> {
        let shown = format!("decision {}", args.join(" "));
        eprintln!("\n==> [{name}] {shown}");
        let t = Instant::now();
        let status = Command::new(&self.exe)
            .args(args)
            .status()
            .with_context(|| format!("could not start `{shown}`"))?;
        let secs = t.elapsed().as_secs_f64();
        if !status.success() {
            bail!("step `{name}` failed ({status}): {shown}");
        }
        self.steps.push((name.to_string(), secs));
        Ok(())
    }

    /// Run two independent steps at once. One training or evaluation process keeps only about
    /// one core busy on these small shapes, so two evaluations side by side take little longer
    /// than one. `first` prints as usual; `second`'s output goes to `log` and is shown after.
    fn alongside(
        &mut self,
        first: (&str, &[String]),
        second: (&str, &[String]),
        log: &Path,
    ) -> Result<()> {
        let shown = format!("decision {}", second.1.join(" "));
        eprintln!(
            "\n==> [{}] {shown}\n    (alongside the next step; output in {})",
            second.0,
            log.display()
        );
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let t = Instant::now();
        let mut child = Command::new(&self.exe)
            .args(second.1)
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("could not start `{shown}`"))?;
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            (status, t.elapsed().as_secs_f64())
        });
        let first_result = self.step(first.0, first.1);
        let (status, secs) = waiter.join().expect("waiting on a child process");
        let status = status.with_context(|| format!("waiting for `{shown}`"))?;
        eprintln!("\n--- [{}] output ({}) ---", second.0, log.display());
        eprint!("{}", std::fs::read_to_string(log).unwrap_or_default());
        first_result?;
        if !status.success() {
            bail!("step `{}` failed ({status}): {shown}", second.0);
        }
        self.steps.push((format!("{} (alongside)", second.0), secs));
        Ok(())
    }
}

fn s(x: impl AsRef<std::ffi::OsStr>) -> String {
    x.as_ref().to_string_lossy().into_owned()
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `accuracy`, `ece`, `flip_rate` (and the touched / untouched split) of one eval report.
fn figures(report: &Value) -> Value {
    let r = &report["report"];
    let mut out = json!({
        "n": r["overall"]["n"],
        "accuracy": r["overall"]["accuracy"],
        "ece": r["overall"]["ece"],
        "nll": r["overall"]["nll"],
        "flip_rate": r["flip_rate"],
    });
    if let Some(groups) = r["by_rule_change"].as_object() {
        for (k, m) in groups {
            out[format!("accuracy_{k}")] = m["accuracy"].clone();
        }
    }
    out
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                dir_size(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

/// The file that marks a folder as the demo's own output.
const MARKER: &str = ".decision-demo";

pub fn run(args: &DemoArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let out = &args.out;
    decision_data::paths::IoCheck::new()
        .input("--configs", &args.configs)
        .output_folder("--out", out)
        .check()?;
    // Outputs that a step refuses to overwrite, or would resume from: start clean every time,
    // but only in a folder the demo made (its marker, or an earlier run's summary.json or states):
    // `--out .` or `--out ~` must not delete someone's runs/.
    let made_by_demo = out.join(MARKER).is_file()
        || out.join("summary.json").is_file()
        || (out.join("v1.parquet").is_file() && out.join("v2.parquet").is_file());
    let ours = ["runs", "bundle", "fit-v1", "fit-v2"];
    if !made_by_demo && let Some(d) = ours.iter().find(|d| out.join(d).exists()) {
        anyhow::bail!(
            "--out {} holds {d}/ but was not made by `decision demo` (no {MARKER} in it); the \
             demo replaces runs/, bundle/, fit-v1/ and fit-v2/ there, so it left it alone: \
             choose a new or empty --out",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    decision_data::atomic::write_atomic(
        out.join(MARKER),
        b"made by `decision demo`; it replaces runs/, bundle/, fit-v1/ and fit-v2/ here\n",
    )?;
    for d in ours {
        let p = out.join(d);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    let mut demo = Demo {
        exe: std::env::current_exe().context("locating the decision binary")?,
        steps: Vec::new(),
    };
    let tasks = if args.quick { 300 } else { args.tasks };
    let (v1, v2) = (out.join("v1.parquet"), out.join("v2.parquet"));
    let (run1, run2) = (out.join("runs/tiny-v1"), out.join("runs/tiny-v2"));
    let cfg = |f: &str| s(args.configs.join(f));
    let perms = if args.quick { "0" } else { "2" };
    // The evaluation steps measure the flip rate on the test states; the training runs skip
    // their own measurement on the validation states (a minute of the ten).
    let mut quick_sets: Vec<String> = vec!["--set".into(), "eval.permutations=0".into()];
    if args.quick {
        for kv in [
            "train.max_steps=40",
            "optim.warmup_steps=5",
            "train.eval_every=0",
            "eval.max_states=100",
        ] {
            quick_sets.extend(["--set".into(), kv.into()]);
        }
    }

    // 1. Data: the same tasks under both rules versions, split by task.
    for (rules, path) in [("v1", &v1), ("v2", &v2)] {
        demo.step(
            &format!("generate {rules} states"),
            &[
                "gen".into(),
                "states".into(),
                "--rules".into(),
                rules.into(),
                "--tasks".into(),
                tasks.to_string(),
                "--seed".into(),
                args.seed.to_string(),
                "--out".into(),
                s(path),
            ],
        )?;
    }

    // 2. Train the tiny model on v1.
    let mut train1 = vec![
        "train".into(),
        "--config".into(),
        cfg("tiny.toml"),
        "--set".into(),
        format!("data.train={}", s(&v1)),
        "--out".into(),
        s(&run1),
    ];
    train1.extend(quick_sets.iter().cloned());
    demo.step("train v1 (full)", &train1)?;

    // 3. Evaluate v1 on v1 test and v2 test; 4. shadow receipts on v1 test, fit.
    let eval = |model: &Path, data: &Path, report: &str, extra: &[String]| -> Vec<String> {
        let mut a = vec![
            "eval".into(),
            "--run".into(),
            s(model),
            "--data".into(),
            s(data),
            "--split".into(),
            "test".into(),
            "--permutations".into(),
            perms.into(),
            "--report".into(),
            s(out.join(report)),
        ];
        a.extend(extra.iter().cloned());
        a
    };
    let receipts1 = out.join("receipts-v1.jsonl");
    demo.alongside(
        (
            "eval v1 on v1 test",
            &eval(
                &run1,
                &v1,
                "eval-v1-on-v1.json",
                &["--receipts".into(), s(&receipts1)],
            ),
        ),
        (
            "eval v1 on v2 test",
            &eval(&run1, &v2, "eval-v1-on-v2.json", &[]),
        ),
        &out.join("eval-v1-on-v2.log"),
    )?;
    let thresholds1 = out.join("thresholds-v1.json");
    demo.step(
        "fit thresholds (v1)",
        &[
            "fit".into(),
            "--receipts".into(),
            s(&receipts1),
            "--config".into(),
            cfg("fit.toml"),
            "--out".into(),
            s(&thresholds1),
            "--report".into(),
            s(out.join("fit-v1")),
        ],
    )?;

    // 5. The rule change: LoRA on v2 states, old vs new side by side, receipts, refit.
    let mut train2 = vec![
        "train".into(),
        "--config".into(),
        cfg("tiny-lora-v2.toml"),
        "--set".into(),
        format!("model.source={}", s(run1.join("final"))),
        "--set".into(),
        format!("data.train={}", s(&v2)),
        "--out".into(),
        s(&run2),
    ];
    train2.extend(quick_sets.iter().cloned());
    demo.step("retrain on v2 (LoRA)", &train2)?;
    let receipts2 = out.join("receipts-v2.jsonl");
    demo.alongside(
        (
            "eval v2 vs v1 on v2 test",
            &eval(
                &run2,
                &v2,
                "eval-v2-on-v2.json",
                &[
                    "--baseline".into(),
                    s(&run1),
                    "--receipts".into(),
                    s(&receipts2),
                ],
            ),
        ),
        (
            "eval v2 on v1 test",
            &eval(&run2, &v1, "eval-v2-on-v1.json", &[]),
        ),
        &out.join("eval-v2-on-v1.log"),
    )?;
    let thresholds = out.join("thresholds.json");
    demo.step(
        "refit thresholds (v2)",
        &[
            "fit".into(),
            "--receipts".into(),
            s(&receipts2),
            "--config".into(),
            cfg("fit.toml"),
            "--out".into(),
            s(&thresholds),
            "--previous".into(),
            s(&thresholds1),
            "--report".into(),
            s(out.join("fit-v2")),
        ],
    )?;

    // 6. Ship: the bundle with its thresholds, then verify it as the harness would.
    let bundle = out.join("bundle");
    demo.step(
        "export bundle",
        &[
            "export".into(),
            "--run".into(),
            s(&run2),
            "--formats".into(),
            args.formats.clone(),
            "--thresholds".into(),
            s(&thresholds),
            "--out".into(),
            s(&bundle),
        ],
    )?;
    demo.step(
        "verify bundle",
        &["bundle".into(), "verify".into(), s(&bundle)],
    )?;

    // 7. The closing summary, from the files the steps wrote.
    let report = |f: &str| read_json(&out.join(f));
    let th = read_json(&thresholds)?;
    let th1 = read_json(&thresholds1)?;
    let summary = json!({
        "schema": "decision-demo-summary/1",
        "v1_model": {
            "v1_test": figures(&report("eval-v1-on-v1.json")?),
            "v2_test": figures(&report("eval-v1-on-v2.json")?),
        },
        "v2_model": {
            "v1_test": figures(&report("eval-v2-on-v1.json")?),
            "v2_test": figures(&report("eval-v2-on-v2.json")?),
        },
        "thresholds": th,
        "thresholds_v1": th1["points"],
        "bundle": {"path": s(&bundle), "bytes": dir_size(&bundle)},
        "steps": demo.steps.iter().map(|(n, t)| json!({"name": n, "seconds": t})).collect::<Vec<_>>(),
        "total_seconds": started.elapsed().as_secs_f64(),
    });
    let summary_path = out.join("summary.json");
    decision_data::atomic::write_json_atomic(&summary_path, &summary)?;
    print!("{}", closing_table(&summary));
    println!("summary         {}", summary_path.display());
    println!(
        "fit reports     {} , {}",
        s(out.join("fit-v1/report.html")),
        s(out.join("fit-v2/report.html"))
    );
    Ok(ExitCode::SUCCESS)
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |x| format!("{:.1}%", 100.0 * x))
}

fn num(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.3}"))
}

fn closing_table(summary: &Value) -> String {
    let mut t = String::from("\n== demo summary ==\n\n");
    t.push_str("model      test set  accuracy  touched  untouched  diverged  ECE    flip rate\n");
    for m in ["v1_model", "v2_model"] {
        for d in ["v1_test", "v2_test"] {
            let f = &summary[m][d];
            t.push_str(&format!(
                "{:<10} {:<9} {:>8}  {:>7}  {:>9}  {:>8}  {:<6} {}\n",
                &m[..2],
                d,
                pct(&f["accuracy"]),
                pct(&f["accuracy_touched"]),
                pct(&f["accuracy_untouched"]),
                pct(&f["accuracy_diverged"]),
                num(&f["ece"]),
                num(&f["flip_rate"]),
            ));
        }
    }
    t.push_str("\npoint   threshold (v1 -> v2)   coverage  success above\n");
    if let Some(points) = summary["thresholds"]["points"].as_object() {
        for (name, p) in points {
            let old = &summary["thresholds_v1"][name]["threshold"];
            t.push_str(&format!(
                "{:<7} {:>8} -> {:<8}     {:>8}  {:>8}\n",
                name,
                num(old),
                num(&p["threshold"]),
                pct(&p["coverage"]),
                pct(&p["success_above"]),
            ));
        }
    }
    let b = &summary["bundle"];
    t.push_str(&format!(
        "\nbundle  {}  ({:.1} MB)\n\nstep                                seconds\n",
        b["path"].as_str().unwrap_or("-"),
        b["bytes"].as_f64().unwrap_or(0.0) / 1e6
    ));
    if let Some(steps) = summary["steps"].as_array() {
        for st in steps {
            t.push_str(&format!(
                "{:<34} {:>8.1}\n",
                st["name"].as_str().unwrap_or("-"),
                st["seconds"].as_f64().unwrap_or(0.0)
            ));
        }
    }
    t.push_str(&format!(
        "{:<34} {:>8.1}\n\n",
        "total (wall)",
        summary["total_seconds"].as_f64().unwrap_or(0.0)
    ));
    t
}
