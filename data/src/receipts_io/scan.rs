//! The parallel read behind `decision fit`: every row group of every Parquet file, and every
//! few MiB of whole lines of a JSON Lines file, is a piece of work for a thread of its own. Each
//! piece counts its valid receipts into a [`Tally`] of its own and keeps its bad rows. Lines go
//! through the rules of [`super::for_each_receipt`] (`line::eval_line`); a row group's batches
//! through the same rules evaluated column-wise (`batch_rules.rs`), which leave the rows they do
//! not plainly accept to the row-wise ones (`Flat::fill`), so a bad row is reported exactly as
//! the sequential read reports it. At most two pieces per thread are in flight; they finish in
//! any order and are taken in input order (the quarantine's), so no thread waits for another
//! and memory is bounded by the pieces in flight, never by the input. The files are read once,
//! forward, and hashed on the way ([`WorkSource`]).
//!
//! Each receipt id counts once, as in [`super::for_each_unique_receipt`], but that is settled
//! at the end: every valid receipt's [`IdEntry`] (its id's hash and place) goes into the spilled
//! check of `dedup.rs` while it is counted; once the input is read, the check names the records
//! that repeat an id read before them, and those (with the first of each id) are read again:
//! a repeat is taken back out of the tally (weight -1), as a duplicate when its body is the
//! first's and as a bad record (file, row, field `id`, reported after the bad records met
//! during the read) when it is not.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use bytes::Bytes;

use super::batch_rules::BatchRules;
use super::columns;
use super::dedup::{IdEntry, Repeat, SpilledIds, body_hash64, conflict_error};
use super::line::{Line, eval_line, warn_torn};
use super::parquet_io::{ParquetPlan, RowGroupBytes};
use super::{ReadOptions, ReadSummary, Shape, hex_lower};
use crate::states_io::{BadRow, Format};
use crate::{OutcomeStatus, Receipt, ReceiptResult, Validation};

/// What counting a receipt needs of it (the categories of `decision_fit::aggregate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Facts {
    /// The pick's confidence; `None` for an abstention.
    pub confidence: Option<f64>,
    pub validation: Validation,
    pub fallback_used: bool,
    /// The pick is the host's own route, not a selector's ([`Receipt::host_scored`]).
    pub host_scored: bool,
    /// With a shadow reference: whether the pick equals it.
    pub shadow_match: Option<bool>,
    pub outcome: Option<OutcomeStatus>,
    /// A free-text outcome was recorded (whether or not a pattern recognised it).
    pub observed: bool,
}

impl Facts {
    pub fn of(r: &Receipt) -> Facts {
        let pick = match &r.result {
            ReceiptResult::Pick { id, confidence } => Some((id.as_str(), *confidence)),
            ReceiptResult::Abstain => None,
        };
        Facts {
            confidence: pick.map(|(_, c)| c),
            validation: r.validation,
            fallback_used: r.fallback_used(),
            host_scored: r.host_scored(),
            shadow_match: r
                .shadow
                .as_ref()
                .map(|s| pick.is_some_and(|(id, _)| id == s.reference)),
            outcome: r.outcome.as_ref().map(|o| o.status),
            observed: r.observed_outcome.is_some(),
        }
    }
}

/// Counts kept per piece of work and merged in input order.
pub trait Tally: Send + Sized {
    /// Count one valid receipt of decision point `point` (`weight` 1), or take one back (-1: a
    /// repeated id found once the whole input was read).
    fn add(&mut self, point: &str, facts: &Facts, weight: i64);
    /// Fold in the tally of a later piece.
    fn merge(&mut self, later: Self);
    /// Count many valid receipts at once: each `(p, facts)` of `rows` is a receipt of point
    /// `points[p]` (the column-wise read calls it once per batch, so a tally can look each point
    /// up once per batch instead of once per row).
    fn add_rows(&mut self, points: &[&str], rows: &[(u32, Facts)]) {
        for (p, facts) in rows {
            self.add(points[*p as usize], facts, 1);
        }
    }
}

/// One input of a scan: the local file read, and the name it is reported under (the same path,
/// or the URL of an object that was fetched into a temporary file).
#[derive(Debug, Clone)]
pub struct Input {
    pub path: PathBuf,
    pub name: PathBuf,
}

impl Input {
    pub fn local(path: PathBuf) -> Input {
        Input {
            name: path.clone(),
            path,
        }
    }
}

