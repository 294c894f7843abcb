//! Checkpoints in the run folder.
//!
//! ```text
//! RUN_DIR/checkpoints/step-0000200/
//!   COMPLETE                  written last: a folder without it is never picked. It is the
//!                             checkpoint's manifest: every other file's size and SHA-256
//!                             (schema decision-checkpoint/1)
//!   trainer_state.json        step, epoch, position in the epoch's order, seed, RNG stream
//!                             position, the logged losses so far (schema decision-trainer-state/1)
//!   run.toml                  the resolved run config
//!   optimizer.safetensors     AdamW moments by parameter path (`<path>.exp_avg`, `.exp_avg_sq`)
//!   model/                    full mode: the model in Hugging Face layout (config.json,
//!                             model.safetensors, tokenizer.json, decision.json)
//!   adapter/                  lora mode: the adapters in PEFT layout (the base is in run.toml)
//! ```
//!
//! A checkpoint is assembled in a hidden sibling folder (`.tmp-step-…`), every file is synced and
//! hashed, `COMPLETE` is written, and the folder is renamed into place (see `publish_dir`); a
//! crash leaves at most a hidden temporary folder that the next save removes. Only the newest
//! `keep` complete checkpoints are kept.
//!
//! `--resume` takes [`newest_verified`]: the newest checkpoint whose files still match the
//! hashes `COMPLETE` recorded. One that does not (a file missing, truncated, a byte changed, the
//! marker itself damaged) is passed over with a warning naming it, for the one before it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::model::weights::{SaveDtype, write_safetensors_with};
use crate::optim::{AdamW, AdamWSettings};

pub(crate) const COMPLETE: &str = "COMPLETE";
pub(crate) const STATE_FILE: &str = "trainer_state.json";
pub(crate) const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub(crate) const STATE_SCHEMA: &str = "decision-trainer-state/1";
pub const MANIFEST_SCHEMA: &str = "decision-checkpoint/1";

/// Where the data order and the random streams stand; enough to continue a run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainerState {
    pub schema: String,
    /// Optimizer steps done.
    pub step: u64,
    /// Current epoch (0-based) and the number of its examples already consumed.
    pub epoch: u64,
    pub position: usize,
    /// The run seed; the epoch order, the candidate orders and the per-step dropout seeds are
    /// all derived from (seed, epoch, index) or (seed, step), so no hidden RNG state exists.
    pub seed: u64,
    /// Tokens seen so far (for throughput reporting).
    pub tokens: u64,
    /// Mean training loss of each optimizer step so far.
    pub losses: Vec<f32>,
    /// The dtype the frozen base computes in: `[train] dtype` as resolved on the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<crate::Precision>,
    /// The dynamic loss scale, when the run scales its loss (`[train] loss_scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<crate::model::f16_safety::LossScaler>,
    /// Projections computed in f32 since their f16 product overflowed (`[train]
    /// f16_overflow`), by checkpoint path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub f32_projections: Vec<String>,
}

impl TrainerState {
    pub fn new(seed: u64) -> Self {
        Self {
            schema: STATE_SCHEMA.into(),
            step: 0,
            epoch: 0,
            position: 0,
            seed,
            tokens: 0,
            losses: Vec::new(),
            dtype: None,
            loss_scale: None,
            f32_projections: Vec::new(),
        }
    }
}

pub(crate) fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

pub(crate) fn step_dir_name(step: u64) -> String {
    format!("step-{step:07}")
}

/// Every `step-N` folder, complete or not, oldest first.
fn step_dirs(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let dir = checkpoints_dir(run_dir);
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(out);
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(num) = name.strip_prefix("step-") else {
            continue;
        };
        let Ok(step) = num.parse::<u64>() else {
            continue;
        };
        out.push((step, e.path()));
    }
    out.sort();
    Ok(out)
}

/// Complete checkpoints, oldest first.
pub(crate) fn list_complete(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = step_dirs(run_dir)?;
    out.retain(|(_, p)| p.join(COMPLETE).is_file());
    Ok(out)
}

/// The newest complete checkpoint, if any.
pub(crate) fn latest(run_dir: &Path) -> Result<Option<(u64, PathBuf)>> {
    Ok(list_complete(run_dir)?.pop())
}

/// What `COMPLETE` records: every other file of the checkpoint, by its path in the folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Manifest {
    schema: String,
    files: BTreeMap<String, FileHash>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct FileHash {
    bytes: u64,
    sha256: String,
}

