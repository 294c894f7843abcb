//! The real `decision-worker` binary, driven as keel drives it, with every one of keel's checks
//! (written here again, apart from the worker's own copy, from
//! `../shared/reference/keel-integration.md`).
//!
//! The fixture (tests/fixtures/worker, made by `scripts/make_worker_fixture.py`) is a bundle
//! exported from the tiny test model with per-point temperatures and thresholds, 100 requests in
//! keel's shape (1-16 candidates; keel's preStep focus set for a quarter; five too long for the
//! model's 128 tokens), and `decision score`'s answers for the same states.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

const PREFIX: &str = "KEEL_LAYA_JSON:";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/worker")
}

/// A copy of the fixture bundle in `root/bundle`, to change.
fn copy_of_fixture_bundle(root: &Path) -> PathBuf {
    let bundle = root.join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    for e in std::fs::read_dir(fixture().join("bundle")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bundle.join(e.file_name())).unwrap();
    }
    bundle
}

/// The worker on `bundle` refuses it as keel expects (the refusal handshake, exit 2); its stderr.
fn refused(bundle: &Path, env: &[(&str, &Path)]) -> String {
    let mut k = Keel::spawn(bundle, env, None);
    assert_eq!(
        k.handshake(),
        json!({"ready": false, "error": "model_unavailable"})
    );
    let (code, stderr) = k.finish();
    assert_eq!(code, 2);
    stderr
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// keel's side of the pipe: it reads at most 8 lines per reply, skips up to 8 KiB of unprefixed
/// output, and fails on a line over 64 KiB or end of file.
struct Keel {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Keel {
    fn spawn(bundle: &Path, env: &[(&str, &Path)], point: Option<&str>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_decision-worker"));
        cmd.arg("--model")
            .arg(bundle)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env_remove("DECISION_WORKER_LOG")
            .env_remove("DECISION_WORKER_POINT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(p) = point {
            cmd.env("DECISION_WORKER_POINT", p);
        }
        let mut child = cmd.spawn().expect("spawn decision-worker");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// The next framed message, as keel reads it.
    fn message(&mut self) -> Result<Value, String> {
        let mut skipped = 0usize;
        for _ in 0..8 {
            let mut line = Vec::new();
            let n = (&mut self.stdout)
                .take(64 * 1024 + 2)
                .read_until(b'\n', &mut line)
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("end of file".into());
            }
            if line.len() > 64 * 1024 {
                return Err("a line over 64 KiB".into());
            }
            let text = String::from_utf8(line).map_err(|e| e.to_string())?;
            let text = text.trim_end_matches(['\n', '\r']);
            match text.strip_prefix(PREFIX) {
                Some(json) => return serde_json::from_str(json).map_err(|e| e.to_string()),
                None => {
                    skipped += text.len();
                    if skipped > 8 * 1024 {
                        return Err("over 8 KiB of unprefixed output".into());
                    }
                }
            }
        }
        Err("no framed message within 8 lines".into())
    }

    fn handshake(&mut self) -> Value {
        self.message().expect("a ready message")
    }

    fn send_raw(&mut self, line: &[u8]) {
        let w = self.stdin.as_mut().unwrap();
        w.write_all(line).unwrap();
        w.write_all(b"\n").unwrap();
        w.flush().unwrap();
    }

    fn ask(&mut self, request: &Value) -> Value {
        self.send_raw(request.to_string().as_bytes());
        self.message().expect("a reply")
    }

    /// Close stdin and wait: the exit code and stderr.
    fn finish(mut self) -> (i32, String) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.code().unwrap_or(-1), err)
    }
}

#[derive(Debug, PartialEq)]
enum Verdict {
    Taken(String),
    Abstained,
    LowProbability,
    LowConfidence,
    Ambiguous,
}