/// Whole lines per JSON Lines piece of work, about.
const LINES_BYTES: usize = 4 << 20;

/// `file index << 40 | row`: a record's place in the input (the id check's order).
fn seq(file: usize, row: u64) -> u64 {
    ((file as u64) << 40) | row
}

enum Work {
    RowGroup {
        file: usize,
        rg: usize,
        /// The row group's bytes, read ahead in file order; `None` for one too large to hold
        /// (read from the file by the piece).
        bytes: Option<RowGroupBytes>,
    },
    Lines {
        file: usize,
        before: u64,
        data: Vec<u8>,
    },
}

struct Piece<T> {
    tally: T,
    bad: Vec<BadRow>,
    ids: Vec<IdEntry>,
    /// Its records, torn lines and good records by shape (bad ones are `bad`).
    counts: ReadSummary,
    bytes: u64,
}

/// Reads a JSON Lines file in pieces of whole lines.
struct LinePieces {
    rd: BufReader<File>,
    rows: u64,
    done: bool,
    bytes: usize,
}

impl LinePieces {
    fn open(path: &std::path::Path, bytes: usize) -> Result<LinePieces> {
        let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Ok(LinePieces {
            rd: BufReader::with_capacity(1 << 20, f),
            rows: 0,
            done: false,
            bytes,
        })
    }

    /// The next piece and the rows before it; `None` at the end. `hash` gets its bytes.
    fn next(
        &mut self,
        path: &std::path::Path,
        hash: Option<&mut Sha256>,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        if self.done {
            return Ok(None);
        }
        let before = self.rows;
        let mut data = Vec::with_capacity(self.bytes + 4096);
        while data.len() < self.bytes {
            let n = self
                .rd
                .read_until(b'\n', &mut data)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                self.done = true;
                break;
            }
            self.rows += 1;
        }
        if let Some(h) = hash {
            h.update(&data);
        }
        Ok((!data.is_empty()).then_some((before, data)))
    }
}

/// Called per line by [`visit_lines`]: its row number, what it holds, its bytes.
type LineVisitor<'a> = dyn FnMut(u64, Line, &[u8]) -> Result<()> + 'a;

/// Call `f` for each line of `data` (whole lines; the last may lack its newline only at the end
/// of the file) with its row number, after `before` rows.
fn visit_lines(
    data: &[u8],
    before: u64,
    opts: &ReadOptions,
    f: &mut LineVisitor<'_>,
) -> Result<()> {
    let mut row = before;
    let mut rest = data;
    while !rest.is_empty() {
        let (line, complete, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], true, &rest[i + 1..]),
            None => (rest, false, &rest[rest.len()..]),
        };
        rest = next;
        row += 1;
        let (line_bytes, item) = eval_line(line, row, complete, &opts.outcome);
        f(row, item, line_bytes)?;
    }
    Ok(())
}

/// The pieces of work of a scan, in input order: each Parquet row group, and each piece of whole
/// lines of a JSON Lines file. Files are read here, forward and once, as the scan asks for pieces:
/// every byte goes through the inputs' SHA-256 on its way (a row group's bytes then go to the
/// piece that decodes them), so the input is never read a second time to be hashed.
struct WorkSource<'a> {
    inputs: &'a [Input],
    plans: &'a Plans,
    line_bytes: usize,
    file: usize,
    rg: usize,
    lines: Option<LinePieces>,
    parquet: Option<Forward>,
    hash: Sha256,
}

/// Row groups larger than this are not read ahead: the piece reads them from the file, and the
/// source only hashes their bytes.
const READ_AHEAD_MAX: u64 = 256 << 20;

/// A file read forward once, every byte hashed as it passes.
struct Forward {
    file: File,
    /// Bytes before this were hashed.
    pos: u64,
    len: u64,
}