/// How a checkpoint checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verified {
    /// Every file has the size and SHA-256 its `COMPLETE` manifest records.
    Hashed,
    /// Written before checkpoints recorded hashes (`COMPLETE` holds only `ok`): complete, but
    /// nothing to check its files against.
    Unhashed,
}

/// Check checkpoint `dir` against its `COMPLETE` manifest; the error says what is wrong (no
/// marker, a marker that is not a manifest, a file missing, of another size, or changed).
pub fn verify(dir: &Path) -> Result<Verified> {
    let marker = dir.join(COMPLETE);
    let bytes = match fs::read(&marker) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no {COMPLETE} marker (an unfinished save)")
        }
        Err(e) => return Err(e).with_context(|| format!("reading {COMPLETE}")),
    };
    if bytes == b"ok\n" {
        return Ok(Verified::Unhashed);
    }
    let m: Manifest = serde_json::from_slice(&bytes)
        .with_context(|| format!("{COMPLETE} is not a checkpoint manifest (damaged)"))?;
    if m.schema != MANIFEST_SCHEMA {
        bail!(
            "{COMPLETE}: schema {:?}, expected {MANIFEST_SCHEMA:?}",
            m.schema
        );
    }
    if !m.files.contains_key(STATE_FILE) {
        bail!("{COMPLETE} does not list {STATE_FILE}");
    }
    for (rel, want) in &m.files {
        let inside = Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        if !inside {
            bail!("{COMPLETE} lists {rel:?}, which is not a file of the checkpoint");
        }
        let path = dir.join(rel);
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("{rel} is missing"),
            Err(e) => return Err(e).with_context(|| format!("opening {rel}")),
        };
        let len = file.metadata().with_context(|| rel.clone())?.len();
        if len != want.bytes {
            bail!("{rel} has {len} bytes, {} when it was written", want.bytes);
        }
        let (sha, _) = decision_data::stable_hash::sha256_hex(file)
            .with_context(|| format!("reading {rel}"))?;
        if sha != want.sha256 {
            bail!(
                "{rel} changed since it was written (sha256 {sha}, recorded {})",
                want.sha256
            );
        }
    }
    Ok(Verified::Hashed)
}

/// The checkpoint a resumed run continues from: the newest that [`verify`] accepts. Each newer
/// one is passed over with a warning through `warn` that names it, says what is wrong and which
/// checkpoint is used instead; an unhashed (older) checkpoint is used with a warning that it was
/// not verified. `None` when the run has no checkpoint; an error naming every checkpoint and
/// its fault when there are some but none verifies.
pub(crate) fn newest_verified(
    run_dir: &Path,
    warn: &mut dyn FnMut(&str),
) -> Result<Option<(u64, PathBuf)>> {
    let mut bad: Vec<String> = Vec::new();
    for (step, path) in step_dirs(run_dir)?.into_iter().rev() {
        match verify(&path) {
            Ok(how) => {
                for b in &bad {
                    warn(&format!(
                        "checkpoint {b}; resuming from {} instead",
                        path.display()
                    ));
                }
                if how == Verified::Unhashed {
                    warn(&format!(
                        "checkpoint {} records no file hashes (written by an older decision \
                         train), so it was not verified",
                        path.display()
                    ));
                }
                return Ok(Some((step, path)));
            }
            Err(e) => bad.push(format!("{}: {e:#}", path.display())),
        }
    }
    if bad.is_empty() {
        return Ok(None);
    }
    bail!(
        "no checkpoint of {} is intact, so there is nothing to resume from:\n  {}",
        run_dir.display(),
        bad.join("\n  ")
    )
}

/// A checkpoint being written; call [`PendingCheckpoint::commit`] to publish it.
pub(crate) struct PendingCheckpoint {
    pub tmp: PathBuf,
    target: PathBuf,
    keep: usize,
    run_dir: PathBuf,
}

