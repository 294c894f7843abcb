//! Counting each receipt once. The same receipts reach a reader twice more often than one would
//! think: a file given twice, folders that overlap, a shard copied into the next month's folder.
//! Receipts carry ids, so a receipt whose id was seen before is a duplicate: dropped (and
//! counted) when its body is the same, a bad record when it is not (two different decisions
//! under one id; the first one read is kept).
//!
//! The set of seen ids grows with the input, so it is kept small: per distinct id, 96 bits of
//! the id's hash and 32 bits of the body's hash, 16 bytes in a hash table (17 with its control
//! byte; at the table's load of 7/8 to 7/16, 19 to 39 bytes per distinct receipt). Two different
//! ids share a 96-bit key with probability about n² / 2⁹⁷ (6·10⁻¹² for a billion receipts);
//! two different bodies under one id look alike with probability 2⁻³², and then the copy is
//! dropped as a duplicate instead of being reported.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::io::{Read, Seek, SeekFrom, Write};

use anyhow::{Context, Result};

use twox_hash::XxHash64;

use crate::states_io::FieldError;
use crate::{Receipt, ReceiptResult};

/// What [`SeenIds::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The first record with this id.
    New,
    /// Same id, same body as the first: drop it.
    Duplicate,
    /// Same id, different body: a bad record.
    Conflict,
}

/// 96 bits of the id's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IdKey([u32; 3]);

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // The key is already a hash (xxh64): its first 64 bits are the table's hash.
        h.write_u64((u64::from(self.0[0]) << 32) | u64::from(self.0[1]));
    }
}

/// Passes the key's own bits through (see [`IdKey`]'s `Hash`).
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for IdKey; kept correct for any other use.
        self.0 = XxHash64::oneshot(self.0, bytes);
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The ids seen so far, each with a hash of its record's body.
#[derive(Default)]
pub struct SeenIds {
    map: HashMap<IdKey, u32, BuildHasherDefault<PassThrough>>,
    /// Reused for encoding bodies.
    buf: Vec<u8>,
}

fn id_key(id: &str) -> IdKey {
    let a = XxHash64::oneshot(0, id.as_bytes());
    let b = XxHash64::oneshot(0x9e37_79b9_7f4a_7c15, id.as_bytes());
    IdKey([(a >> 32) as u32, a as u32, (b >> 32) as u32])
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_opt(buf: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => buf.push(0),
        Some(s) => {
            buf.push(1);
            put_str(buf, s);
        }
    }
}

/// Every field but the id, length-prefixed so that no two different bodies encode alike.
fn encode_body(r: &Receipt, buf: &mut Vec<u8>) {
    buf.clear();
    put_str(buf, &r.at);
    put_str(buf, &r.point);
    put_opt(buf, r.model.as_deref());
    buf.extend_from_slice(&(r.candidates.len() as u64).to_le_bytes());
    for c in &r.candidates {
        put_str(buf, c);
    }
    match &r.result {
        ReceiptResult::Abstain => buf.push(0),
        ReceiptResult::Pick { id, confidence } => {
            buf.push(1);
            put_str(buf, id);
            // -0.0 and 0.0 are the same confidence
            let c = if *confidence == 0.0 { 0.0 } else { *confidence };
            buf.extend_from_slice(&c.to_bits().to_le_bytes());
        }
    }
    put_str(buf, r.validation.as_str());
    match &r.fallback {
        None => buf.push(0),
        Some(f) => {
            buf.push(1 + u8::from(f.used));
            put_opt(buf, f.to.as_deref());
            put_opt(buf, f.reason.as_deref());
        }
    }
    match &r.outcome {
        None => buf.push(0),
        Some(o) => {
            buf.push(1);
            put_str(buf, o.status.as_str());
            match o.duration_ms {
                None => buf.push(0),
                Some(d) => {
                    buf.push(1);
                    buf.extend_from_slice(&d.to_le_bytes());
                }
            }
            match o.retries {
                None => buf.push(0),
                Some(n) => {
                    buf.push(1);
                    buf.extend_from_slice(&n.to_le_bytes());
                }
            }
        }
    }
    put_opt(buf, r.shadow.as_ref().map(|s| s.reference.as_str()));
    put_opt(buf, r.observed_outcome.as_deref());
}

