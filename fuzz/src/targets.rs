//! The fuzz targets: each writes the input where its reader looks for it (every reader here takes
//! a path) and runs the reader, then what the command that calls the reader does next with what
//! it read. An `Err` from a reader is the right answer to a bad input; only a panic, a hang or an
//! allocation past the limit is a finding.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use decision_data::receipts_io::{self, ReadOptions};
use decision_data::stats::Stats;
use decision_data::{Quarantine, SplitRatios, State, StateReader, ValidateOptions};
use decision_fit::FitConfig;
use decision_fit::aggregate::Aggregate;
use decision_prompt::{DecisionSpec, Prompter};
use decision_train::Qwen3Config;
use decision_train::model::weights::{self, SafetensorsDir, WeightSource};
use decision_train::run_config::RunConfig;

use crate::mutate::Kind;

/// The repository root (fixtures and configs are read from it at set-up).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs one input: `Ok` when the reader accepted all of it, the reader's error (or the first
/// bad record) otherwise. Either is a fine answer; only the seeds' answers are checked (tests).
pub trait Runner {
    fn run(&mut self, input: &[u8]) -> Result<()>;
}

pub struct Target {
    pub name: &'static str,
    /// Where the input is written, inside a fresh work folder (the readers pick the format by
    /// the extension).
    pub file: &'static str,
    pub kind: Kind,
    /// Set up, given the input's path.
    pub make: fn(&Path) -> Result<Box<dyn Runner>>,
    /// Seeds built in instead of `fuzz/corpus/<name>/`: only the self-test targets, which are
    /// not part of `all` and exist to show that the harness catches each kind of finding.
    pub builtin_seeds: &'static [&'static [u8]],
}

pub fn all() -> Vec<Target> {
    let t = |name, file, kind, make| Target {
        name,
        file,
        kind,
        make,
        builtin_seeds: &[],
    };
    let selftest_target = |name, seed| Target {
        name,
        file: "input",
        kind: Kind::Json,
        make: selftest,
        builtin_seeds: seed,
    };
    let bin = |text_prefix| Kind::Binary { text_prefix };
    vec![
        t("states-jsonl", "states.jsonl", Kind::Json, states),
        t("states-parquet", "states.parquet", bin(0), states),
        t("receipts-jsonl", "receipts.jsonl", Kind::Json, receipts),
        t("receipts-parquet", "receipts.parquet", bin(0), receipts),
        t("fit-config", "fit.toml", Kind::Toml, fit_config),
        t("decision-json", "decision.json", Kind::Json, decision_json),
        t("model-config", "config.json", Kind::Json, model_config),
        // The header is JSON: token mutations in its first 4 KiB.
        t("safetensors", "model.safetensors", bin(4096), safetensors),
        t("manifest", "bundle/manifest.json", Kind::Json, manifest),
        selftest_target("selftest-panic", &[b"ok", b"panic"]),
        selftest_target("selftest-hang", &[b"ok", b"hang"]),
        selftest_target("selftest-alloc", &[b"ok", b"alloc"]),
    ]
}

fn write(path: &Path, input: &[u8]) {
    std::fs::write(path, input).unwrap_or_else(|e| {
        // The harness's own failure, not a finding: stop.
        eprintln!("decision-fuzz: cannot write {}: {e}", path.display());
        std::process::exit(4)
    });
}

/// Decision states, as `decision data validate` / `stats` and every training read see them: the
/// row-count hint, every row through the validator, the quarantine of bad rows, the statistics.
fn states(path: &Path) -> Result<Box<dyn Runner>> {
    struct States {
        path: PathBuf,
        quarantine: PathBuf,
    }
    impl Runner for States {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            let path = &self.path;
            write(path, input);
            let reader = StateReader::open(std::slice::from_ref(path))?;
            let _ = reader.row_count_hint();
            let mut q = Quarantine::create(&self.quarantine)?;
            let mut stats = Stats::new();
            let ratios = SplitRatios::default();
            let mut first_bad = None;
            for item in reader.validated(ValidateOptions::default()) {
                match item? {
                    Ok(row) => stats.add(&row.value, &ratios),
                    Err(bad) => {
                        stats.add_bad();
                        first_bad.get_or_insert_with(|| bad.lines().collect::<Vec<_>>().join("; "));
                        q.add(&bad)?;
                    }
                }
            }
            q.finish()?;
            let _ = stats.render();
            match first_bad {
                Some(b) => anyhow::bail!("bad row: {b}"),
                None => Ok(()),
            }
        }
    }
    Ok(Box::new(States {
        path: path.to_path_buf(),
        quarantine: path.with_file_name("bad.jsonl"),
    }))
}