impl Forward {
    fn open(path: &std::path::Path) -> Result<Forward> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file.metadata()?.len();
        Ok(Forward { file, pos: 0, len })
    }

    /// Read `[start, end)`, hashing what lies past the bytes hashed so far (first the gap up to
    /// `start`); `keep` says whether to return the bytes or only hash them.
    fn take(
        &mut self,
        start: u64,
        end: u64,
        keep: bool,
        hash: &mut Sha256,
    ) -> Result<Option<Bytes>> {
        use std::io::{Read, Seek, SeekFrom};
        if start > self.pos {
            self.pass(start, hash)?;
        }
        if !keep {
            self.pass(end, hash)?;
            return Ok(None);
        }
        let len = end.saturating_sub(start);
        let mut data = Vec::with_capacity(len as usize);
        self.file.seek(SeekFrom::Start(start))?;
        (&mut self.file).take(len).read_to_end(&mut data)?;
        if (data.len() as u64) < len {
            anyhow::bail!(
                "the footer places a row group at bytes {start}..{end}, past the end of the file ({} bytes)",
                self.len
            );
        }
        if end > self.pos {
            let from = (self.pos.max(start) - start) as usize;
            hash.update(&data[from..]);
            self.pos = end;
        }
        Ok(Some(Bytes::from(data)))
    }

    /// Hash forward up to `to` (the end of the file when `to` is past it).
    fn pass(&mut self, to: u64, hash: &mut Sha256) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        if to <= self.pos {
            return Ok(());
        }
        self.file.seek(SeekFrom::Start(self.pos))?;
        let mut rd = (&mut self.file).take(to - self.pos);
        let mut buf = vec![0u8; (to - self.pos).min(1 << 20) as usize];
        loop {
            let n = rd.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            self.pos += n as u64;
        }
        Ok(())
    }
}

impl<'a> WorkSource<'a> {
    fn new(inputs: &'a [Input], plans: &'a Plans, line_bytes: usize) -> Self {
        WorkSource {
            inputs,
            plans,
            line_bytes,
            file: 0,
            rg: 0,
            lines: None,
            parquet: None,
            hash: Sha256::new(),
        }
    }

    fn next(&mut self) -> Result<Option<Work>> {
        while self.file < self.inputs.len() {
            let (file, input) = (self.file, &self.inputs[self.file]);
            match &self.plans[file] {
                Some(plan) => {
                    if self.parquet.is_none() {
                        self.parquet =
                            Some(Forward::open(&input.path).with_context(|| in_name(input))?);
                    }
                    let fwd = self.parquet.as_mut().expect("opened above");
                    if self.rg < plan.row_groups.len() {
                        let rg = self.rg;
                        self.rg += 1;
                        let (start, end) = plan.span(rg);
                        let keep = end - start <= READ_AHEAD_MAX;
                        let bytes = fwd
                            .take(start, end, keep, &mut self.hash)
                            .with_context(|| in_name(input))?
                            .map(|data| RowGroupBytes {
                                start,
                                data,
                                file_len: fwd.len,
                            });
                        return Ok(Some(Work::RowGroup { file, rg, bytes }));
                    }
                    fwd.pass(u64::MAX, &mut self.hash)
                        .with_context(|| in_name(input))?;
                    self.parquet = None;
                }
                None => {
                    if self.lines.is_none() {
                        self.lines = Some(
                            LinePieces::open(&input.path, self.line_bytes)
                                .with_context(|| in_name(input))?,
                        );
                    }
                    let pieces = self.lines.as_mut().expect("opened above");
                    if let Some((before, data)) = pieces.next(&input.path, Some(&mut self.hash))? {
                        return Ok(Some(Work::Lines { file, before, data }));
                    }
                    self.lines = None;
                }
            }
            self.file += 1;
            self.rg = 0;
        }
        Ok(None)
    }

    /// The SHA-256 of every input's bytes, in order (once every piece was taken).
    fn sha256(self) -> String {
        hex_lower(&self.hash.finalize())
    }
}

/// The next finished piece. On a thread of the pool itself (the scan run inside
/// `ThreadPool::install`) waiting must not block the worker the pieces need: it runs pending
/// jobs meanwhile.
fn next_done<P>(rx: &std::sync::mpsc::Receiver<P>) -> P {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    loop {
        match rx.try_recv() {
            Ok(p) => return p,
            Err(TryRecvError::Disconnected) => unreachable!("the scan holds a sender"),
            Err(TryRecvError::Empty) => {}
        }
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {}
            None => return rx.recv().expect("the scan holds a sender"),
            Some(rayon::Yield::Idle) => {
                match rx.recv_timeout(std::time::Duration::from_millis(1)) {
                    Ok(p) => return p,
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        unreachable!("the scan holds a sender")
                    }
                }
            }
        }
    }
}

/// Per input, its Parquet plan; `None` for JSON Lines.
type Plans = [Option<ParquetPlan>];

