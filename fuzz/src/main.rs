//! `decision-fuzz TARGET [--seconds N] [--runs N] [--seed N]`: a fuzzer for every reader of user
//! bytes that runs on stable Rust (no libFuzzer, no coverage feedback): it replays the committed
//! seeds of `fuzz/corpus/TARGET/`, then feeds the target structured mutations of them
//! ([`mutate`]) drawn from a seeded RNG, so a run is the same inputs every time.
//!
//! A finding is an input that panics (caught, the run goes on), runs longer than `--timeout`
//! seconds, or makes the heap grow by more than `--max-alloc-mib` (a counting global allocator
//! refuses the allocation). Each is saved to `fuzz/findings/TARGET/KIND-HASH.EXT`; a hang or an
//! allocation past the limit ends the process there. Exit status: 0 nothing found, 1 panics,
//! 2 a hang, 3 an allocation past the limit, 64 a usage error.

mod mutate;
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use targets::Target;

// ---- the allocation bound ---------------------------------------------------------------------

/// Counts live heap bytes; refuses an allocation that would take them past [`LIMIT`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The live bytes when the running input started.
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Set once the limit was crossed: from then on the allocator only counts (the finding is
/// being saved and the process ends).
static BREACHED: AtomicBool = AtomicBool::new(false);

#[global_allocator]
static ALLOC: Counting = Counting;

impl Counting {
    /// Count `n` more bytes; false when that crosses the limit (the first time).
    fn admit(n: usize) -> bool {
        let now = LIVE.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        PEAK.fetch_max(now, Ordering::Relaxed);
        if now > LIMIT.load(Ordering::Relaxed) && !BREACHED.swap(true, Ordering::SeqCst) {
            LIVE.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }
}

// SAFETY: every call is passed to `System` unchanged; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::admit(layout.size()) {
            allocation_finding(layout.size());
        }
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::admit(layout.size()) {
            allocation_finding(layout.size());
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !Self::admit(new_size - old) {
            allocation_finding(new_size);
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                LIVE.fetch_sub(new_size - old, Ordering::Relaxed);
            }
        } else if new_size < old {
            LIVE.fetch_sub(old - new_size, Ordering::Relaxed);
        }
        p
    }
}

// ---- the input being run, for the watchdog and the allocator ----------------------------------

struct Current {
    target: &'static str,
    /// The input file's name in the target's work folder (its extension is kept for findings).
    file: &'static str,
    findings: PathBuf,
    input: Vec<u8>,
}

static CURRENT: Mutex<Option<Current>> = Mutex::new(None);
/// When the running input started, in nanoseconds since [`epoch`]; 0 while none runs.
static STARTED: AtomicU64 = AtomicU64::new(0);
/// The last panic's location and message (set by the panic hook).
static LAST_PANIC: Mutex<Option<(String, String)>> = Mutex::new(None);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Save an input as a finding of `kind`; the path it was saved to.
fn save_finding(c: &Current, kind: &str) -> std::io::Result<PathBuf> {
    let dir = c.findings.join(c.target);
    std::fs::create_dir_all(&dir)?;
    let ext = Path::new(c.file)
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let path = dir.join(format!("{kind}-{:016x}{ext}", fnv64(&c.input)));
    std::fs::write(&path, &c.input)?;
    Ok(path)
}

/// Report the running input as a finding of `kind` and end the process with `code`.
fn fatal_finding(kind: &str, what: &str, code: i32) -> ! {
    let saved = match CURRENT.try_lock() {
        Ok(guard) => match guard.as_ref() {
            Some(c) => match save_finding(c, kind) {
                Ok(p) => format!("saved to {}", p.display()),
                Err(e) => format!("could not be saved: {e}"),
            },
            None => "no input was running".to_string(),
        },
        Err(_) => "could not be saved (busy)".to_string(),
    };
    let target = CURRENT
        .try_lock()
        .ok()
        .and_then(|g| g.as_ref().map(|c| c.target))
        .unwrap_or("?");
    println!("FINDING {target}: {kind}: {what}; the input {saved}");
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}

fn allocation_finding(size: usize) -> ! {
    let base = BASE.load(Ordering::Relaxed);
    let limit = LIMIT.load(Ordering::Relaxed).saturating_sub(base);
    let live = LIVE.load(Ordering::Relaxed).saturating_sub(base);
    fatal_finding(
        "alloc",
        &format!(
            "an allocation of {size} bytes would grow the heap by {} MiB during this input, past \
             the limit of {} MiB",
            live.saturating_add(size) >> 20,
            limit >> 20
        ),
        3,
    )
}

