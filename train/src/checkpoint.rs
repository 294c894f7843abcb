//! Checkpoints in the run folder.
//!
//! ```text
//! RUN_DIR/checkpoints/step-0000200/
//!   COMPLETE                  written last: a folder without it is never picked
//!   trainer_state.json        step, epoch, position in the epoch's order, seed, RNG stream
//!                             position, the logged losses so far (schema decision-trainer-state/1)
//!   run.toml                  the resolved run config
//!   optimizer.safetensors     AdamW moments by parameter path (`<path>.exp_avg`, `.exp_avg_sq`)
//!   model/                    full mode: the model in Hugging Face layout (config.json,
//!                             model.safetensors, tokenizer.json, decision.json)
//!   adapter/                  lora mode: the adapters in PEFT layout (the base is in run.toml)
//! ```
//!
//! A checkpoint is assembled in a hidden sibling folder (`.tmp-step-…`), every file is synced,
//! `COMPLETE` is written, and the folder is renamed into place (see [`publish_dir`]); a crash
//! leaves at most a hidden temporary folder that the next save removes. Only the newest `keep`
//! complete checkpoints are kept.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

pub const COMPLETE: &str = "COMPLETE";
pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_SCHEMA: &str = "decision-trainer-state/1";

/// Where the data order and the random streams stand; enough to continue a run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
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
        }
    }
}

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:07}")
}

/// Complete checkpoints, oldest first.
pub fn list_complete(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
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
        if e.path().join(COMPLETE).is_file() {
            out.push((step, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The newest complete checkpoint, if any.
pub fn latest(run_dir: &Path) -> Result<Option<(u64, PathBuf)>> {
    Ok(list_complete(run_dir)?.pop())
}

/// A checkpoint being written; call [`PendingCheckpoint::commit`] to publish it.
pub struct PendingCheckpoint {
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

    /// Sync every file, write the marker, rename into place, prune old checkpoints.
    pub fn commit(self) -> Result<PathBuf> {
        sync_tree(&self.tmp)?;
        decision_data::atomic::write_atomic(self.tmp.join(COMPLETE), b"ok\n")?;
        let name = self.target.file_name().expect("step-N").to_string_lossy();
        let aside = checkpoints_dir(&self.run_dir).join(format!(".tmp-replaced-{name}"));
        publish_dir(&self.tmp, &self.target, &aside)?;
        prune(&self.run_dir, self.keep)?;
        Ok(self.target)
    }
}

/// Sync every file and folder under `dir`.
pub(crate) fn sync_tree(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        if p.is_dir() {
            sync_tree(&p)?;
        } else {
            fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("syncing {}", p.display()))?;
        }
    }
    decision_data::atomic::sync_dir(dir);
    Ok(())
}

/// Put the folder `staged` (written and synced in full) at `target`, its sibling. An existing
/// `target` is first renamed to `aside` and removed only once `staged` is in place, so at every
/// moment `target` is the old folder, absent, or the new one: never part of either. The parent
/// is synced so the rename survives a crash.
pub(crate) fn publish_dir(staged: &Path, target: &Path, aside: &Path) -> Result<()> {
    if fs::symlink_metadata(aside).is_ok() {
        fs::remove_dir_all(aside).with_context(|| format!("removing {}", aside.display()))?;
    }
    let replacing = fs::symlink_metadata(target).is_ok();
    if replacing {
        fs::rename(target, aside).with_context(|| format!("moving {} aside", target.display()))?;
    }
    fs::rename(staged, target)
        .with_context(|| format!("renaming {} to {}", staged.display(), target.display()))?;
    if let Some(parent) = target.parent() {
        decision_data::atomic::sync_dir(parent);
    }
    if replacing {
        fs::remove_dir_all(aside).with_context(|| format!("removing {}", aside.display()))?;
    }
    Ok(())
}

/// Keep only the newest `keep` complete checkpoints (at least one).
pub fn prune(run_dir: &Path, keep: usize) -> Result<()> {
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
pub fn write_tensors(
    path: &Path,
    tensors: &BTreeMap<String, Vec<f32>>,
    metadata: BTreeMap<String, String>,
) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(k, v)| {
            let bytes: &[u8] = bytemuck_f32(v);
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![v.len()], bytes)
                    .expect("shape matches data");
            (k.clone(), view)
        })
        .collect();
    let meta: std::collections::HashMap<String, String> = metadata.into_iter().collect();
    let bytes = safetensors::serialize(views, Some(meta)).context("serialising tensors")?;
    decision_data::atomic::write_atomic(path, &bytes)
}

/// Named f32 vectors and the file's metadata.
pub type NamedTensors = (BTreeMap<String, Vec<f32>>, BTreeMap<String, String>);

/// Read a file written by [`write_tensors`].
pub fn read_tensors(path: &Path) -> Result<NamedTensors> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{}: not a safetensors file", path.display()))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
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
        out.insert(name, v);
    }
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)?;
    let metadata = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    Ok((out, metadata))
}

fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the slice covers exactly
    // the vector's memory. safetensors stores little-endian, which is every target we build for.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn write_state(dir: &Path, state: &TrainerState) -> Result<()> {
    decision_data::atomic::write_json_atomic(dir.join(STATE_FILE), state)
}

pub fn read_state(dir: &Path) -> Result<TrainerState> {
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

    /// Publishing over an existing folder replaces it whole and leaves neither the staging
    /// folder nor the old one behind.
    #[test]
    fn publish_replaces_a_folder_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (staged, target, aside) = (
            dir.path().join(".new"),
            dir.path().join("final"),
            dir.path().join(".old"),
        );
        fs::create_dir_all(target.join("adapter")).unwrap();
        fs::write(target.join("adapter/a.bin"), b"old").unwrap();
        fs::write(target.join("model.bin"), b"old").unwrap();
        fs::create_dir_all(&staged).unwrap();
        fs::write(staged.join("model.bin"), b"new").unwrap();
        sync_tree(&staged).unwrap();
        publish_dir(&staged, &target, &aside).unwrap();
        assert_eq!(fs::read(target.join("model.bin")).unwrap(), b"new");
        assert!(!target.join("adapter").exists(), "an old file survived");
        assert!(!staged.exists() && !aside.exists());
        // into a place that holds nothing yet
        fs::create_dir_all(&staged).unwrap();
        let fresh = dir.path().join("fresh");
        publish_dir(&staged, &fresh, &aside).unwrap();
        assert!(fresh.is_dir() && !staged.exists());
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
