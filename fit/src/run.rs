//! `decision fit`: the run that ties config, reading, aggregation, policies, thresholds.json,
//! quarantine, drift and report together (the arguments are in `cli.rs`, URL inputs and outputs
//! in `remote.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use decision_data::paths::IoCheck;
use decision_data::receipts_io::{Input, ReadOptions, receipt_files, scan_unique_receipts};

use crate::aggregate::Aggregate;
use crate::cli::FitArgs;
use crate::config::FitConfig;
use crate::drift::{self, Previous};
use crate::outputs::{Outputs, quarantine_path};
use crate::remote::{self, Remote};
use crate::report;
use crate::thresholds::{self, PointFit, SCHEMA, Source, Thresholds};

/// What a fit produced (for callers other than the command line).
pub struct FitOutcome {
    pub thresholds: Thresholds,
    pub aggregate: Aggregate,
    pub drift: Option<Vec<drift::DriftRow>>,
    pub quarantine: PathBuf,
    /// The first bad records, one line each (file, row, field, reason).
    pub bad_lines: Vec<String>,
}

/// Fit, write thresholds.json, the quarantine and (when asked) the report.
///
/// Each receipt id counts once: a later copy with the same body is dropped (counted in
/// `source.duplicates`), one with another body is a bad record. Every output is opened before a
/// receipt is read and all are published together at the end, thresholds.json last; an input
/// without a single valid receipt is an error, and then nothing is written.
///
/// `--receipts`, `--previous` and `--out` may be object-store URLs (`remote.rs`).
pub fn fit(args: &FitArgs) -> Result<FitOutcome> {
    // Everything that can be refused is refused before a receipt is read, the config before
    // any input is even looked at.
    let config = FitConfig::load(&args.config)?;
    // URLs are fetched into local files first; the fit itself reads only local ones.
    let remote = remote::any_url(args)
        .then(|| Remote::fetch(args))
        .transpose()?;
    let local = remote.as_ref().map_or(args, |r| &r.local);
    let previous = local.previous.as_deref().map(Previous::read).transpose()?;
    let inputs = match &remote {
        Some(r) => r.inputs.clone(),
        None => receipt_files(&args.receipts)?
            .into_iter()
            .map(Input::local)
            .collect(),
    };
    let mut outcome = fit_inputs(local, config, previous, inputs)?;
    if let Some(r) = &remote
        && let Some(q) = r.publish()?
    {
        outcome.quarantine = q;
    }
    Ok(outcome)
}