/// keel's checks on a decision reply, in its order, then its gates.
fn keel_checks(ids: &[String], reply: &Value) -> Verdict {
    let choice = reply["choice"].as_str().expect("choice is a string");
    let probs = reply["probabilities"]
        .as_object()
        .expect("probabilities is an object");
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.push("escalate");
    want.sort();
    let mut got: Vec<&str> = probs.keys().map(String::as_str).collect();
    got.sort();
    assert_eq!(got, want, "key set");
    assert!(want.contains(&choice), "choice {choice} is a key");
    let p: BTreeMap<&str, f64> = probs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_f64().expect("a number")))
        .collect();
    for (k, x) in &p {
        assert!(x.is_finite() && (0.0..=1.0).contains(x), "p[{k}] = {x}");
    }
    let sum: f64 = p.values().sum();
    assert!((sum - 1.0).abs() <= 0.01, "sum {sum}");
    let max = p.values().cloned().fold(f64::MIN, f64::max);
    assert!(
        p[choice] + 1e-8 >= max,
        "p[choice] {} < max {max}",
        p[choice]
    );
    let c = reply["confidence"].as_f64().expect("confidence");
    assert!((0.0..=1.0).contains(&c), "confidence {c}");
    if choice == "escalate" {
        return Verdict::Abstained;
    }
    if p[choice] < 0.4 {
        return Verdict::LowProbability;
    }
    if c < 0.1 {
        return Verdict::LowConfidence;
    }
    let runner_up = p
        .iter()
        .filter(|(k, _)| **k != choice)
        .map(|(_, v)| *v)
        .fold(0.0, f64::max);
    if p[choice] - runner_up < 0.05 {
        return Verdict::Ambiguous;
    }
    Verdict::Taken(choice.to_string())
}

fn ids_of(request: &Value) -> Vec<String> {
    request["criteria"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[0].as_str().unwrap().to_string())
        .filter(|id| id != "escalate")
        .collect()
}

fn thresholds() -> BTreeMap<String, f64> {
    let t: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("bundle/thresholds.json")).unwrap(),
    )
    .unwrap();
    t["points"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["threshold"].as_f64().unwrap()))
        .collect()
}

fn receipts(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    for f in files {
        out.extend(read_jsonl(&f));
    }
    out
}