impl SeenIds {
    pub fn new() -> SeenIds {
        SeenIds::default()
    }

    /// Record `r`'s id; say whether it was seen before and, if so, with the same body.
    pub fn check(&mut self, r: &Receipt) -> Seen {
        // 32 bits of the body's hash are kept per id
        let body = body_hash64(r, &mut self.buf) as u32;
        match self.map.entry(id_key(&r.id)) {
            Entry::Vacant(e) => {
                e.insert(body);
                Seen::New
            }
            Entry::Occupied(e) if *e.get() == body => Seen::Duplicate,
            Entry::Occupied(_) => Seen::Conflict,
        }
    }

    /// Make room for `n` more ids at once when nothing was seen yet (a Parquet file's row count
    /// is known up front): one allocation instead of growing, whose copy briefly holds the old
    /// table and the new one. Later files are not reserved for, since they may repeat ids.
    pub fn reserve_first(&mut self, n: usize) {
        if self.map.is_empty() {
            self.map.reserve(n);
        }
    }

    /// Distinct ids seen.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Heap bytes of the table: its buckets (16 bytes each) and their control bytes.
    pub fn heap_bytes(&self) -> usize {
        let cap = self.map.capacity();
        if cap == 0 {
            return 0;
        }
        // hashbrown keeps at most 7/8 of its (power-of-two) buckets full, all of them below 8
        let buckets = if cap < 8 {
            (cap + 1).next_power_of_two()
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(IdKey, u32)>() + 1) + 16
    }
}

/// 64 bits of the hash of `r`'s body (`buf` is scratch space): how a read tells a duplicate from
/// a conflict ([`SeenIds`] keeps 32 of them per id; the parallel read compares all 64).
pub(super) fn body_hash64(r: &Receipt, buf: &mut Vec<u8>) -> u64 {
    encode_body(r, buf);
    XxHash64::oneshot(2, buf)
}

/// One valid record's place in the id check of a parallel read ([`SpilledIds`]): its id's hash
/// (96 bits, as [`SeenIds`] keeps it) and its position in the input, `file index << 40 | row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IdEntry {
    id: [u32; 3],
    pub seq: u64,
}

impl IdEntry {
    pub fn of(r: &Receipt, seq: u64) -> IdEntry {
        IdEntry::of_id(&r.id, seq)
    }

    pub fn of_id(id: &str, seq: u64) -> IdEntry {
        IdEntry {
            id: id_key(id).0,
            seq,
        }
    }

    fn to_bytes(self) -> [u8; 20] {
        let mut b = [0u8; 20];
        for (k, w) in self.id.iter().enumerate() {
            b[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
        }
        b[12..].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> IdEntry {
        let w = |k: usize| u32::from_le_bytes(b[4 * k..4 * k + 4].try_into().expect("4 bytes"));
        IdEntry {
            id: [w(0), w(1), w(2)],
            seq: u64::from_le_bytes(b[12..20].try_into().expect("8 bytes")),
        }
    }
}

/// A record whose id an earlier record (`first`) already had; both as `file << 40 | row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Repeat {
    pub seq: u64,
    pub first: u64,
}

/// The id check of a read whose records are counted before it is known whether they repeat an
/// earlier id (the parallel read of `decision fit`): every valid record's [`IdEntry`] goes into
/// one of 256 partitions by its id's hash, each spilled to a temporary file in 80 KiB appends,
/// so memory stays flat whatever the input; [`SpilledIds::finish`] then sorts one partition at
/// a time and names every record that repeats an id read before it (input order decides which
/// copy is first, as with [`SeenIds`]). Bodies are compared afterwards, on the repeats alone.
pub(super) struct SpilledIds {
    parts: Vec<Vec<IdEntry>>,
    files: Vec<Option<File>>,
    dir: Option<tempfile::TempDir>,
    /// Entries held per partition before it is appended to its file.
    per_part: usize,
}

const PARTS: usize = 256;

impl SpilledIds {
    pub fn new() -> SpilledIds {
        SpilledIds::with_buffer(4096)
    }

