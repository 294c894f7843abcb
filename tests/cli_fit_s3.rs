//! `decision fit` on object storage, as a user runs it, against a real S3-compatible server:
//! moto's, started by scripts/s3_server.py on a loopback port with authentication on (an IAM
//! user whose key may do anything). The interpreter is `$DECISION_S3_PYTHON`, else `python3`; it
//! must import moto (scripts/requirements-s3.txt). `.ci/run` installs it and requires the
//! checker `moto`; elsewhere a missing moto says NOT RUN.
//!
//! Covered: a prefix of shards (hidden and foreign objects skipped) fits byte for byte like the
//! same files on disk; `--out` as a URL, written with a conditional put that refuses to replace
//! what another writer put there; a missing object; wrong credentials (and no secret in any
//! output); credentials from an AWS profile file; a server that drops the connection mid-object
//! (a clear error, nothing written, no temporary file left).

#[path = "support/checkers.rs"]
mod checkers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use decision_store::Store;
use serde_json::Value;

struct Server {
    _child: Child,
    endpoint: String,
    access: String,
    secret: String,
    bucket: String,
}

/// The one server of this test binary (it exits when our end of its stdin closes).
fn server(test: &str) -> Option<&'static Server> {
    static S: OnceLock<Result<Server, String>> = OnceLock::new();
    let s = S.get_or_init(|| {
        let python = std::env::var("DECISION_S3_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/s3_server.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let v: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                let mut err = String::new();
                let _ = child.stderr.take().expect("piped").read_to_string(&mut err);
                let last = err.lines().last().unwrap_or("no output").to_string();
                return Err(format!(
                    "{python} scripts/s3_server.py did not start: {last}"
                ));
            }
        };
        // moto logs each request on stderr: drain it so the pipe never fills.
        let mut err = child.stderr.take().expect("piped");
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        let get = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        Ok(Server {
            endpoint: get("endpoint"),
            access: get("access_key"),
            secret: get("secret_key"),
            bucket: get("bucket"),
            _child: child,
        })
    });
    match s {
        Ok(s) => Some(s),
        Err(why) => {
            checkers::not_run(
                test,
                "moto",
                &format!(
                    "{why}; .ci/run installs it; locally: python3 -m venv v && v/bin/pip install \
                     -r scripts/requirements-s3.txt && DECISION_S3_PYTHON=v/bin/python cargo test \
                     --workspace --test cli_fit_s3"
                ),
            );
            None
        }
    }
}

impl Server {
    fn store(&self) -> Store {
        Store::with_s3_config(&[
            ("aws_endpoint", &self.endpoint),
            ("aws_access_key_id", &self.access),
            ("aws_secret_access_key", &self.secret),
            ("aws_region", "us-east-1"),
            ("aws_allow_http", "true"),
        ])
        .unwrap()
    }

    fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    fn put(&self, key: &str, bytes: Vec<u8>) {
        let s = self.store();
        let url = self.url(key);
        let v = s.version(&url).unwrap();
        s.put(&url, bytes, &v).unwrap();
    }
}

/// `decision` with only these AWS settings (nothing from this machine's environment or home).
fn decision(args: &[&str], env: &[(&str, &str)], home: &Path) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_decision"));
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    c.env("HOME", home).env("TMPDIR", home).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run decision")
}

fn env_for<'a>(s: &'a Server, endpoint: &'a str, secret: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ACCESS_KEY_ID", &s.access),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ALLOW_HTTP", "true"),
    ]
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// Two shards (Parquet and JSON Lines, with bad records) in `dir`, made by `decision gen`.
fn shards(dir: &Path, home: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let a = dir.join("a.parquet");
    let b = dir.join("b.jsonl");
    for (p, n, seed) in [(&a, "3000", "1"), (&b, "2000", "2")] {
        ok(decision(
            &[
                "gen",
                "receipts",
                "--n",
                n,
                "--seed",
                seed,
                "--bad",
                "0.01",
                "--out",
                p.to_str().unwrap(),
            ],
            &[],
            home,
        ));
    }
    vec![a, b]
}