#[test]
fn answers_like_decision_score_and_passes_every_keel_check() {
    let requests = read_jsonl(&fixture().join("requests.jsonl"));
    let expected: BTreeMap<usize, Value> = read_jsonl(&fixture().join("expected.jsonl"))
        .into_iter()
        .map(|e| (e["request"].as_u64().unwrap() as usize, e))
        .collect();
    let th = thresholds();
    let log = tempfile::tempdir().unwrap();
    let mut keel = Keel::spawn(
        &fixture().join("bundle"),
        &[("DECISION_WORKER_LOG", log.path())],
        None,
    );
    assert_eq!(
        keel.handshake(),
        json!({"ready": true, "model": "laya-coreml"})
    );

    let (mut picks, mut escalations, mut capacity, mut max_dp) = (0, 0, 0, 0f64);
    let mut keel_vetoes = 0;
    for (i, req) in requests.iter().enumerate() {
        let ids = ids_of(req);
        let reply = keel.ask(req);
        let Some(e) = expected.get(&i) else {
            // A single candidate: not a question the model was trained on; it escalates.
            assert_eq!(ids.len(), 1, "request {i}");
            assert_eq!(keel_checks(&ids, &reply), Verdict::Abstained, "{reply}");
            escalations += 1;
            continue;
        };
        if e["truncated"].as_bool().unwrap() {
            assert_eq!(reply, json!({"error": "capacity"}), "request {i}");
            capacity += 1;
            continue;
        }
        let verdict = keel_checks(&ids, &reply);
        if reply["choice"] != "escalate"
            && verdict != Verdict::Taken(reply["choice"].as_str().unwrap().into())
        {
            keel_vetoes += 1;
        }
        let probs: Vec<f64> = serde_json::from_value(e["probs"].clone()).unwrap();
        let conf = e["confidence"].as_f64().unwrap();
        let point = e["point"].as_str().unwrap();
        let t = th[point];
        let p = &reply["probabilities"];
        // An escalation divides the calibrated probabilities by 1 + p_max.
        let scale = if reply["choice"] == "escalate" {
            1.0 + reply["confidence"].as_f64().unwrap()
        } else {
            1.0
        };
        assert_eq!(ids.len(), probs.len(), "request {i}");
        // Every option once, besides the `escalate` entry an escalation's reply carries.
        let options = p
            .as_object()
            .map(|o| o.keys().filter(|k| k.as_str() != "escalate").count());
        assert_eq!(options, Some(ids.len()), "request {i}: {p}");
        for (id, want) in ids.iter().zip(&probs) {
            let got = p[id].as_f64().unwrap() * scale;
            max_dp = max_dp.max((got - want).abs());
            assert!(
                (got - want).abs() <= 1e-5,
                "request {i} {id}: {got} vs {want}"
            );
        }
        assert!((reply["confidence"].as_f64().unwrap() - conf).abs() <= 1e-5);
        if (conf - t).abs() < 1e-5 {
            continue; // too close to the threshold to say which side float noise puts it
        }
        if conf >= t {
            assert_eq!(reply["choice"], e["pick"], "request {i}: {conf} >= {t}");
            assert_eq!(p["escalate"], 0.0);
            picks += 1;
        } else {
            assert_eq!(verdict, Verdict::Abstained, "request {i}: {conf} < {t}");
            escalations += 1;
        }
    }
    eprintln!(
        "{picks} picks ({keel_vetoes} vetoed by keel's gates), {escalations} escalations, \
         {capacity} capacity, max |dp| vs decision score {max_dp:.2e}"
    );
    assert!(picks >= 20 && escalations >= 20 && capacity >= 3);

    // Capacity: more candidates than max_options (16).
    let many: Vec<Value> = (0..17)
        .map(|i| json!([format!("m{i}"), "0G: a model"]))
        .chain([json!(["escalate", "None of these steps helps the task"])])
        .collect();
    let r = keel.ask(&json!({"state": "task: x\ncontext: y", "criteria": many}));
    assert_eq!(r, json!({"error": "capacity"}));
    // Malformed lines answer inference and the worker goes on.
    for bad in [
        &b"not json"[..],
        br#"{"state": 3, "criteria": []}"#,
        br#"{"state": "s", "criteria": [["a", "x"], ["a", "y"]]}"#,
        br#"{"state": "s", "criteria": [["escalate", "None"]]}"#,
        &vec![b'x'; 2 << 20][..],
    ] {
        keel.send_raw(bad);
        assert_eq!(keel.message().unwrap(), json!({"error": "inference"}));
    }
    let again = keel.ask(&requests[0]);
    let verdict = keel_checks(&ids_of(&requests[0]), &again);
    if again["choice"] != "escalate"
        && verdict != Verdict::Taken(again["choice"].as_str().unwrap().into())
    {
        keel_vetoes += 1;
    }
    let (code, stderr) = keel.finish();
    assert_eq!(code, 0, "end of input exits 0; stderr: {stderr}");

    // The log: one receipt per answered decision (capacity ones as abstentions), readable by
    // decision-data's receipt reader, which fit uses.
    let got = receipts(log.path());
    let answered = requests.len() + 1 + 1; // the 100, the 17-candidate one, the repeat
    assert_eq!(got.len(), answered);
    let (good, bad, _) =
        decision_data::receipts_io::read_receipts(&[log.path().to_path_buf()], &Default::default())
            .unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(good.len(), answered);
    let pre_step = got.iter().filter(|r| r["point"] == "pre_step").count();
    assert_eq!(pre_step, 25 + 1, "keel's focus set names pre_step");
    for r in &got {
        assert!(r.get("outcome").is_none(), "outcome pending");
        let w = &r["worker"];
        assert_eq!(w["bundle_sha256"].as_str().unwrap().len(), 64);
        let latency = w["latency_ms"].as_f64().unwrap();
        assert!(latency >= 0.0);
        // A scored decision says where its time went: tokenizing, then the model.
        if let Some(model_ms) = w.get("model_ms") {
            let encode_ms = w["encode_ms"].as_f64().unwrap();
            assert!(
                encode_ms + model_ms.as_f64().unwrap() <= latency + 1e-3,
                "{w}"
            );
            assert!(w["prompt_tokens"].as_u64().unwrap() > 10, "{w}");
        } else {
            assert!(
                w.get("probabilities").is_none() || r["candidates"].as_array().unwrap().len() == 1,
                "{r}"
            );
        }
        if r["result"]["kind"] == "pick" {
            let t = w["threshold"].as_f64().unwrap();
            assert!(r["result"]["confidence"].as_f64().unwrap() >= t, "{r}");
            // keel's gates are recorded, never silent.
            let p = r["result"]["confidence"].as_f64().unwrap();
            assert_eq!(
                r.get("fallback").is_some(),
                p < 0.4 || w.get("keel_gate").is_some()
            );
        }
    }
    assert_eq!(
        got.iter().filter(|r| r.get("fallback").is_some()).count(),
        keel_vetoes,
        "every pick keel's gates reject is a fallback in the receipts"
    );
}