fn run<T: Tally>(
    w: Work,
    inputs: &[Input],
    names: &[Arc<PathBuf>],
    plans: &Plans,
    opts: &ReadOptions,
    new: &(dyn Fn() -> T + Sync),
) -> Result<Piece<T>> {
    let mut p = Piece {
        tally: new(),
        bad: Vec::new(),
        ids: Vec::new(),
        counts: ReadSummary::default(),
        bytes: 0,
    };
    match w {
        Work::RowGroup { file, rg, bytes } => {
            count_row_group(&mut p, file, rg, bytes, inputs, names, plans, opts)
                .with_context(|| in_name(&inputs[file]))?;
        }
        Work::Lines { file, before, data } => {
            p.bytes = data.len() as u64;
            visit_lines(&data, before, opts, &mut |row, item, raw| {
                match item {
                    Line::Blank => {}
                    Line::Torn => {
                        p.counts.torn += 1;
                        warn_torn(&names[file], row, raw.len());
                    }
                    Line::Good(r, shape) => {
                        p.counts.records += 1;
                        *p.counts.good_mut(shape) += 1;
                        p.tally.add(&r.point, &Facts::of(&r), 1);
                        p.ids.push(IdEntry::of(&r, seq(file, row)));
                    }
                    Line::Bad(e) => {
                        p.counts.records += 1;
                        p.bad.push(BadRow::from_line(
                            names[file].clone(),
                            row,
                            raw.to_vec(),
                            vec![e],
                        ));
                    }
                }
                Ok(())
            })?;
        }
    }
    Ok(p)
}

/// Count row group `rg` of input `file` (its bytes read ahead, or `None` to read them from the
/// file) into piece `p`: each batch through the column-wise rules, the rows they leave through
/// the row-wise ones.
#[allow(clippy::too_many_arguments)]
fn count_row_group<T: Tally>(
    p: &mut Piece<T>,
    file: usize,
    rg: usize,
    bytes: Option<RowGroupBytes>,
    inputs: &[Input],
    names: &[Arc<PathBuf>],
    plans: &Plans,
    opts: &ReadOptions,
) -> Result<()> {
    let plan = plans[file].as_ref().expect("a Parquet file's plan");
    let (before, rows, size) = plan.row_groups[rg];
    p.bytes = size;
    p.ids.reserve(rows.min(1 << 20) as usize);
    let path = &inputs[file].path;
    let batches = match bytes {
        Some(b) => plan.batches(b, rg, path)?,
        None => plan.batches(
            File::open(path).with_context(|| format!("opening {}", path.display()))?,
            rg,
            path,
        )?,
    };
    let mut row = before;
    let (mut counted, mut suspects) = (Vec::new(), Vec::new());
    let (mut r, mut at_buf) = (columns::empty_receipt(), String::new());
    for batch in batches {
        let batch = batch?;
        let rules = BatchRules::new(&batch, path, &opts.outcome)?;
        counted.clear();
        suspects.clear();
        for i in 0..batch.num_rows() {
            match rules.eval(i) {
                Some(fact) => {
                    counted.push(fact);
                    let id = rules.id(i).expect("a counted row has an id");
                    p.ids
                        .push(IdEntry::of_id(id, seq(file, row + 1 + i as u64)));
                }
                None => suspects.push(i),
            }
        }
        p.tally.add_rows(&rules.points, &counted);
        p.counts.parquet += counted.len() as u64;
        if !suspects.is_empty() {
            let cols = columns::Cols::new(&batch, path)?;
            for &i in &suspects {
                let at = row + 1 + i as u64;
                match columns::fill(&cols, i, &mut r, &mut at_buf, &opts.outcome) {
                    Ok(()) => {
                        p.counts.parquet += 1;
                        p.tally.add(&r.point, &Facts::of(&r), 1);
                        p.ids.push(IdEntry::of(&r, seq(file, at)));
                    }
                    Err(e) => {
                        let raw = cols.raw_row(i);
                        p.bad
                            .push(BadRow::from_line(names[file].clone(), at, raw, vec![e]));
                        r = columns::empty_receipt();
                    }
                }
            }
        }
        row += batch.num_rows() as u64;
    }
    p.counts.records += row - before;
    Ok(())
}