fn config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("configs/fit.toml")
        .display()
        .to_string()
}

/// No fetched object, id partition or staged output left in `home` (the runs' TMPDIR).
fn assert_no_temporaries(home: &Path) {
    let left: Vec<_> = std::fs::read_dir(home)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("decision-") || n.starts_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// thresholds.json without its `fitted_at` line.
fn without_time(s: &str) -> String {
    s.lines()
        .filter(|l| !l.trim_start().starts_with("\"fitted_at\""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_prefix_in_s3_fits_byte_for_byte_like_the_same_files_on_disk() {
    let Some(s) = server("a_prefix_in_s3_fits_byte_for_byte_like_the_same_files_on_disk") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let home = d.path();
    let local = shards(&home.join("local/2026-11"), home);
    for p in &local {
        let name = p.file_name().unwrap().to_str().unwrap();
        s.put(&format!("same/2026-11/{name}"), std::fs::read(p).unwrap());
    }
    // not shards: skipped, as in a local folder
    s.put("same/2026-11/.hidden.jsonl", b"not read\n".to_vec());
    s.put("same/2026-11/notes.txt", b"not a receipts file\n".to_vec());
    s.put("same/2026-11/deeper/c.jsonl", b"not read either\n".to_vec());

    let cfg = config();
    let out_local = home.join("out-local/thresholds.json");
    let out_s3 = home.join("out-s3/thresholds.json");
    ok(decision(
        &[
            "fit",
            "--receipts",
            home.join("local/2026-11").to_str().unwrap(),
            "--config",
            &cfg,
            "--out",
            out_local.to_str().unwrap(),
        ],
        &[],
        home,
    ));
    let prefix = s.url("same/2026-11/");
    let env = env_for(s, &s.endpoint, &s.secret);
    let o = ok(decision(
        &[
            "fit",
            "--receipts",
            &prefix,
            "--config",
            &cfg,
            "--out",
            out_s3.to_str().unwrap(),
        ],
        &env,
        home,
    ));
    assert!(!text(&o).contains(&s.secret), "the secret key was printed");

    let a = std::fs::read_to_string(&out_local).unwrap();
    let b = std::fs::read_to_string(&out_s3).unwrap();
    let urls: Vec<String> = ["a.parquet", "b.jsonl"]
        .iter()
        .map(|n| format!("{prefix}{n}"))
        .collect();
    let t: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(t["source"]["files"], serde_json::json!(urls));
    assert!(
        t["source"]["bad"].as_u64().unwrap() > 0,
        "the shards hold bad records"
    );
    // the same bytes, once the local paths read as the URLs they were copied to
    let mut renamed = a.clone();
    for (p, u) in local.iter().zip(&urls) {
        renamed = renamed.replace(p.to_str().unwrap(), u);
    }
    assert_eq!(without_time(&renamed), without_time(&b));
    let q = |dir: &str, f: &str| std::fs::read_to_string(home.join(dir).join(f)).unwrap();
    assert_eq!(
        q("out-local", "thresholds.quarantine.jsonl"),
        q("out-s3", "thresholds.quarantine.jsonl")
    );
    let mut errors = q("out-local", "thresholds.quarantine.errors.jsonl");
    for (p, u) in local.iter().zip(&urls) {
        errors = errors.replace(p.to_str().unwrap(), u);
    }
    assert_eq!(errors, q("out-s3", "thresholds.quarantine.errors.jsonl"));
    assert!(errors.contains(&urls[0]) && errors.contains(&urls[1]));
    assert_no_temporaries(home);
}

#[test]
fn out_as_a_url_is_put_and_never_replaces_another_writer_s() {
    let Some(s) = server("out_as_a_url_is_put_and_never_replaces_another_writer_s") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let home = d.path();
    let local = shards(&home.join("in"), home);
    s.put("w/in/a.parquet", std::fs::read(&local[0]).unwrap());
    let cfg = config();
    let env = env_for(s, &s.endpoint, &s.secret);
    let out = s.url("w/out/thresholds.json");
    let input = s.url("w/in/a.parquet");
    let o = ok(decision(
        &["fit", "--receipts", &input, "--config", &cfg, "--out", &out],
        &env,
        home,
    ));
    assert!(text(&o).contains(&format!("wrote {out}")), "{}", text(&o));
    let store = s.store();
    let got = home.join("got.json");
    store.fetch(&out, &got).unwrap();
    let t: Value = serde_json::from_slice(&std::fs::read(&got).unwrap()).unwrap();
    assert_eq!(t["source"]["files"], serde_json::json!([input]));
    let qurl = s.url("w/out/thresholds.quarantine.jsonl");
    store.fetch(&qurl, &home.join("q.jsonl")).unwrap();
    assert!(
        !std::fs::read(home.join("q.jsonl")).unwrap().is_empty(),
        "the quarantine is beside it"
    );

    // run again: it was not changed by anyone else meanwhile, so the refit replaces it
    ok(decision(
        &["fit", "--receipts", &input, "--config", &cfg, "--out", &out],
        &env,
        home,
    ));
    // --previous may be a URL too: the refit compares with the thresholds in the bucket
    let next = s.url("w/out/thresholds-next.json");
    let o = ok(decision(
        &[
            "fit",
            "--receipts",
            &input,
            "--config",
            &cfg,
            "--out",
            &next,
            "--previous",
            &out,
        ],
        &env,
        home,
    ));
    assert!(
        text(&o).contains(&format!("compared with {out}")),
        "{}",
        text(&o)
    );
    // --out may not name an input
    let o = decision(
        &[
            "fit",
            "--receipts",
            &input,
            "--config",
            &cfg,
            "--out",
            &input,
        ],
        &env,
        home,
    );
    assert!(
        !o.status.success() && text(&o).contains("would overwrite --receipts"),
        "{}",
        text(&o)
    );

    // the conditional put itself: a version read before another writer's put is refused
    let url = s.url("w/race.json");
    let absent = store.version(&url).unwrap();
    assert!(absent.absent());
    store.put(&url, b"first".to_vec(), &absent).unwrap();
    let e = store
        .put(&url, b"second".to_vec(), &absent)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another writer") && e.contains(&url), "{e}");
    let v1 = store.version(&url).unwrap();
    store.put(&url, b"third".to_vec(), &v1).unwrap();
    let e = store
        .put(&url, b"fourth".to_vec(), &v1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another writer"), "{e}");
    store.fetch(&url, &home.join("race")).unwrap();
    assert_eq!(std::fs::read(home.join("race")).unwrap(), b"third");
}

#[test]
fn a_missing_object_and_wrong_credentials_are_clear_errors_that_write_nothing() {
    let Some(s) =
        server("a_missing_object_and_wrong_credentials_are_clear_errors_that_write_nothing")
    else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let home = d.path();
    let local = shards(&home.join("in"), home);
    s.put("m/a.parquet", std::fs::read(&local[0]).unwrap());
    let cfg = config();
    let out = home.join("out/thresholds.json");
    let args = |r: &str| {
        vec![
            "fit".to_string(),
            "--receipts".into(),
            r.to_string(),
            "--config".into(),
            cfg.clone(),
            "--out".into(),
            out.display().to_string(),
        ]
    };
    let run = |r: &str, env: &[(&str, &str)]| {
        let a = args(r);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        decision(&a, env, home)
    };

    let missing = s.url("m/nope.parquet");
    let o = run(&missing, &env_for(s, &s.endpoint, &s.secret));
    assert!(!o.status.success());
    assert!(
        text(&o).contains(&missing) && text(&o).contains("no such object"),
        "{}",
        text(&o)
    );
    let empty = s.url("m/empty-prefix/");
    let o = run(&empty, &env_for(s, &s.endpoint, &s.secret));
    assert!(
        !o.status.success() && text(&o).contains("no shard"),
        "{}",
        text(&o)
    );

    let wrong = "wJalrXUtnFEMI-this-is-not-the-key";
    let o = run(&s.url("m/a.parquet"), &env_for(s, &s.endpoint, wrong));
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains(&s.url("m/a.parquet")), "{t}");
    assert!(
        !t.contains(wrong) && !t.contains(&s.secret),
        "a secret was printed: {t}"
    );
    assert!(!home.join("out").exists(), "nothing is written");

    // the same read with the key in an AWS profile file instead of the environment
    let creds = home.join("credentials");
    std::fs::write(
        &creds,
        format!(
            "[other]\naws_access_key_id = X\naws_secret_access_key = Y\n[fit]\naws_access_key_id = {}\n\
             aws_secret_access_key = {}\n",
            s.access, s.secret
        ),
    )
    .unwrap();
    let o = run(
        &s.url("m/a.parquet"),
        &[
            ("AWS_ENDPOINT_URL", &s.endpoint),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_PROFILE", "fit"),
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains(&s.secret));
}

/// A loopback proxy to `upstream` that cuts the first `times` responses to a request naming
/// `cut` after `limit` bytes each (the connection is shut down mid-body).
fn dropping_proxy(upstream: &str, cut: String, limit: u64, times: u64) -> String {
    let left = Arc::new(AtomicU64::new(times));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let upstream = upstream.trim_start_matches("http://").to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let cutting = Arc::new(AtomicBool::new(false));
            let sent = Arc::new(AtomicU64::new(0));
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (flag, cut, left) = (cutting.clone(), cut.clone(), left.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n) = c_in.read(&mut buf) {
                    if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if String::from_utf8_lossy(&buf[..n]).contains(&cut)
                        && left
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
                            .is_ok()
                    {
                        flag.store(true, Ordering::SeqCst);
                    }
                }
                let _ = s_out.shutdown(Shutdown::Write);
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if cutting.load(Ordering::SeqCst)
                        && sent.fetch_add(n as u64, Ordering::SeqCst) + n as u64 > limit
                    {
                        let _ = c_out.shutdown(Shutdown::Both);
                        let _ = s_in.shutdown(Shutdown::Both);
                        return;
                    }
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_out.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

#[test]
fn a_connection_dropped_mid_object_is_resumed_once_and_an_error_when_it_keeps_dropping() {
    let Some(s) = server(
        "a_connection_dropped_mid_object_is_resumed_once_and_an_error_when_it_keeps_dropping",
    ) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let home = d.path();
    let local = shards(&home.join("in"), home);
    let size = std::fs::metadata(&local[0]).unwrap().len();
    assert!(size > 40_000, "a shard of {size} bytes");
    s.put("drop/a.parquet", std::fs::read(&local[0]).unwrap());
    let url = s.url("drop/a.parquet");
    let cut = format!("GET /{}/drop/a.parquet", s.bucket);
    let fit = |proxy: &str, out: &Path| {
        decision(
            &[
                "fit",
                "--receipts",
                &url,
                "--config",
                &config(),
                "--out",
                out.to_str().unwrap(),
            ],
            &env_for(s, proxy, &s.secret),
            home,
        )
    };

    // dropped once, a third of the way in: the read resumes where it stopped
    let once = dropping_proxy(&s.endpoint, cut.clone(), size / 3, 1);
    ok(fit(&once, &home.join("once/thresholds.json")));
    ok(fit(&s.endpoint, &home.join("direct/thresholds.json")));
    let read = |d: &str| {
        without_time(&std::fs::read_to_string(home.join(d).join("thresholds.json")).unwrap())
    };
    assert_eq!(read("once"), read("direct"));

    // dropped after 2 KB every time: the retries give up, with an error naming the object
    let always = dropping_proxy(&s.endpoint, cut, 2048, u64::MAX);
    let out = home.join("out/thresholds.json");
    let o = fit(&always, &out);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&url), "{}", text(&o));
    assert!(!home.join("out").exists(), "nothing is written");
    assert_no_temporaries(home);
}