impl PendingCheckpoint {
    /// Start the checkpoint for `step` (removing leftovers of an interrupted save).
    pub fn begin(run_dir: &Path, step: u64, keep: usize) -> Result<Self> {
        let dir = checkpoints_dir(run_dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for e in fs::read_dir(&dir)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        let name = step_dir_name(step);
        let tmp = dir.join(format!(".tmp-{name}"));
        fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            tmp,
            target: dir.join(name),
            keep,
            run_dir: run_dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Sync and hash every file, write the manifest (`COMPLETE`), rename into place, prune old
    /// checkpoints.
    pub fn commit(self) -> Result<PathBuf> {
        let mut files = BTreeMap::new();
        seal_tree(&self.tmp, &mut files)?;
        let manifest = Manifest {
            schema: MANIFEST_SCHEMA.into(),
            files,
        };
        decision_data::atomic::write_json_atomic(self.tmp.join(COMPLETE), &manifest)?;
        let name = self.target.file_name().expect("step-N").to_string_lossy();
        let aside = checkpoints_dir(&self.run_dir).join(format!(".tmp-replaced-{name}"));
        publish_dir(&self.tmp, &self.target, &aside)?;
        prune(&self.run_dir, self.keep)?;
        Ok(self.target)
    }
}

/// Sync every file under `dir` (and `dir` itself, and each folder below it), recording each
/// file's size and SHA-256 under its path below `dir` (`/`-separated).
fn seal_tree(dir: &Path, hashes: &mut BTreeMap<String, FileHash>) -> Result<()> {
    decision_data::atomic::sync_tree_with(dir, &mut |rel, file| {
        let (sha256, bytes) = decision_data::stable_hash::sha256_hex(file)
            .with_context(|| format!("reading {}", dir.join(rel).display()))?;
        hashes.insert(rel.to_string(), FileHash { bytes, sha256 });
        Ok(())
    })
}

// The trainer's `final/` is published as checkpoints are, through the one folder publisher.
pub(crate) use decision_data::atomic::{publish_dir, sync_tree};

/// Keep only the newest `keep` complete checkpoints (at least one).
pub(crate) fn prune(run_dir: &Path, keep: usize) -> Result<()> {
    let all = list_complete(run_dir)?;
    let keep = keep.max(1);
    if all.len() > keep {
        for (_, p) in &all[..all.len() - keep] {
            fs::remove_dir_all(p)
                .with_context(|| format!("removing old checkpoint {}", p.display()))?;
        }
    }
    Ok(())
}

/// Write named f32 vectors as one safetensors file (1-D tensors).
#[cfg(test)]
pub(crate) fn write_tensors(
    path: &Path,
    tensors: &BTreeMap<String, Vec<f32>>,
    metadata: BTreeMap<String, String>,
) -> Result<()> {
    let shapes: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|(k, v)| (k.clone(), vec![v.len()]))
        .collect();
    let each = tensors
        .iter()
        .map(|(k, v)| crate::model::weights::HfTensor {
            name: k.clone(),
            shape: vec![v.len()],
            data: v.clone(),
        });
    write_safetensors_with(path, &shapes, each, SaveDtype::F32, &metadata)
}

/// Save the optimizer's moments as checkpoint file `path`, one tensor at a time. A full
/// fine-tune's moments are twice its weights in f32: a host copy of all of them, and another as
/// the file's bytes, made each checkpoint the run's peak. The header's `step` is AdamW's own
/// count.
pub(crate) fn write_optimizer(path: &Path, opt: &AdamW) -> Result<()> {
    let meta = BTreeMap::from([("step".to_string(), opt.step.to_string())]);
    write_safetensors_with(
        path,
        &opt.moment_shapes(),
        opt.moment_tensors(),
        SaveDtype::F32,
        &meta,
    )
}

/// The optimizer saved by [`write_optimizer`], read through a memory map one tensor at a time.
/// A file without a `step` (written before AdamW kept its own count) takes `run_step`.
pub(crate) fn read_optimizer(
    path: &Path,
    settings: AdamWSettings,
    run_step: u64,
    device: &burn::tensor::Device,
) -> Result<AdamW> {
    with_tensors(path, |meta, tensors| {
        // AdamW's own step count: below the run's when loss scaling skipped steps.
        let step = match meta.get("step") {
            Some(v) => v.parse().with_context(|| {
                format!("{}: metadata step {v:?} is not a number", path.display())
            })?,
            None => run_step,
        };
        AdamW::import(settings, step, tensors, device)
    })
}

/// Named f32 vectors and the file's metadata.
#[cfg(test)]
pub(crate) type NamedTensors = (BTreeMap<String, Vec<f32>>, BTreeMap<String, String>);

/// Read a file written by [`write_tensors`] or [`write_optimizer`], whole.
#[cfg(test)]
pub(crate) fn read_tensors(path: &Path) -> Result<NamedTensors> {
    with_tensors(path, |meta, tensors| {
        Ok((tensors.collect::<Result<_>>()?, meta))
    })
}

/// Open safetensors file `path` through a memory map and hand `f` its metadata and its f32
/// tensors, each converted when the iterator reaches it.
fn with_tensors<T>(
    path: &Path,
    f: impl FnOnce(
        BTreeMap<String, String>,
        &mut dyn Iterator<Item = Result<(String, Vec<f32>)>>,
    ) -> Result<T>,
) -> Result<T> {
    let file = fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    // SAFETY: the map is read-only; a file changed underneath us while loading is the same
    // hazard every safetensors reader accepts.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("memory-mapping {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&map)
        .with_context(|| format!("{}: not a safetensors file", path.display()))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&map)?;
    let metadata = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut tensors = st.tensors().into_iter().map(|(name, view)| {
        if view.dtype() != safetensors::Dtype::F32 {
            bail!(
                "{}: tensor `{name}` is {:?}, expected F32",
                path.display(),
                view.dtype()
            );
        }
        let v: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok((name, v))
    });
    f(metadata, &mut tensors)
}