/// "reading <name>" when the file read is a fetched copy of `name`, for errors that name the copy.
fn in_name(input: &Input) -> String {
    if input.name == input.path {
        format!("reading {}", input.path.display())
    } else {
        format!(
            "reading {} (fetched to {})",
            input.name.display(),
            input.path.display()
        )
    }
}

/// Read every input once, in parallel, counting each valid receipt (each id once) into a tally
/// made by `new`; `bad` gets every bad record (file, row, field, bytes): those met while
/// reading in input order, then the repeated ids with another body. The tally merges pieces in
/// input order, so the result does not depend on the number of threads (rayon's pool:
/// `RAYON_NUM_THREADS` sets it).
pub fn scan_unique_receipts<T: Tally>(
    inputs: &[Input],
    opts: &ReadOptions,
    new: &(dyn Fn() -> T + Sync),
    bad: &mut dyn FnMut(&BadRow) -> Result<()>,
) -> Result<(T, ReadSummary)> {
    scan_with(inputs, opts, new, bad, SpilledIds::new(), LINES_BYTES)
}

pub(super) fn scan_with<T: Tally>(
    inputs: &[Input],
    opts: &ReadOptions,
    new: &(dyn Fn() -> T + Sync),
    bad: &mut dyn FnMut(&BadRow) -> Result<()>,
    mut ids: SpilledIds,
    line_bytes: usize,
) -> Result<(T, ReadSummary)> {
    let names: Vec<Arc<PathBuf>> = inputs.iter().map(|i| Arc::new(i.name.clone())).collect();
    let plans: Vec<Option<ParquetPlan>> = inputs
        .iter()
        .map(
            |input| match Format::from_path(&input.path).with_context(|| in_name(input))? {
                Format::Parquet => Ok(Some(
                    ParquetPlan::open(&input.path).with_context(|| in_name(input))?,
                )),
                Format::Jsonl => Ok(None),
            },
        )
        .collect::<Result<_>>()?;
    let total: u64 = inputs
        .iter()
        .map(|i| fs::metadata(&i.path).map(|m| m.len()).unwrap_or(0))
        .sum();
    let pb = if opts.progress {
        crate::progress::bar(Some(total), "bytes")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut s = ReadSummary {
        files: inputs.iter().map(|i| i.name.clone()).collect(),
        ..ReadSummary::default()
    };
    let window = 2 * rayon::current_num_threads().max(1);

    std::thread::scope(|scope| -> Result<(T, ReadSummary)> {
        // Tallies and ids are folded in on a thread of their own while the next wave is read.
        let (to_fold, folding) = std::sync::mpsc::sync_channel::<(T, Vec<IdEntry>)>(window);
        let folder = scope.spawn(move || -> Result<(T, SpilledIds)> {
            let mut tally = new();
            for (t, entries) in folding {
                tally.merge(t);
                for e in entries {
                    ids.push(e)?;
                }
            }
            Ok((tally, ids))
        });
        // Pieces run as rayon jobs, at most `window` at a time; they finish in any order and
        // are taken in input order (the quarantine's order), so no thread waits for a wave.
        let mut source = WorkSource::new(inputs, &plans, line_bytes);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<(usize, Result<Piece<T>>)>();
        let (names, plans) = (&names, &plans);
        rayon::in_place_scope(|jobs| -> Result<()> {
            let mut finished: std::collections::BTreeMap<usize, Result<Piece<T>>> =
                std::collections::BTreeMap::new();
            let (mut started, mut taken) = (0usize, 0usize);
            let mut more = true;
            loop {
                while more && started - taken < window {
                    match source.next()? {
                        Some(w) => {
                            let tx = done_tx.clone();
                            let k = started;
                            jobs.spawn(move |_| {
                                let _ = tx.send((k, run(w, inputs, names, plans, opts, new)));
                            });
                            started += 1;
                        }
                        None => more = false,
                    }
                }
                if taken == started {
                    return Ok(());
                }
                let (k, piece) = next_done(&done_rx);
                finished.insert(k, piece);
                while let Some(p) = finished.remove(&taken) {
                    taken += 1;
                    let p = p?;
                    s.records += p.counts.records;
                    s.torn += p.counts.torn;
                    s.bad += p.bad.len() as u64;
                    s.contract += p.counts.contract;
                    s.keel += p.counts.keel;
                    s.parquet += p.counts.parquet;
                    for b in &p.bad {
                        bad(b)?;
                    }
                    if to_fold.send((p.tally, p.ids)).is_err() {
                        // the folder stopped on an error: its join says which
                        more = false;
                    }
                    pb.inc(p.bytes);
                }
            }
        })?;
        let sha256 = source.sha256();

        drop(to_fold);
        let (mut tally, ids) = folder.join().expect("the folding thread does not panic")?;
        let repeats = ids.finish()?;
        take_back(
            &repeats, inputs, names, plans, opts, &mut tally, &mut s, bad, line_bytes,
        )?;
        pb.finish_and_clear();
        s.sha256 = sha256;
        Ok((tally, s))
    })
}

/// Read the repeated records, and the first record of each repeated id, again: a repeat whose
/// body hashes (64 bits) like its first's is a duplicate (counted in `duplicates`), any other a
/// conflict (a bad record, reported through `bad`); both are taken out of the tally. Rows are
/// visited in input order, so a first is always read before its repeats.
#[allow(clippy::too_many_arguments)]
fn take_back<T: Tally>(
    repeats: &[Repeat],
    inputs: &[Input],
    names: &[Arc<PathBuf>],
    plans: &Plans,
    opts: &ReadOptions,
    tally: &mut T,
    s: &mut ReadSummary,
    bad: &mut dyn FnMut(&BadRow) -> Result<()>,
    line_bytes: usize,
) -> Result<()> {
    // (row's place, the first it repeats; None for a first)
    let mut visits: Vec<(u64, Option<u64>)> = repeats
        .iter()
        .map(|r| (r.seq, Some(r.first)))
        .chain(repeats.iter().map(|r| (r.first, None)))
        .collect();
    visits.sort_unstable();
    visits.dedup();
    let mut firsts: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut buf = Vec::new();
    let mut k = 0;
    while k < visits.len() {
        let file = (visits[k].0 >> 40) as usize;
        let end = k + visits[k..]
            .iter()
            .take_while(|(q, _)| (q >> 40) as usize == file)
            .count();
        let here = &visits[k..end];
        k = end;
        let row_of = |q: u64| q & ((1 << 40) - 1);
        let role_at = |row: u64| {
            here.binary_search_by_key(&row, |&(q, _)| row_of(q))
                .ok()
                .map(|i| here[i].1)
        };
        let mut take =
            |row: u64, r: &Receipt, shape: Shape, raw: &dyn Fn() -> Vec<u8>| -> Result<()> {
                let Some(role) = role_at(row) else {
                    return Ok(());
                };
                let h = body_hash64(r, &mut buf);
                let Some(first) = role else {
                    firsts.insert(seq(file, row), h);
                    return Ok(());
                };
                tally.add(&r.point, &Facts::of(r), -1);
                *s.good_mut(shape) -= 1;
                if firsts.get(&first) == Some(&h) {
                    s.duplicates += 1;
                } else {
                    s.bad += 1;
                    bad(&BadRow::from_line(
                        names[file].clone(),
                        row,
                        raw(),
                        vec![conflict_error(r)],
                    ))?;
                }
                Ok(())
            };
        let input = &inputs[file];
        match &plans[file] {
            Some(plan) => {
                for (rg, &(before, rows, _)) in plan.row_groups.iter().enumerate() {
                    let touched = here
                        .iter()
                        .any(|&(q, _)| (before + 1..=before + rows).contains(&row_of(q)));
                    if !touched {
                        continue;
                    }
                    plan.visit_row_group(
                        &input.path,
                        rg,
                        before,
                        &opts.outcome,
                        &mut |row, item, raw| {
                            if let Ok(r) = item {
                                take(row, r, Shape::Parquet, raw)?;
                            }
                            Ok(())
                        },
                    )
                    .with_context(|| in_name(input))?;
                }
            }
            None => {
                let mut pieces =
                    LinePieces::open(&input.path, line_bytes).with_context(|| in_name(input))?;
                let last = row_of(here[here.len() - 1].0);
                while let Some((before, data)) = pieces.next(&input.path, None)? {
                    if before >= last {
                        break;
                    }
                    visit_lines(&data, before, opts, &mut |row, item, raw| {
                        if let Line::Good(r, shape) = item {
                            take(row, &r, shape, &|| raw.to_vec())?;
                        }
                        Ok(())
                    })?;
                }
            }
        }
    }
    Ok(())
}