/// The shipped fit config (its outcome patterns classify keel's free-text outcomes).
fn shipped_fit_config() -> Result<FitConfig> {
    FitConfig::load(&repo().join("configs/fit.toml"))
}

/// Receipts, as `decision fit` reads them: each id once, bad records quarantined, every point
/// aggregated and fitted; the parallel read (row groups and line pieces on threads, the spilled
/// id check) must count exactly what the sequential one counts.
fn receipts(path: &Path) -> Result<Box<dyn Runner>> {
    struct Receipts {
        path: PathBuf,
        quarantine: PathBuf,
        config: FitConfig,
    }
    impl Runner for Receipts {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            let path = &self.path;
            write(path, input);
            let opts = ReadOptions {
                outcome: self.config.outcome.clone(),
                progress: false,
            };
            let mut q = Quarantine::create(&self.quarantine)?;
            let mut agg = Aggregate::new(&self.config, BTreeMap::new());
            // a bad record as the quarantine keeps it: place, first error, bytes
            let key = |b: &decision_data::BadRow| {
                let e = &b.errors[0];
                (b.row, e.field.clone(), e.reason.clone(), b.raw().to_vec())
            };
            let mut bad = Vec::new();
            let read =
                receipts_io::for_each_unique_receipt(std::slice::from_ref(path), &opts, |item| {
                    match item {
                        Ok(r) => agg.add(r),
                        Err(b) => {
                            agg.add_bad();
                            bad.push(key(b));
                            q.add(b)?;
                        }
                    }
                    Ok(())
                });
            q.finish()?;
            // The parallel, column-wise read `decision fit` uses must agree with the sequential
            // row-wise one (the same receipts, bad records and hash), or both refuse the file.
            let inputs = [receipts_io::Input::local(path.clone())];
            let new = || Aggregate::new(&self.config, BTreeMap::new());
            let mut scan_bad = Vec::new();
            let scanned = receipts_io::scan_unique_receipts(&inputs, &opts, &new, &mut |b| {
                scan_bad.push(key(b));
                Ok(())
            });
            let summary = match (read, scanned) {
                (Ok(summary), Ok((mut scan, scan_summary))) => {
                    scan.drop_unseen();
                    // a disagreement is a finding (a panic), not a refusal
                    assert_eq!(scan_summary, summary, "the parallel read counted otherwise");
                    assert!(
                        scan.points == agg.points,
                        "the parallel read's aggregate differs from the sequential one's"
                    );
                    // the scan reports repeats with another body after the rest: the same set
                    bad.sort();
                    scan_bad.sort();
                    assert!(
                        scan_bad == bad,
                        "the parallel read's bad records differ from the sequential one's"
                    );
                    summary
                }
                (Err(e), Err(_)) => return Err(e),
                (Ok(_), Err(e)) => panic!("only the parallel read refused the file: {e:#}"),
                (Err(e), Ok(_)) => panic!("only the sequential read refused the file: {e:#}"),
            };
            for (name, p) in &agg.points {
                let _ = decision_fit::thresholds::fit_point(p, self.config.policy(name));
            }
            anyhow::ensure!(summary.bad == 0, "{} bad records", summary.bad);
            Ok(())
        }
    }
    Ok(Box::new(Receipts {
        path: path.to_path_buf(),
        quarantine: path.with_file_name("bad.jsonl"),
        config: shipped_fit_config()?,
    }))
}

/// Receipt lines of both shapes with confidences across [0, 1], to put a fuzzed config's
/// policies to work.
fn sample_receipt_lines() -> Vec<String> {
    let mut lines = Vec::new();
    for i in 0..240u32 {
        let point = ["tool", "args", "route", "stop"][i as usize % 4];
        let c = f64::from(i) / 239.0;
        let status = if i % 7 == 0 { "failure" } else { "success" };
        lines.push(format!(
            r#"{{"id":"s{i}","at":"2026-11-30T12:00:00Z","point":"{point}","candidates":["a","b"],"result":{{"kind":"pick","id":"a","confidence":{c}}},"validation":"accepted","outcome":{{"status":"{status}"}}}}"#
        ));
        let outcome = if i % 5 == 0 {
            "tools_dispatched=1,denied=1,failed=0,aborted=0,concluded=false"
        } else {
            "tools_dispatched=2,denied=0,failed=0,aborted=0,concluded=true"
        };
        lines.push(format!(
            r#"{{"schemaVersion":1,"id":"k{i}","stage":"preStep","candidates":[{{"id":"t1","summary":"x"}},{{"id":"t2","summary":"y"}}],"result":{{"kind":"selected","candidate_id":"t1"}},"validation":"accepted","selectedProbability":{c},"observedOutcome":"{outcome}","createdAt":1764504000000}}"#
        ));
    }
    lines
}