fn watchdog(timeout: Duration) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let started = STARTED.load(Ordering::SeqCst);
            if started == 0 {
                continue;
            }
            let now = epoch().elapsed().as_nanos() as u64;
            if now.saturating_sub(started) > timeout.as_nanos() as u64 {
                fatal_finding(
                    "hang",
                    &format!("still running after {} s", timeout.as_secs_f64()),
                    2,
                );
            }
        }
    });
}

// ---- the run ---------------------------------------------------------------------------------

struct Options {
    seconds: Option<f64>,
    runs: Option<u64>,
    seed: u64,
    timeout: Duration,
    max_alloc: usize,
    corpus: PathBuf,
    findings: PathBuf,
    verbose: bool,
}

struct Report {
    executions: u64,
    seeds: usize,
    elapsed: Duration,
    peak: usize,
    /// Per panic location: the first message, how many inputs panicked there, and where the
    /// first was saved.
    panics: BTreeMap<String, (String, u64, String)>,
}

/// Inputs stay small: twice the largest seed, at least 64 KiB, at most 1 MiB.
fn max_len(seeds: &[Vec<u8>]) -> usize {
    let largest = seeds.iter().map(Vec::len).max().unwrap_or(0);
    (2 * largest).clamp(64 << 10, 1 << 20)
}

fn load_seeds(t: &Target, opts: &Options) -> anyhow::Result<Vec<Vec<u8>>> {
    if !t.builtin_seeds.is_empty() {
        return Ok(t.builtin_seeds.iter().map(|s| s.to_vec()).collect());
    }
    let dir = opts.corpus.join(t.name);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths
        .iter()
        .map(std::fs::read)
        .collect::<std::io::Result<_>>()?;
    anyhow::ensure!(!seeds.is_empty(), "{}: no seed files", dir.display());
    Ok(seeds)
}

fn fuzz(t: &Target, opts: &Options) -> anyhow::Result<Report> {
    let seeds = load_seeds(t, opts)?;
    let work = tempfile::Builder::new()
        .prefix("decision-fuzz-")
        .tempdir()?;
    let input_path = work.path().join(t.file);
    if let Some(parent) = input_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut runner = (t.make)(&input_path)?;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ fnv64(t.name.as_bytes()));
    let cap = max_len(&seeds);
    let mut report = Report {
        executions: 0,
        seeds: seeds.len(),
        elapsed: Duration::ZERO,
        peak: 0,
        panics: BTreeMap::new(),
    };
    let start = Instant::now();
    loop {
        let i = report.executions;
        if opts.runs.is_some_and(|r| i >= r)
            || opts
                .seconds
                .is_some_and(|s| start.elapsed().as_secs_f64() >= s)
        {
            break;
        }
        // The corpus first, as it is: every committed finding is replayed on every run.
        let input = match seeds.get(i as usize) {
            Some(s) => s.clone(),
            None => mutate::mutate(&mut rng, &seeds, t.kind, cap),
        };
        *CURRENT.lock().unwrap() = Some(Current {
            target: t.name,
            file: t.file,
            findings: opts.findings.clone(),
            input: input.clone(),
        });
        let base = LIVE.load(Ordering::SeqCst);
        BASE.store(base, Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        LIMIT.store(base.saturating_add(opts.max_alloc), Ordering::SeqCst);
        STARTED.store(
            (epoch().elapsed().as_nanos() as u64).max(1),
            Ordering::SeqCst,
        );
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = runner.run(&input);
        }));
        STARTED.store(0, Ordering::SeqCst);
        LIMIT.store(usize::MAX, Ordering::SeqCst);
        report.peak = report
            .peak
            .max(PEAK.load(Ordering::SeqCst).saturating_sub(base));
        report.executions += 1;
        if outcome.is_err() {
            let (at, msg) = LAST_PANIC
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| (String::new(), "a panic without a message".into()));
            let entry = report
                .panics
                .entry(at.clone())
                .or_insert_with(|| (msg.clone(), 0, String::new()));
            entry.1 += 1;
            if entry.1 == 1 {
                let guard = CURRENT.lock().unwrap();
                let c = guard.as_ref().expect("set above");
                entry.2 = match save_finding(c, "panic") {
                    Ok(p) => p.display().to_string(),
                    Err(e) => format!("(not saved: {e})"),
                };
                println!(
                    "FINDING {}: panic at {at}: {msg}; the input saved to {}",
                    t.name, entry.2
                );
            }
        }
        *CURRENT.lock().unwrap() = None;
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