#[test]
fn a_changed_byte_is_refused_with_exit_2_and_the_reason_logged() {
    let root = tempfile::tempdir().unwrap();
    let bundle = copy_of_fixture_bundle(root.path());
    // Sound: ready.
    let mut k = Keel::spawn(&bundle, &[], None);
    assert_eq!(k.handshake()["ready"], true);
    assert_eq!(k.finish().0, 0);
    // One flipped bit of model.onnx (same size).
    let model = bundle.join("model.onnx");
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&model, &bytes).unwrap();
    let log = root.path().join("log");
    let stderr = refused(&bundle, &[("DECISION_WORKER_LOG", log.as_path())]);
    assert!(
        stderr.contains("model.onnx: sha256"),
        "the reason is on stderr: {stderr}"
    );
    let text: String = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert!(
        text.contains("model_unavailable") && text.contains("model.onnx: sha256"),
        "and in the log (keel discards stderr): {text}"
    );
    // A missing bundle, and a tampered decision.json, likewise.
    let mut k = Keel::spawn(&root.path().join("nowhere"), &[], None);
    assert_eq!(k.handshake()["error"], "model_unavailable");
    assert_eq!(k.finish().0, 2);
    std::fs::write(&model, {
        bytes[mid] ^= 0x01;
        &bytes
    })
    .unwrap();
    let spec = bundle.join("decision.json");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(
        &spec,
        text.replace("\"max_options\": 16", "\"max_options\": 15"),
    )
    .unwrap();
    let mut k = Keel::spawn(&bundle, &[], None);
    assert_eq!(k.handshake()["ready"], false);
    let (code, stderr) = k.finish();
    assert_eq!(code, 2);
    assert!(stderr.contains("decision.json"), "{stderr}");
}

/// A symbolic link anywhere in the bundle is refused, as `bundle verify` refuses it: the link
/// could carry a file from outside the bundle past the hashes. Here model.onnx itself is a link
/// to a byte-identical copy outside, so every hash would still match.
#[cfg(unix)]
#[test]
fn a_bundle_with_a_symbolic_link_is_refused_like_bundle_verify_refuses_it() {
    let root = tempfile::tempdir().unwrap();
    let bundle = copy_of_fixture_bundle(root.path());
    let outside = root.path().join("model-elsewhere.onnx");
    std::fs::rename(bundle.join("model.onnx"), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, bundle.join("model.onnx")).unwrap();
    let stderr = refused(&bundle, &[]);
    assert!(
        stderr.contains("model.onnx: a symbolic link"),
        "the reason is on stderr: {stderr}"
    );
    // The same folder with the link replaced by the file is served.
    std::fs::remove_file(bundle.join("model.onnx")).unwrap();
    std::fs::rename(&outside, bundle.join("model.onnx")).unwrap();
    let mut k = Keel::spawn(&bundle, &[], None);
    assert_eq!(k.handshake()["ready"], true);
    assert_eq!(k.finish().0, 0);
}

#[test]
fn a_killed_worker_leaves_a_readable_log_and_a_forced_point_escalates_without_threshold() {
    let requests = read_jsonl(&fixture().join("requests.jsonl"));
    let log = tempfile::tempdir().unwrap();
    let bundle = fixture().join("bundle");
    let env = [("DECISION_WORKER_LOG", log.path())];
    let mut k = Keel::spawn(&bundle, &env, Some("tool"));
    assert_eq!(k.handshake()["ready"], true);
    for req in requests.iter().take(10) {
        let r = k.ask(req);
        // `tool` has no entry in thresholds.json: never auto-accept.
        if r.get("error").is_none() {
            assert_eq!(r["choice"], "escalate", "{r}");
        }
    }
    // Killed with a request in flight.
    k.send_raw(requests[10].to_string().as_bytes());
    k.child.kill().unwrap();
    k.child.wait().unwrap();
    let before = receipts(log.path());
    assert!(
        (10..=11).contains(&before.len()),
        "{} receipts",
        before.len()
    );
    assert!(before.iter().all(|r| r["point"] == "tool"));
    // A torn last line, as a kill in the middle of a write leaves it: readers skip it...
    let file = std::fs::read_dir(log.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    f.write_all(br#"{"id":"torn","at":"2026-12-"#).unwrap();
    drop(f);
    // ...and the next worker cuts it off before it appends, saying so in its log.
    let mut k = Keel::spawn(&bundle, &env, None);
    assert_eq!(k.handshake()["ready"], true);
    k.ask(&requests[0]);
    assert_eq!(k.finish().0, 0);
    let after = receipts(log.path());
    assert_eq!(after.len(), before.len() + 1);
    let notes: String = std::fs::read_dir(log.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(notes.contains("torn last line of 27 bytes"), "{notes}");
}