pub(crate) fn write_state(dir: &Path, state: &TrainerState) -> Result<()> {
    decision_data::atomic::write_json_atomic(dir.join(STATE_FILE), state)
}

pub(crate) fn read_state(dir: &Path) -> Result<TrainerState> {
    let p = dir.join(STATE_FILE);
    let text = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let s: TrainerState = serde_json::from_str(&text)
        .with_context(|| format!("{}: bad trainer state", p.display()))?;
    if s.schema != STATE_SCHEMA {
        bail!(
            "{}: schema {:?}, expected {STATE_SCHEMA:?}",
            p.display(),
            s.schema
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_checkpoints_are_never_picked_and_old_ones_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        for step in [10u64, 20, 30] {
            let c = PendingCheckpoint::begin(run, step, 2).unwrap();
            write_state(
                c.path(),
                &TrainerState {
                    step,
                    ..TrainerState::new(1)
                },
            )
            .unwrap();
            c.commit().unwrap();
        }
        // an interrupted save: folder without the marker, and a hidden temporary
        fs::create_dir_all(checkpoints_dir(run).join("step-0000040")).unwrap();
        fs::create_dir_all(checkpoints_dir(run).join(".tmp-step-0000050")).unwrap();
        let all = list_complete(run).unwrap();
        assert_eq!(all.iter().map(|c| c.0).collect::<Vec<_>>(), vec![20, 30]);
        let (step, path) = latest(run).unwrap().unwrap();
        assert_eq!(step, 30);
        assert_eq!(read_state(&path).unwrap().step, 30);
        // the next save clears the stale temporary folder
        let c = PendingCheckpoint::begin(run, 60, 2).unwrap();
        assert!(!checkpoints_dir(run).join(".tmp-step-0000050").exists());
        c.commit().unwrap();
        assert_eq!(latest(run).unwrap().unwrap().0, 60);
    }

    /// Checkpoints 10, 20 and 30 of a run, each with a trainer state, a nested weights file and
    /// optimizer moments, as the trainer writes them.
    fn three_checkpoints(run: &Path) {
        for step in [10u64, 20, 30] {
            let c = PendingCheckpoint::begin(run, step, 5).unwrap();
            write_state(
                c.path(),
                &TrainerState {
                    step,
                    ..TrainerState::new(1)
                },
            )
            .unwrap();
            let weights: Vec<u8> = (0..4096u32).map(|i| (i * 7 + step as u32) as u8).collect();
            decision_data::atomic::write_atomic(c.path().join("model/model.safetensors"), &weights)
                .unwrap();
            let mut t = BTreeMap::new();
            t.insert("w.exp_avg".to_string(), vec![step as f32; 64]);
            write_tensors(&c.path().join(OPTIMIZER_FILE), &t, BTreeMap::new()).unwrap();
            c.commit().unwrap();
        }
    }

    fn newest(run: &Path) -> (Result<Option<(u64, PathBuf)>>, Vec<String>) {
        let mut warnings = Vec::new();
        let got = newest_verified(run, &mut |w| warnings.push(w.to_string()));
        (got, warnings)
    }

    #[test]
    fn an_intact_checkpoint_verifies_and_records_every_file() {
        let dir = tempfile::tempdir().unwrap();
        three_checkpoints(dir.path());
        let (got, warnings) = newest(dir.path());
        assert_eq!(got.unwrap().unwrap().0, 30);
        assert!(warnings.is_empty(), "{warnings:?}");
        let step30 = checkpoints_dir(dir.path()).join("step-0000030");
        assert_eq!(verify(&step30).unwrap(), Verified::Hashed);
        let m: Manifest =
            serde_json::from_slice(&fs::read(step30.join(COMPLETE)).unwrap()).unwrap();
        assert_eq!(
            m.files.keys().collect::<Vec<_>>(),
            ["model/model.safetensors", OPTIMIZER_FILE, STATE_FILE]
        );
        assert_eq!(m.files["model/model.safetensors"].bytes, 4096);
        // no run has no checkpoint: nothing to resume from, and no error
        let empty = tempfile::tempdir().unwrap();
        assert!(newest(empty.path()).0.unwrap().is_none());
    }

    /// Each way the newest checkpoint can be damaged: it is passed over for step 20, with a
    /// warning that names it and the fault.
    #[test]
    fn a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
        type Damage = fn(&Path);
        let cases: [(&str, Damage, &str); 5] = [
            (
                "a flipped byte",
                |c| {
                    let p = c.join("model/model.safetensors");
                    let mut b = fs::read(&p).unwrap();
                    b[2000] ^= 0x10;
                    fs::write(&p, b).unwrap();
                },
                "model/model.safetensors changed since it was written",
            ),
            (
                "a truncated file",
                |c| {
                    let p = c.join(OPTIMIZER_FILE);
                    let b = fs::read(&p).unwrap();
                    fs::write(&p, &b[..b.len() / 2]).unwrap();
                },
                "optimizer.safetensors has",
            ),
            (
                "a missing file",
                |c| fs::remove_file(c.join(STATE_FILE)).unwrap(),
                "trainer_state.json is missing",
            ),
            (
                "a damaged marker",
                |c| {
                    let p = c.join(COMPLETE);
                    let b = fs::read(&p).unwrap();
                    fs::write(&p, &b[..b.len() - 9]).unwrap();
                },
                "not a checkpoint manifest",
            ),
            (
                "no marker",
                |c| fs::remove_file(c.join(COMPLETE)).unwrap(),
                "no COMPLETE marker",
            ),
        ];
        for (what, damage, fault) in cases {
            let dir = tempfile::tempdir().unwrap();
            three_checkpoints(dir.path());
            damage(&checkpoints_dir(dir.path()).join("step-0000030"));
            let (got, warnings) = newest(dir.path());
            let (step, path) = got.unwrap().unwrap();
            assert_eq!(step, 20, "{what}: resumed from {}", path.display());
            assert_eq!(warnings.len(), 1, "{what}: {warnings:?}");
            let w = &warnings[0];
            assert!(
                w.contains("step-0000030") && w.contains(fault) && w.contains("step-0000020"),
                "{what}: {w}"
            );
        }
    }

    #[test]
    fn no_intact_checkpoint_is_an_error_naming_each() {
        let dir = tempfile::tempdir().unwrap();
        three_checkpoints(dir.path());
        for step in [10u64, 20, 30] {
            let p = checkpoints_dir(dir.path())
                .join(step_dir_name(step))
                .join("model/model.safetensors");
            let mut b = fs::read(&p).unwrap();
            b[0] ^= 1;
            fs::write(&p, b).unwrap();
        }
        let (got, warnings) = newest(dir.path());
        let err = format!("{:#}", got.unwrap_err());
        assert!(err.contains("nothing to resume from"), "{err}");
        for name in ["step-0000010", "step-0000020", "step-0000030"] {
            assert!(err.contains(name), "{name} not named: {err}");
        }
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    /// A checkpoint written before hashes were recorded (`COMPLETE` = "ok") is still used, with a
    /// warning that it was not verified.
    #[test]
    fn an_unhashed_checkpoint_is_used_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        three_checkpoints(dir.path());
        let step30 = checkpoints_dir(dir.path()).join("step-0000030");
        fs::write(step30.join(COMPLETE), b"ok\n").unwrap();
        let (got, warnings) = newest(dir.path());
        assert_eq!(got.unwrap().unwrap().0, 30);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("not verified"), "{warnings:?}");
    }

    #[test]
    fn tensors_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.safetensors");
        let mut t = BTreeMap::new();
        t.insert("a.exp_avg".to_string(), vec![1.0f32, -2.5, 3.25]);
        t.insert("b".to_string(), vec![0.0f32]);
        let mut meta = BTreeMap::new();
        meta.insert("step".to_string(), "7".to_string());
        write_tensors(&p, &t, meta.clone()).unwrap();
        let (back, m) = read_tensors(&p).unwrap();
        assert_eq!(back, t);
        assert_eq!(m, meta);
    }
}