/// `configs/fit.toml`: loaded, then its policies and outcome patterns applied to fixed
/// receipts, as `decision fit` would.
fn fit_config(path: &Path) -> Result<Box<dyn Runner>> {
    struct Fit {
        path: PathBuf,
        /// The sample receipts, read as `decision fit` reads its input.
        receipts: PathBuf,
    }
    impl Runner for Fit {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            write(&self.path, input);
            let config = FitConfig::load(&self.path)?;
            let mut agg = Aggregate::new(&config, BTreeMap::new());
            let opts = ReadOptions {
                outcome: config.outcome.clone(),
                progress: false,
            };
            receipts_io::for_each_receipt(std::slice::from_ref(&self.receipts), &opts, |item| {
                match item {
                    Ok(r) => agg.add(r),
                    Err(_) => agg.add_bad(),
                }
                Ok(())
            })?;
            for (name, p) in &agg.points {
                let _ = decision_fit::thresholds::fit_point(p, config.policy(name));
            }
            Ok(())
        }
    }
    let receipts = path.with_file_name("receipts.jsonl");
    write(
        &receipts,
        (sample_receipt_lines().join("\n") + "\n").as_bytes(),
    );
    Ok(Box::new(Fit {
        path: path.to_path_buf(),
        receipts,
    }))
}

fn sample_state(n: usize) -> State {
    State {
        id: "s".into(),
        task_id: "t".into(),
        point: "tool".into(),
        context: "customer: please cancel order #1000".into(),
        candidates: (0..n)
            .map(|i| decision_data::Candidate {
                id: format!("c{i}"),
                label: format!("option {i}"),
            })
            .collect(),
        answer: Some("c0".into()),
        teacher: None,
        after_error: false,
        rules: None,
        split: None,
    }
}

/// `decision.json`, as the worker and `bundle verify` read it: parsed and checked, its labels
/// encoded with the bundle's tokenizer, states rendered and encoded, points and temperatures
/// looked up.
fn decision_json(path: &Path) -> Result<Box<dyn Runner>> {
    struct Spec {
        path: PathBuf,
        tokenizer: tokenizers::Tokenizer,
        states: Vec<State>,
    }
    impl Runner for Spec {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            write(&self.path, input);
            let spec = DecisionSpec::from_file(&self.path)?;
            let _ = spec.point_for(&["verify", "answer", "inspect", "implement"]);
            let _ = spec.temperature_for("tool");
            let prompter = Prompter::new(&spec, self.tokenizer.clone(), 128)?;
            // The last state offers more candidates than any label list: refused, not rendered.
            for (i, s) in self.states.iter().enumerate() {
                let _ = prompter.render(s);
                let encoded = prompter.encode(s);
                if i + 1 < self.states.len() {
                    encoded?;
                }
            }
            Ok(())
        }
    }
    let tokenizer = decision_prompt::tokenizer::load(
        &repo().join("tests/fixtures/worker/bundle/tokenizer.json"),
    )?;
    Ok(Box::new(Spec {
        path: path.to_path_buf(),
        tokenizer,
        states: [2, 5, 30].into_iter().map(sample_state).collect(),
    }))
}

/// A model's `config.json`: parsed, its size and tensor list computed, written back and read
/// again, and the memory plan every `decision train` makes first.
fn model_config(path: &Path) -> Result<Box<dyn Runner>> {
    struct Config {
        path: PathBuf,
        run: RunConfig,
    }
    impl Runner for Config {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            write(&self.path, input);
            let config = Qwen3Config::from_file(&self.path)?;
            let _ = config.parameter_count();
            let _ = weights::expected_tensors(&config);
            let back = Qwen3Config::from_json(&config.to_hf_json());
            assert_eq!(
                back.ok().as_ref(),
                Some(&config),
                "config.json written back reads differently"
            );
            let plan = decision_train::plan::plan(&self.run, &config);
            let _ = plan.render(&self.run, None);
            Ok(())
        }
    }
    let run =
        RunConfig::load(&repo().join("configs/tiny.toml"), &[]).context("configs/tiny.toml")?;
    Ok(Box::new(Config {
        path: path.to_path_buf(),
        run,
    }))
}