/// [`fit`] of these inputs (local files, under their own or their URLs' names), with the config
/// and the previous thresholds already read.
fn fit_inputs(
    args: &FitArgs,
    config: FitConfig,
    previous: Option<Previous>,
    inputs: Vec<Input>,
) -> Result<FitOutcome> {
    let files: Vec<PathBuf> = inputs.iter().map(|i| i.path.clone()).collect();
    let quarantine = quarantine_path(&args.out);
    let errors_file = decision_data::quarantine::errors_path(&quarantine);
    // No output may land on an input (decision_data::paths). --previous may be replaced by --out:
    // naming it there is the explicit way to update the thresholds in place.
    let outputs = |io: &mut IoCheck, with_out: bool| {
        if with_out {
            io.output_file("--out", &args.out);
        }
        io.output_file("--out's quarantine", &quarantine)
            .output_file("--out's quarantine errors file", &errors_file);
        if let Some(d) = &args.report {
            io.output_folder("--report", d);
        }
    };
    let mut io = IoCheck::new();
    io.inputs("--receipts", &args.receipts)
        .inputs("--receipts", &files)
        .input("--config", &args.config);
    outputs(&mut io, true);
    io.check()?;
    if let Some(p) = &args.previous {
        let mut io = IoCheck::new();
        io.input("--previous", p);
        outputs(&mut io, false);
        io.check()?;
    }

    // A folder that cannot be written stops the run here, before the long read.
    let mut staged = Outputs::open(&args.out, &quarantine, args.report.as_deref())?;

    let cuts = previous.as_ref().map(Previous::cuts).unwrap_or_default();
    let mut bad_lines: Vec<String> = Vec::new();
    let opts = ReadOptions {
        outcome: config.outcome.clone(),
        progress: true,
    };
    let q = staged.quarantine();
    let new = || Aggregate::new(&config, cuts.clone());
    let (mut agg, summary) = scan_unique_receipts(&inputs, &opts, &new, &mut |b| {
        q.add(b)?;
        if bad_lines.len() < 200 {
            bad_lines.extend(b.lines());
        }
        Ok(())
    })?;
    agg.records += summary.bad;
    agg.bad = summary.bad;
    agg.drop_unseen();
    debug_assert_eq!(summary.records, agg.records + summary.duplicates);
    if agg.valid() == 0 {
        let inputs: Vec<String> = summary
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        let what = if summary.records == 0 {
            "no receipts at all".to_string()
        } else {
            format!(
                "{} records, every one bad{}",
                summary.records,
                bad_lines
                    .iter()
                    .take(5)
                    .map(|l| format!("\n  {l}"))
                    .collect::<String>()
            )
        };
        anyhow::bail!(
            "no valid receipts to fit in {}: {what}\nnothing was written",
            inputs.join(", ")
        );
    }

    let points: BTreeMap<String, PointFit> = agg
        .points
        .iter()
        .map(|(name, p)| (name.clone(), thresholds::fit_point(p, config.policy(name))))
        .collect();
    let t = Thresholds {
        schema: SCHEMA,
        fitted_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        source: Source {
            files: summary
                .files
                .iter()
                .map(|f| f.display().to_string())
                .collect(),
            sha256: summary.sha256.clone(),
            records: summary.records,
            bad: agg.bad,
            duplicates: summary.duplicates,
            valid: agg.valid(),
            quarantine: quarantine
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
        },
        points,
    };
    let drift_rows = previous
        .as_ref()
        .map(|p| drift::compare(p, &agg.points, &t.points));
    let rendered = match &args.report {
        None => None,
        Some(_) => {
            let md = report::markdown(&t, drift_rows.as_deref(), &bad_lines, agg.bad);
            let html = report::html(&t, &md)?;
            Some((md, html))
        }
    };
    staged.publish(&t, rendered)?;
    Ok(FitOutcome {
        thresholds: t,
        aggregate: agg,
        drift: drift_rows,
        quarantine,
        bad_lines,
    })
}

fn fmt(x: Option<f64>) -> String {
    x.map_or_else(|| "—".into(), |v| format!("{v:.3}"))
}

pub fn run(args: FitArgs) -> Result<ExitCode> {
    let out = fit(&args)?;
    let t = &out.thresholds;
    for l in out.bad_lines.iter().take(20) {
        eprintln!("bad record: {l}");
    }
    if t.source.bad > 20 {
        eprintln!(
            "… {} bad records in all; every one is listed in the quarantine's errors file",
            t.source.bad
        );
    }
    if t.source.duplicates > 0 {
        eprintln!(
            "note: {} receipts repeat an id already read with the same body and were counted once \
             (the same file given twice, overlapping folders, or a receipt in two shards?)",
            t.source.duplicates
        );
    }
    println!(
        "read {} receipts from {} file(s): {} valid, {} bad, {} duplicates dropped{}",
        t.source.records,
        t.source.files.len(),
        t.source.valid,
        t.source.bad,
        t.source.duplicates,
        if t.source.bad > 0 {
            format!(" (quarantined in {})", out.quarantine.display())
        } else {
            String::new()
        }
    );
    for (name, p) in &t.points {
        println!(
            "  {name:<14} {:<22} threshold {:<6} judged {:>8}  coverage {:.3}  success above {} [{}]",
            serde_json::to_value(p.status)?.as_str().unwrap_or_default(),
            fmt(p.threshold),
            p.judged,
            p.coverage,
            fmt(p.success_above),
            fmt(p.success_above_lower),
        );
    }
    if let Some(rows) = &out.drift {
        println!(
            "\ncompared with {}:\n{}",
            args.previous
                .as_ref()
                .expect("drift needs --previous")
                .display(),
            drift::markdown(rows)
        );
    }
    println!("wrote {}", args.out.display());
    if let Some(d) = &args.report {
        println!(
            "wrote {} and {}",
            d.join("report.md").display(),
            d.join("report.html").display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
