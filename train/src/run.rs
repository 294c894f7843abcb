//! The pipelines of `decision score`, `decision train` and `decision eval`: check the paths,
//! open the outputs, call the library ([`crate::trainer::train`], [`crate::eval::evaluate`],
//! [`DecisionModel::score_encoded`]) and print what a user reads. The arguments are in `cli.rs`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use decision_data::paths::IoCheck;
use serde_json::json;

use crate::cli::{EvalArgs, ScoreArgs, TrainArgs};
use crate::eval::{EvalReport, comparison, evaluate, states_of_split, table};
use crate::model::decision_model::{DecisionModel, LoadOptions};
use crate::plan::gib;
use crate::run_config::RunConfig;
use crate::run_folder;
use crate::trainer::{Progress, TrainOptions, train as train_run};

/// `decision score`: score `--data` with `--model`, one line per state to `--out`.
pub fn score(args: ScoreArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let mut io = IoCheck::new();
    io.inputs("--data", &args.data)
        .output_file("--out", &args.out);
    if Path::new(&args.model).exists() {
        io.input("--model", &args.model);
    }
    io.check()?;
    crate::plan::check_memory_env()?;
    let opts = LoadOptions {
        backend: args.backend,
        precision: args.dtype,
        hub: None,
        trains: false,
    };
    // Opened now, so that an --out that cannot be written fails before the scoring; nothing
    // appears there (and the temporary file, and any folder made for it, go) unless every state
    // is scored.
    let mut staged = decision_data::outputs::Staged::new();
    let out_file = staged.file("--out", &args.out)?;
    let model = DecisionModel::load_as(&format!("--model {}", args.model), &args.model, &opts)?;
    eprintln!(
        "model {} ({} parameters, {} layers) on {} in {:?}",
        model.origin,
        model.config.parameter_count(),
        model.config.num_hidden_layers,
        args.backend,
        args.dtype
    );
    let states = decision_data::read_states(
        &args.data,
        decision_data::ValidateOptions {
            max_options: model.spec.max_options,
            ..Default::default()
        },
    )?;
    let encoded = states
        .iter()
        .map(|s| model.encode(s))
        .collect::<Result<Vec<_>>>()?;
    let points: Vec<&str> = states.iter().map(|s| s.point.as_str()).collect();
    let tokens: usize = encoded.iter().map(|e| e.input_ids.len()).sum();

    let bar = decision_data::progress::bar(Some(states.len() as u64), "states");
    let t0 = Instant::now();
    let scores =
        crate::model::gpu_watch::explaining_gpu_failures(&model.model, args.batch_size, || {
            model.score_encoded(&encoded, &points, args.batch_size, &mut |n| {
                bar.inc(n as u64)
            })
        })?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    // Nothing reaches --out from a model whose logits overflowed (a NaN pick has no confidence).
    let logits: Vec<Vec<f64>> = scores.iter().map(|s| s.logits.clone()).collect();
    crate::model::score::check_finite(&logits, &|i| {
        format!(
            "state {:?} (state {} of {} read from --data)",
            states[i].id,
            i + 1,
            states.len()
        )
    })
    .with_context(|| format!("--model {}", args.model))?;

    for ((state, enc), sc) in states.iter().zip(&encoded).zip(&scores) {
        let mut line = json!({
            "id": state.id,
            "pick": state.candidates[sc.pick_index].id,
            "confidence": sc.confidence,
            "probs": sc.probs,
        });
        if args.emit_tokens {
            line["input_ids"] = json!(enc.input_ids);
            line["attention_mask"] = json!(vec![1u8; enc.input_ids.len()]);
            line["option_token_ids"] = json!(enc.option_token_ids);
            line["option_logits"] = json!(sc.logits);
            line["temperature"] = json!(sc.temperature);
            line["truncated"] = json!(enc.truncated);
        }
        let out = staged.get(out_file);
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    staged
        .publish()
        .with_context(|| format!("writing {}", args.out.display()))?;

    let truncated = encoded.iter().filter(|e| e.truncated).count();
    eprintln!(
        "scored {} states ({} prompt tokens) in {:.2}s: {:.1} states/s, {:.0} tokens/s; {} truncated to max_tokens = {}; wrote {} (total {:.2}s)",
        states.len(),
        tokens,
        secs,
        states.len() as f64 / secs.max(1e-9),
        tokens as f64 / secs.max(1e-9),
        truncated,
        model.prompter.max_tokens,
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// `decision train`: plan (`--plan`) or train, then print the run's summary.
pub fn train(args: &TrainArgs) -> Result<ExitCode> {
    let mut sets = args.set.clone();
    if let Some(b) = args.backend {
        sets.push(format!("train.backend={b}"));
    }
    let cfg = RunConfig::load(&args.config, &sets)?;
    let run_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name));
    check_train_paths(&cfg, &run_dir, args.out.is_some())?;
    if args.plan {
        // The dtype the device will run, then the plan for it.
        let gpu = crate::model::backend::device(cfg.train.backend)?;
        let given = cfg.train.dtype;
        let cfg = crate::plan::resolve_dtype(&cfg, &gpu)?;
        if given != cfg.train.dtype {
            println!(
                "dtype: {given} -> {} (this device computes {})",
                cfg.train.dtype,
                crate::Precision::names(&crate::model::backend::supported_precisions(&gpu))
            );
        }
        let arch = crate::plan::architecture(&cfg)?;
        if let Some(source) = crate::plan::describe_source(&cfg, &arch)? {
            print!("{source}");
        }
        let device = crate::plan::device_limit(cfg.train.backend, &gpu)?;
        let plan = match &device {
            Some(dev) => crate::plan::plan(&cfg, &arch).fitted(dev),
            None => crate::plan::plan(&cfg, &arch),
        };
        print!("{}", plan.render(&cfg, device.as_ref()));
        if let Some(limit) = crate::model::backend::largest_buffer(&gpu) {
            let (bytes, what) = &plan.largest_buffer;
            println!(
                "  largest tensor: {what}, {}; the adapter's buffers hold up to {}",
                crate::plan::size(*bytes),
                crate::plan::size(limit)
            );
            if let Err(e) = plan.check_buffers(
                &cfg,
                limit,
                &crate::trainer::adapter_name(),
                &crate::model::backend::supported_precisions(&gpu),
            ) {
                println!("  does not fit: {e:#}");
                return Ok(ExitCode::from(1));
            }
        }
        if let Some(dev) = &device {
            if let Err(e) = plan.check(&cfg, &arch, dev) {
                println!("  does not fit: {e:#}");
                return Ok(ExitCode::from(1));
            }
            println!("  fits");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let opts = TrainOptions {
        resume: args.resume,
        progress: if std::io::stderr().is_terminal() {
            Progress::Bar
        } else {
            Progress::Lines
        },
        stop_after: None,
    };
    let s = train_run(&cfg, &run_dir, &opts)?;
    println!("run folder      {}", run_dir.display());
    println!(
        "steps           {} ({:.0} tokens/s, {:.1} s)",
        s.steps, s.tokens_per_s, s.wall_s
    );
    if let Some(peak) = s.gpu_memory_peak_bytes {
        // The plan for the dtype the device ran, beside what the runtime held.
        let device = crate::model::backend::device(cfg.train.backend)?;
        let ran = crate::plan::resolve_dtype(&cfg, &device)?;
        let planned = crate::plan::architecture(&ran)
            .map(|arch| format!(" (the plan: {})", gib(crate::plan::plan(&ran, &arch).total)))
            .unwrap_or_default();
        println!(
            "GPU memory      {} held by the runtime at most{planned}",
            gib(peak)
        );
    }
    println!(
        "valid           n = {}  accuracy {:.4}  nll {:.4}  brier {:.4}",
        s.valid_after.n, s.valid_after.accuracy, s.valid_after.nll, s.valid_after.brier
    );
    println!(
        "ECE             {:.4} at T = 1 -> {:.4} at the fitted temperatures",
        s.valid_before.ece, s.valid_after.ece
    );
    if let Some(f) = s.flip_rate {
        println!(
            "flip rate       {:.4} ({} extra candidate orders)",
            f, cfg.eval.permutations
        );
    }
    println!(
        "temperatures    global {:.3} {:?}",
        s.temperatures.global, s.temperatures.points
    );
    println!("model           {}", run_dir.join("final").display());
    Ok(ExitCode::SUCCESS)
}

/// `decision train`'s paths (`given`: the run folder came from `--out`), checked before any work: the run folder may not be, hold, or lie
/// inside the states it trains on or the model it starts from. (The config file may be the run's
/// own `run.toml`: resuming rewrites it with the same config.)
fn check_train_paths(cfg: &RunConfig, run_dir: &Path, given: bool) -> Result<()> {
    let flag = if given {
        "--out".to_string()
    } else {
        format!("the run folder (runs/<name>: {})", run_dir.display())
    };
    let mut io = IoCheck::new();
    io.output_folder(&flag, run_dir)
        .input("data.train", &cfg.data.train);
    if let Some(v) = &cfg.data.valid {
        io.input("data.valid", v);
    }
    if let Some(src) = &cfg.model.source
        && Path::new(src).exists()
    {
        io.input("model.source", src);
    }
    io.check()
}

/// `decision eval`: metrics, flip rate, shadow receipts and the baseline comparison.
pub fn eval(args: &EvalArgs) -> Result<ExitCode> {
    let (flag, src) = match (&args.run, &args.model) {
        (Some(r), _) => ("--run", r.to_string_lossy().into_owned()),
        (None, Some(m)) => ("--model", m.clone()),
        (None, None) => bail!("give --run RUN_DIR or --model SRC"),
    };
    // Nothing written may land on what is read (the states above all).
    let mut io = IoCheck::new();
    run_folder::inputs(&mut io, flag, Path::new(&src));
    if let Some(b) = &args.baseline {
        run_folder::inputs(&mut io, "--baseline", Path::new(b));
    }
    if let Some(d) = &args.data {
        io.input("--data", d);
    }
    if let Some(r) = &args.receipts {
        io.output_file("--receipts", r);
    }
    if let Some(r) = &args.report {
        io.output_file("--report", r);
    }
    io.check()?;
    crate::plan::check_memory_env()?;
    if let Some(r) = &args.receipts
        && matches!(
            decision_data::Format::from_path(r),
            Ok(decision_data::Format::Parquet)
        )
    {
        bail!(
            "--receipts {}: eval writes shadow receipts as JSON Lines; name the file .jsonl \
             (decision fit reads both formats)",
            r.display()
        );
    }
    // Every output is opened now, so one that cannot be written stops eval before the model is
    // loaded; nothing lands unless the whole evaluation succeeds.
    let mut staged = decision_data::outputs::Staged::new();
    let receipts_file = match &args.receipts {
        Some(r) => Some(staged.file("--receipts", r)?),
        None => None,
    };
    let report_file = match &args.report {
        Some(r) => Some(staged.file("--report", r)?),
        None => None,
    };
    let loaded = run_folder::load(flag, &src, args.backend)?;
    // the split evaluated: of --data, or the run's validation states
    let split = match (&args.data, &args.split) {
        (Some(_), s) => s.clone().unwrap_or_else(|| "all".into()),
        (None, _) => "valid".into(),
    };
    let (states, data_name) = match (&args.data, &loaded.run) {
        (Some(d), _) => (
            states_of_split(d, &split, loaded.dm.spec.max_options)?,
            d.display().to_string(),
        ),
        (None, Some(cfg)) => {
            // bad rows a skip_bad run set aside are quarantined again, but not over the run's
            // own quarantine files
            let scratch = tempfile::tempdir().context("a temporary folder")?;
            let valid = run_folder::validation_states(cfg, scratch.path()).with_context(|| {
                format!(
                    "{src}: reading the run's validation states ([data] in run.toml; a relative \
                     path there is read from the current folder, so run eval where training \
                     ran, or give --data)"
                )
            })?;
            (valid, "the run's validation states".to_string())
        }
        (None, None) => bail!("{flag} {src} is not a run folder (no run.toml): give --data STATES"),
    };
    if states.is_empty() {
        bail!("no states to evaluate in {data_name} (split {split})");
    }
    // Metrics need an answer key; unlabelled states get only their receipts (pending for fit).
    let unlabelled = states.iter().filter(|s| s.answer.is_none()).count();
    if unlabelled == states.len() && args.receipts.is_none() {
        bail!(
            "{data_name} (split {split}): none of its {} states has an answer, so there is \
             nothing to measure; `decision score` scores unlabelled states",
            states.len()
        );
    }
    if unlabelled > 0 {
        eprintln!(
            "{unlabelled} of {} states have no answer: they are left out of the metrics and the \
             flip rate{}",
            states.len(),
            if args.receipts.is_some() {
                " (their receipts are written, without a shadow reference)"
            } else {
                ""
            }
        );
    }
    let show = std::io::stderr().is_terminal();
    if show {
        eprintln!(
            "evaluating {} on {} states of {data_name}",
            loaded.name,
            states.len()
        );
    }
    // A GPU runtime's failure is an error that says what to change.
    let evaluate_with = |dm: &DecisionModel| {
        crate::model::gpu_watch::explaining_gpu_failures(&dm.model, args.batch_size, || {
            evaluate(dm, &states, args.permutations, args.seed, args.batch_size)
        })?
    };
    let (report, scored) = evaluate_with(&loaded.dm)?;
    // A prompt over max_tokens is cut to score it here; the worker answers `capacity` instead,
    // and the harness decides: such a state's receipt is an abstention.
    let n_cut = scored.iter().filter(|s| s.truncated).count();
    if n_cut > 0 {
        eprintln!(
            "{n_cut} of {} states have prompts over max_tokens = {}: scored cut to fit, but \
             decision-worker would answer `capacity` for them, so their receipts are abstentions",
            states.len(),
            loaded.dm.prompter.max_tokens
        );
    }
    let name = args.name.clone().unwrap_or_else(|| loaded.name.clone());
    let mut out = EvalReport {
        schema: "decision-eval/1".into(),
        model: name.clone(),
        data: data_name.clone(),
        split: split.clone(),
        report: report.clone(),
        baseline: None,
    };
    println!("{name} on {data_name} (split {split}):");
    print!("{}", table(&report));
    // The receipts need only the model's temperatures: they are made now, and the model goes
    // before a baseline loads (two 4B models at once would hold 16 GB).
    let mut wrote = None;
    if let (Some(path), Some(slot)) = (&args.receipts, receipts_file) {
        let at = crate::receipts::now_rfc3339();
        let receipts: Vec<_> = states
            .iter()
            .zip(&scored)
            .map(|(st, sc)| {
                let probs = sc.probs(loaded.dm.temperature(&st.point) as f32);
                crate::receipts::shadow_receipt(
                    st,
                    (!sc.truncated).then_some(&probs[..]),
                    &name,
                    &at,
                )
            })
            .collect();
        crate::receipts::write_receipts_to(staged.get(slot), &receipts)?;
        wrote = Some((receipts.len(), path));
    }
    drop(loaded);
    if let Some(b) = &args.baseline {
        let base = run_folder::load("--baseline", b, args.backend)?;
        let (base_report, _) = evaluate_with(&base.dm)?;
        println!("\n{name} against baseline {}:", base.name);
        print!("{}", comparison(&report, &base_report));
        out.baseline = Some(Box::new(EvalReport {
            schema: "decision-eval/1".into(),
            model: base.name,
            data: data_name.clone(),
            split: split.clone(),
            report: base_report,
            baseline: None,
        }));
    }
    if let Some(slot) = report_file {
        let mut json = serde_json::to_vec_pretty(&out)?;
        json.push(b'\n');
        std::io::Write::write_all(staged.get(slot), &json)?;
    }
    staged.publish()?;
    if let Some((n, path)) = wrote {
        println!("wrote {n} shadow receipts to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