fn usage() -> String {
    let names: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
    format!(
        "usage: decision-fuzz TARGET|all|list [--seconds N] [--runs N] [--seed N] [--timeout S] \
         [--max-alloc-mib N] [--corpus DIR] [--findings DIR] [--verbose]\n\
         targets: {}\n\
         Without --seconds or --runs a target runs 60 s; with both, it stops at the first reached.",
        names.join(", ")
    )
}

fn parse_args(args: &[String]) -> Result<(String, Options), String> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut opts = Options {
        seconds: None,
        runs: None,
        seed: 1,
        timeout: Duration::from_secs(10),
        max_alloc: 1 << 30,
        corpus: here.join("corpus"),
        findings: here.join("findings"),
        verbose: false,
    };
    let mut target = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let num = |name: &str, v: String| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{name}: {v:?} is not a non-negative number"))
        };
        match a.as_str() {
            "--seconds" => opts.seconds = Some(num(a, value(a)?)?),
            "--runs" => opts.runs = Some(num(a, value(a)?)? as u64),
            "--seed" => opts.seed = num(a, value(a)?)? as u64,
            "--timeout" => opts.timeout = Duration::from_secs_f64(num(a, value(a)?)?),
            "--max-alloc-mib" => opts.max_alloc = (num(a, value(a)?)? as usize) << 20,
            "--corpus" => opts.corpus = PathBuf::from(value(a)?),
            "--findings" => opts.findings = PathBuf::from(value(a)?),
            "--verbose" => opts.verbose = true,
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s if target.is_none() => target = Some(s.to_string()),
            s => return Err(format!("one target only (got {s:?} too)")),
        }
    }
    if opts.seconds.is_none() && opts.runs.is_none() {
        opts.seconds = Some(60.0);
    }
    Ok((target.ok_or("no target given")?, opts))
}

/// Readers warn on stderr (a torn receipts line, say); at thousands of inputs a second that
/// drowns the report, which goes to stdout. `--verbose` keeps stderr. Unix only; elsewhere stderr
/// stays.
#[cfg(unix)]
fn silence_stderr() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 on two open descriptors; fd 2 is replaced atomically.
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
    }
}

#[cfg(not(unix))]
fn silence_stderr() {}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, opts) = match parse_args(&args) {
        Ok(x) => x,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("decision-fuzz: {e}");
            }
            eprintln!("{}", usage());
            return ExitCode::from(if e.is_empty() { 0 } else { 64 });
        }
    };
    let all = targets::all();
    if name == "list" {
        for t in all.iter().filter(|t| t.builtin_seeds.is_empty()) {
            println!("{}", t.name);
        }
        return ExitCode::SUCCESS;
    }
    let chosen: Vec<&Target> = if name == "all" {
        all.iter().filter(|t| t.builtin_seeds.is_empty()).collect()
    } else {
        match all.iter().find(|t| t.name == name) {
            Some(t) => vec![t],
            None => {
                eprintln!("decision-fuzz: unknown target {name:?}\n{}", usage());
                return ExitCode::from(64);
            }
        }
    };
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_default();
        if let Ok(mut g) = LAST_PANIC.lock() {
            *g = Some((at, msg));
        }
    }));
    if !opts.verbose {
        silence_stderr();
    }
    epoch();
    watchdog(opts.timeout);
    let mut found = false;
    for t in chosen {
        match fuzz(t, &opts) {
            Ok(r) => {
                let secs = r.elapsed.as_secs_f64();
                println!(
                    "{}: {} executions in {secs:.1} s ({:.1}/s), {} seeds, heap peak per input \
                     {:.1} MiB, {} panic location(s)",
                    t.name,
                    r.executions,
                    r.executions as f64 / secs.max(1e-9),
                    r.seeds,
                    r.peak as f64 / f64::from(1 << 20),
                    r.panics.len()
                );
                for (at, (msg, n, saved)) in &r.panics {
                    println!("  panic at {at} ({n} inputs): {msg}\n    first input: {saved}");
                }
                found |= !r.panics.is_empty();
            }
            Err(e) => {
                println!("{}: could not start: {e:#}", t.name);
                return ExitCode::from(64);
            }
        }
    }
    if found {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