    /// `per_part` entries in memory per partition (tests use a few, to spill).
    pub fn with_buffer(per_part: usize) -> SpilledIds {
        SpilledIds {
            parts: vec![Vec::new(); PARTS],
            files: (0..PARTS).map(|_| None).collect(),
            dir: None,
            per_part: per_part.max(1),
        }
    }

    fn part(e: &IdEntry) -> usize {
        (e.id[0] >> 24) as usize
    }

    pub fn push(&mut self, e: IdEntry) -> Result<()> {
        let p = Self::part(&e);
        self.parts[p].push(e);
        if self.parts[p].len() >= self.per_part {
            self.spill(p)?;
        }
        Ok(())
    }

    fn spill(&mut self, p: usize) -> Result<()> {
        if self.dir.is_none() {
            self.dir = Some(
                tempfile::Builder::new()
                    .prefix("decision-fit-ids")
                    .tempdir()
                    .context("creating a temporary folder for the duplicate-id check (TMPDIR)")?,
            );
        }
        let dir = self.dir.as_ref().expect("made above").path();
        if self.files[p].is_none() {
            let path = dir.join(format!("{p:03}.ids"));
            let f = OpenOptions::new()
                .create_new(true)
                .read(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            self.files[p] = Some(f);
        }
        let mut bytes = Vec::with_capacity(self.parts[p].len() * 20);
        for e in self.parts[p].drain(..) {
            bytes.extend_from_slice(&e.to_bytes());
        }
        self.files[p]
            .as_mut()
            .expect("opened above")
            .write_all(&bytes)
            .context("writing the duplicate-id check's temporary file (is TMPDIR full?)")?;
        Ok(())
    }

    /// Every record that repeats an earlier id, in input order, with the first record of that
    /// id. Partitions are checked in parallel.
    pub fn finish(self) -> Result<Vec<Repeat>> {
        use rayon::prelude::*;
        let SpilledIds {
            parts,
            mut files,
            dir,
            ..
        } = self;
        let mut found: Vec<Repeat> = parts
            .into_par_iter()
            .zip(files.par_iter_mut())
            .map(|(mut entries, file)| -> Result<Vec<Repeat>> {
                if let Some(mut f) = file.take() {
                    // read back a MiB at a time: the partition is held once, as entries
                    let len = f.seek(SeekFrom::End(0))?;
                    f.seek(SeekFrom::Start(0))?;
                    entries.reserve_exact((len / 20) as usize);
                    let mut chunk = vec![0u8; 20 << 16];
                    let mut left = len as usize;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        f.read_exact(&mut chunk[..n])
                            .context("reading back the duplicate-id check's temporary file")?;
                        entries.extend(chunk[..n].chunks_exact(20).map(IdEntry::from_bytes));
                        left -= n;
                    }
                }
                Ok(if entries.len() <= HASHED_MAX {
                    repeats_in_parts(&mut entries)
                } else {
                    repeats_sorted(entries)
                })
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        drop(dir);
        found.sort_unstable();
        Ok(found)
    }
}

/// Partitions of up to this many entries are checked with a hash table (about 25 bytes per
/// entry), larger ones by sorting in place (a partition holds about 1/256 of the input's
/// records: above 268 M records they sort).
const HASHED_MAX: usize = 1 << 20;

/// An id's hash as the key of [`repeats_hashed`]'s table: its bits 32..96 (the partition fixed
/// the top 8, which hashbrown's control bytes would then all share).
#[derive(Clone, Copy, PartialEq, Eq)]
struct LowKey([u32; 3]);

impl Hash for LowKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64((u64::from(self.0[1]) << 32) | u64::from(self.0[2]));
    }
}

/// Entries per hash table in [`repeats_in_parts`]: a table of about 0.5 MiB, which stays in a
/// core's cache (one table for a whole partition of a 100 M-record input was 13 MiB, and its
/// cache misses made the check take a fifth of the run).
const TABLE_ENTRIES: usize = 1 << 14;

/// The repeats among one partition's entries: split in place by the next bits of the id's hash
/// into parts of about [`TABLE_ENTRIES`] (a counting pass, then each entry swapped into its
/// part), each checked with a table of its own.
fn repeats_in_parts(entries: &mut [IdEntry]) -> Vec<Repeat> {
    let parts = (entries.len() / TABLE_ENTRIES).next_power_of_two().min(256);
    if parts <= 1 {
        return repeats_hashed(entries);
    }
    // bits 16..24 of the hash: the partition took the top 8, the table's key starts at 32
    let part = |e: &IdEntry| ((e.id[0] >> 16) as usize) & (parts - 1);
    let mut start = vec![0usize; parts + 1];
    for e in entries.iter() {
        start[part(e) + 1] += 1;
    }
    for k in 0..parts {
        start[k + 1] += start[k];
    }
    let mut next = start.clone();
    for k in 0..parts {
        while next[k] < start[k + 1] {
            let p = part(&entries[next[k]]);
            if p == k {
                next[k] += 1;
            } else {
                entries.swap(next[k], next[p]);
                next[p] += 1;
            }
        }
    }
    (0..parts)
        .flat_map(|k| repeats_hashed(&entries[start[k]..start[k + 1]]))
        .collect()
}

/// The repeats among some entries, by a table of each id's first place.
fn repeats_hashed(entries: &[IdEntry]) -> Vec<Repeat> {
    let mut first: HashMap<LowKey, u64, BuildHasherDefault<PassThrough>> =
        HashMap::with_capacity_and_hasher(entries.len(), Default::default());
    // every entry whose id was met before, and the entries they displaced as first (entries
    // come almost, not quite, in input order)
    let mut again: Vec<(LowKey, u64)> = Vec::new();
    for e in entries {
        let key = LowKey(e.id);
        match first.entry(key) {
            Entry::Vacant(v) => {
                v.insert(e.seq);
            }
            Entry::Occupied(mut o) => {
                let f = o.get_mut();
                again.push((key, (*f).max(e.seq)));
                *f = (*f).min(e.seq);
            }
        }
    }
    again
        .into_iter()
        .map(|(key, seq)| Repeat {
            seq,
            first: first[&key],
        })
        .collect()
}

/// The repeats among one partition's entries, by sorting them.
fn repeats_sorted(mut entries: Vec<IdEntry>) -> Vec<Repeat> {
    // 64 bits of the id's hash decide almost every comparison; runs that share them (the same
    // id, or rarely two) are put in (id, place) order afterwards
    let top = |e: &IdEntry| (u64::from(e.id[0]) << 32) | u64::from(e.id[1]);
    entries.sort_unstable_by_key(top);
    let mut i = 0;
    while i < entries.len() {
        let j = i + entries[i..]
            .iter()
            .take_while(|e| top(e) == top(&entries[i]))
            .count();
        if j - i > 1 {
            entries[i..j].sort_unstable_by_key(|e| (e.id[2], e.seq));
        }
        i = j;
    }
    let mut out = Vec::new();
    let mut first: Option<IdEntry> = None;
    for e in entries {
        match first {
            Some(f) if f.id == e.id => out.push(Repeat {
                seq: e.seq,
                first: f.seq,
            }),
            _ => first = Some(e),
        }
    }
    out
}

/// The error a conflicting duplicate is reported with.
pub fn conflict_error(r: &Receipt) -> FieldError {
    FieldError::new(
        "id",
        format!(
            "duplicate id {:?} with a different body than the record read first under it (that one is counted)",
            r.id
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fallback, Outcome, OutcomeStatus, Shadow, Validation};

    fn receipt(id: &str) -> Receipt {
        Receipt {
            id: id.into(),
            at: "2026-11-30T12:00:00Z".into(),
            point: "tool".into(),
            model: Some("m".into()),
            candidates: vec!["a".into(), "b".into()],
            result: ReceiptResult::Pick {
                id: "a".into(),
                confidence: 0.9,
            },
            validation: Validation::Accepted,
            fallback: Some(Fallback {
                used: false,
                to: None,
                reason: None,
            }),
            outcome: Some(Outcome {
                status: OutcomeStatus::Success,
                duration_ms: Some(5),
                retries: Some(0),
            }),
            shadow: Some(Shadow {
                reference: "a".into(),
            }),
            observed_outcome: Some("ok".into()),
        }
    }

    #[test]
    fn same_id_same_body_is_a_duplicate_a_different_body_a_conflict() {
        let mut s = SeenIds::new();
        assert_eq!(s.check(&receipt("r1")), Seen::New);
        assert_eq!(s.check(&receipt("r2")), Seen::New);
        assert_eq!(s.check(&receipt("r1")), Seen::Duplicate);
        // every field of the body counts
        let changes: Vec<fn(&mut Receipt)> = vec![
            |r| r.at = "2026-11-30T12:00:01Z".into(),
            |r| r.point = "args".into(),
            |r| r.model = None,
            |r| r.candidates.push("c".into()),
            |r| r.candidates = vec!["ab".into()],
            |r| r.result = ReceiptResult::Abstain,
            |r| {
                r.result = ReceiptResult::Pick {
                    id: "a".into(),
                    confidence: 0.91,
                }
            },
            |r| r.validation = Validation::RejectedStale,
            |r| r.fallback.as_mut().unwrap().used = true,
            |r| r.fallback = None,
            |r| r.outcome.as_mut().unwrap().status = OutcomeStatus::Failure,
            |r| r.outcome.as_mut().unwrap().duration_ms = Some(6),
            |r| r.outcome.as_mut().unwrap().retries = None,
            |r| r.shadow = None,
            |r| r.observed_outcome = Some("ko".into()),
        ];
        for (k, change) in changes.iter().enumerate() {
            let mut r = receipt("r1");
            change(&mut r);
            assert_eq!(s.check(&r), Seen::Conflict, "change {k}");
        }
        assert_eq!(s.len(), 2, "conflicts add no ids");
        // the first body stays the reference
        assert_eq!(s.check(&receipt("r1")), Seen::Duplicate);
        assert_eq!(s.check(&receipt("r3")), Seen::New);
    }

    #[test]
    fn fields_do_not_run_into_each_other() {
        let mut s = SeenIds::new();
        let mut a = receipt("x");
        a.candidates = vec!["a".into(), "bc".into()];
        let mut b = receipt("x");
        b.candidates = vec!["ab".into(), "c".into()];
        assert_eq!(s.check(&a), Seen::New);
        assert_eq!(s.check(&b), Seen::Conflict);
        let mut c = receipt("y");
        c.model = Some(String::new());
        let mut d = receipt("y");
        d.model = None;
        assert_eq!(s.check(&c), Seen::New);
        assert_eq!(s.check(&d), Seen::Conflict);
    }

    /// The figures in the README, one process each (peak RSS from /proc, so Linux only):
    /// `cargo test -p decision-data --lib -- --ignored --nocapture --exact
    /// receipts_io::dedup::tests::ten_million_ids_grown` (and `_reserved`).
    fn ten_million_ids(reserve: bool) {
        fn peak_rss() -> u64 {
            let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024)
        }
        let n = 10_000_000;
        let before = peak_rss();
        let mut s = SeenIds::new();
        if reserve {
            s.reserve_first(n);
        }
        let mut r = receipt("");
        let t = std::time::Instant::now();
        for i in 0..n {
            r.id.clear();
            std::fmt::Write::write_fmt(&mut r.id, format_args!("r{i:09}")).unwrap();
            assert_eq!(s.check(&r), Seen::New);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "reserve {reserve}: {n} ids in {secs:.2} s ({:.0} ns each), table {} MB ({:.1} B/id), peak RSS +{} MB",
            secs * 1e9 / n as f64,
            s.heap_bytes() / 1_000_000,
            s.heap_bytes() as f64 / n as f64,
            peak_rss().saturating_sub(before) / 1_000_000
        );
        assert!(s.heap_bytes() as f64 / (n as f64) < 40.0);
    }

    #[test]
    #[ignore = "measurement, 10 M ids: run by hand"]
    fn ten_million_ids_grown() {
        ten_million_ids(false);
    }

    #[test]
    #[ignore = "measurement, 10 M ids: run by hand"]
    fn ten_million_ids_reserved() {
        ten_million_ids(true);
    }

    /// The three ways of finding a partition's repeats (one table, tables per part after an
    /// in-place split, sorting) against a plain map of each id's first place, on 100 000
    /// entries out of input order, a tenth of them repeats of an id (some three times), a few
    /// ids sharing their top 64 bits.
    #[test]
    fn every_way_of_finding_repeats_finds_the_same() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut entries: Vec<IdEntry> = (0..100_000u64)
            .map(|seq| IdEntry {
                id: [
                    0x7f00_0000 | rng.random_range(0..1 << 24),
                    rng.random(),
                    rng.random(),
                ],
                seq,
            })
            .collect();
        for k in 0..10_000 {
            let mut e = entries[rng.random_range(0..entries.len())];
            e.seq = 100_000 + k;
            if k % 100 == 0 {
                // another id with the same top 64 bits
                e.id[2] ^= 1;
            }
            entries.push(e);
        }
        // out of order, as pieces' suspects and the spilled files leave them
        for i in (1..entries.len()).rev() {
            entries.swap(i, rng.random_range(0..=i));
        }
        let mut first: std::collections::HashMap<[u32; 3], u64> = Default::default();
        for e in &entries {
            let f = first.entry(e.id).or_insert(e.seq);
            *f = (*f).min(e.seq);
        }
        let mut want: Vec<Repeat> = entries
            .iter()
            .filter(|e| first[&e.id] != e.seq)
            .map(|e| Repeat {
                seq: e.seq,
                first: first[&e.id],
            })
            .collect();
        want.sort_unstable();
        assert!(want.len() > 9_000, "{}", want.len());
        let sorted = |mut r: Vec<Repeat>| {
            r.sort_unstable();
            r
        };
        assert_eq!(sorted(repeats_hashed(&entries)), want);
        assert_eq!(sorted(repeats_sorted(entries.clone())), want);
        assert!(entries.len() / TABLE_ENTRIES > 4, "the split path is taken");
        assert_eq!(sorted(repeats_in_parts(&mut entries)), want);
    }

    #[test]
    fn many_ids_stay_distinct_and_the_table_stays_small() {
        let mut s = SeenIds::new();
        let n = 200_000;
        for i in 0..n {
            assert_eq!(s.check(&receipt(&format!("r{i:09}"))), Seen::New, "{i}");
        }
        for i in (0..n).step_by(997) {
            assert_eq!(s.check(&receipt(&format!("r{i:09}"))), Seen::Duplicate);
        }
        assert_eq!(s.len(), n);
        let per = s.heap_bytes() as f64 / n as f64;
        assert!((17.0..=40.0).contains(&per), "{per} bytes per receipt");
    }
}
