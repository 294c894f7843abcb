//! `decision-worker --model BUNDLE [--point POINT]`: keel's local selector worker. See the
//! `decision_worker` library and the README section "Running it under keel".

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use decision_worker::bundle::Bundle;
use decision_worker::log::Log;
use decision_worker::protocol::{READY, UNAVAILABLE, frame};
use decision_worker::{ServeOptions, serve};

const USAGE: &str = "usage: decision-worker --model BUNDLE [--point POINT]

keel's local selector worker: verifies and loads an exported bundle (manifest hashes,
model.onnx in tract, tokenizer.json, decision.json, thresholds.json), prints the ready line
and answers one JSON request per line on stdin with a KEEL_LAYA_JSON: line on stdout.

  --model BUNDLE   the bundle folder written by `decision export`
  --point POINT    name every request's decision point POINT (default: decision.json's
                   point_rules; also DECISION_WORKER_POINT)

environment:
  DECISION_WORKER_LOG=DIR    daily receipts (receipts-YYYY-MM-DD.jsonl) and log lines
                             (worker-YYYY-MM-DD.log) in DIR
  DECISION_WORKER_POINT=P    as --point

exit: 0 at end of input, 2 when the bundle cannot be loaded (after the model_unavailable line)";

struct Args {
    model: PathBuf,
    point: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut model = None;
    let mut point = None;
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy().into_owned();
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |name: &str| -> Result<std::ffi::OsString, String> {
            match &inline {
                Some(v) => Ok(v.into()),
                None => it.next().ok_or(format!("{name} needs a value")),
            }
        };
        match key.as_str() {
            "--model" => model = Some(PathBuf::from(value("--model")?)),
            "--point" => point = Some(value("--point")?.to_string_lossy().into_owned()),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let model = model.ok_or("--model BUNDLE is required")?;
    let point = point.or_else(|| {
        std::env::var("DECISION_WORKER_POINT")
            .ok()
            .filter(|p| !p.is_empty())
    });
    if let Some(p) = &point
        && !decision_prompt::spec::valid_point(p)
    {
        return Err(format!("point {p:?} does not match [a-z][a-z0-9_]*"));
    }
    Ok(Args { model, point })
}

fn unavailable(log: &mut Log, reason: &str) -> ExitCode {
    log.note(&format!("model_unavailable: {reason}"));
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(frame(UNAVAILABLE).as_bytes());
    let _ = out.flush();
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut log = Log::from_env();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => return unavailable(&mut log, &format!("{e}\n{USAGE}")),
    };
    let started = std::time::Instant::now();
    let loaded = std::panic::catch_unwind(|| Bundle::load(&args.model));
    let bundle = match loaded {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            return unavailable(&mut log, &format!("{}: {e:#}", args.model.display()));
        }
        Err(_) => {
            return unavailable(
                &mut log,
                &format!("{}: loading panicked", args.model.display()),
            );
        }
    };
    log.note(&format!(
        "loaded {} in {:.0} ms: bundle {}, model.onnx {}, max_options {}, max_tokens {}, {}",
        args.model.display(),
        started.elapsed().as_secs_f64() * 1000.0,
        &bundle.bundle_sha256[..12],
        &bundle.model_sha256[..12],
        bundle.prompter.max_options,
        bundle.prompter.max_tokens,
        match &args.point {
            Some(p) => format!("every request at point {p}"),
            None => format!(
                "points by rule: {}",
                bundle
                    .spec
                    .effective_point_rules()
                    .iter()
                    .map(|r| match &r.candidates {
                        Some(c) => format!("{{{}}} -> {}", c.join(","), r.point),
                        None => format!("otherwise {}", r.point),
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        }
    ));
    if !bundle.has_thresholds {
        log.note("the bundle has no thresholds.json: every decision escalates (shadow mode)");
    }
    for (point, t) in &bundle.thresholds {
        match t {
            None => log.note(&format!("{point}: threshold null, always escalates")),
            Some(t) if *t < 0.525 => log.note(&format!(
                "{point}: threshold {t} is below 0.525, so keel's own gates (p < 0.4, margin < 0.05) \
                 can reject picks this threshold accepts; receipts mark them with keel_gate"
            )),
            Some(_) => {}
        }
    }
    if !bundle.unlisted.is_empty() {
        log.note(&format!(
            "files not in manifest.json, ignored: {}",
            bundle.unlisted.join(", ")
        ));
    }
    let opts = ServeOptions { point: args.point };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if out
        .write_all(frame(READY).as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        log.note("stdout is closed; exiting");
        return ExitCode::from(1);
    }
    let stdin = std::io::stdin();
    match serve(&bundle, &opts, stdin.lock(), &mut out, &mut log) {
        Ok(n) => {
            log.note(&format!("end of input after {n} requests"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            log.note(&format!("stopping: {e:#}"));
            ExitCode::from(1)
        }
    }
}