/// `model.safetensors`: opened (header parsed), every tensor read as f32, names and shapes
/// checked against the tiny model's config, and loaded into the model as training and scoring
/// load it.
fn safetensors(path: &Path) -> Result<Box<dyn Runner>> {
    struct Weights {
        path: PathBuf,
        config: Qwen3Config,
    }
    impl Runner for Weights {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            write(&self.path, input);
            let files = [self.path.clone()];
            let ckpt = SafetensorsDir::open_files(&files)?;
            let names = ckpt.names();
            let mut unreadable = None;
            for n in &names {
                let _ = ckpt.shape(n);
                if let Err(e) = ckpt.read_f32(n) {
                    unreadable.get_or_insert(e);
                }
            }
            // Only a checkpoint of the tiny model's shape gets as far as the model.
            ckpt.check(&self.config, "fuzz")?;
            weights::load_model(
                &self.config,
                &files,
                "fuzz",
                &burn::prelude::Device::flex(),
                burn::tensor::DType::F32,
            )?;
            unreadable.map_or(Ok(()), Err)
        }
    }
    Ok(Box::new(Weights {
        path: path.to_path_buf(),
        config: Qwen3Config::from_file(&repo().join("tests/fixtures/model/tied/config.json"))?,
    }))
}

/// A bundle's `manifest.json` in a copy of the worker's fixture bundle: `decision bundle verify`
/// and `decision-worker`'s load (hashes, config, temperature, model) both read it.
fn manifest(path: &Path) -> Result<Box<dyn Runner>> {
    struct Manifest {
        path: PathBuf,
        bundle: PathBuf,
    }
    impl Runner for Manifest {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            write(&self.path, input);
            let verdict = decision_export::verify::verify(&self.bundle);
            decision_worker::bundle::Bundle::load(&self.bundle)?;
            anyhow::ensure!(
                verdict.ok(),
                "bundle verify: {}",
                verdict.problems.join("; ")
            );
            Ok(())
        }
    }
    let from = repo().join("tests/fixtures/worker/bundle");
    let bundle = path
        .parent()
        .context("the manifest's folder")?
        .to_path_buf();
    std::fs::create_dir_all(&bundle)?;
    for entry in std::fs::read_dir(&from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), bundle.join(entry.file_name()))?;
    }
    Ok(Box::new(Manifest {
        path: path.to_path_buf(),
        bundle,
    }))
}

/// The harness's own tests: an input starting with `panic` panics, `hang` loops, `alloc`
/// allocates 4 GiB.
fn selftest(_path: &Path) -> Result<Box<dyn Runner>> {
    struct SelfTest;
    impl Runner for SelfTest {
        fn run(&mut self, input: &[u8]) -> Result<()> {
            if input.starts_with(b"panic") {
                panic!("selftest: the input says panic");
            }
            if input.starts_with(b"hang") {
                loop {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            if input.starts_with(b"alloc") {
                let v = vec![1u8; 4 << 30];
                std::hint::black_box(&v);
            }
            Ok(())
        }
    }
    Ok(Box::new(SelfTest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed seed reaches its reader's end: accepted, except the ones named
    /// `refused-*` (a reader's error or a bad row is their right answer) and `finding-*` (inputs
    /// that once panicked, hung or allocated without bound: run, whatever they answer).
    #[test]
    fn every_seed_reads_as_its_name_says() {
        let mut checked = 0;
        for t in all().iter().filter(|t| t.builtin_seeds.is_empty()) {
            let work = tempfile::tempdir().unwrap();
            let path = work.path().join(t.file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut runner = (t.make)(&path).unwrap();
            let dir = repo().join("fuzz/corpus").join(t.name);
            let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            seeds.sort();
            assert!(!seeds.is_empty(), "{}: no seeds", dir.display());
            for seed in seeds {
                let name = seed.file_name().unwrap().to_string_lossy().into_owned();
                let result = runner.run(&std::fs::read(&seed).unwrap());
                if name.starts_with("refused-") {
                    assert!(result.is_err(), "{}/{name} was accepted", t.name);
                } else if !name.starts_with("finding-") {
                    assert!(
                        result.is_ok(),
                        "{}/{name}: {:#}",
                        t.name,
                        result.unwrap_err()
                    );
                }
                checked += 1;
            }
        }
        assert!(checked >= 20, "{checked} seeds");
    }
}
