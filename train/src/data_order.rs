//! The states a run reads ([`load_states`], [`load_run_states`]) and the order training presents
//! them in ([`Stream`]).
//!
//! The order is a pure function of the seed and the position: the epoch order is a shuffle seeded
//! by (seed, epoch), bucketed by prompt length; the candidate order of example `i` in epoch `e` is
//! seeded by (seed, e, i). So a checkpoint's (epoch, position) is all a resumed run needs to see
//! the same examples in the same order.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Result, bail};
use decision_data::{Split, SplitRatios, State};
use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::run_config::RunConfig;

/// Derive a seed for a sub-stream: (seed, a, b) → u64 (SplitMix64 of a simple mix).
pub(crate) fn mix_seed(seed: u64, a: u64, b: u64) -> u64 {
    let mut z =
        seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The order of the training examples in epoch `epoch`.
fn epoch_order(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(seed, 1 + epoch, 0));
    order.shuffle(&mut rng);
    order
}

/// Examples per length bucket, in batches: a shuffled epoch is cut into pools of this many
/// batches, each pool is sorted by length and cut into batches, and the batches of a pool are
/// shuffled. Batches then hold prompts of similar length (little padding) while the order stays
/// random and a pure function of (seed, epoch).
const BUCKET_BATCHES: usize = 16;

/// The epoch order with length bucketing (see [`BUCKET_BATCHES`]); `lengths[i]` is example
/// `i`'s approximate prompt length.
fn bucketed_order(seed: u64, epoch: u64, lengths: &[usize], batch: usize) -> Vec<usize> {
    let order = epoch_order(seed, epoch, lengths.len());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(seed, 1 + epoch, 1));
    let mut out = Vec::with_capacity(order.len());
    for pool in order.chunks(batch.max(1) * BUCKET_BATCHES) {
        let mut pool = pool.to_vec();
        pool.sort_by_key(|&i| (lengths[i], i));
        let mut batches: Vec<&[usize]> = pool.chunks(batch.max(1)).collect();
        batches.shuffle(&mut rng);
        for b in batches {
            out.extend_from_slice(b);
        }
    }
    out
}

/// A cheap stand-in for a state's prompt length: words of its context and candidate labels.
fn approx_length(s: &State) -> usize {
    s.context.split_whitespace().count()
        + s.candidates
            .iter()
            .map(|c| 2 + c.label.split_whitespace().count())
            .sum::<usize>()
}

/// The candidate order of example `index` in epoch `epoch` (identity when not shuffling).
fn candidate_order(seed: u64, epoch: u64, index: usize, k: usize, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..k).collect();
    if shuffle {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(
            seed,
            0x5eed_0000 + epoch,
            index as u64 + 1,
        ));
        order.shuffle(&mut rng);
    }
    order
}

/// `state` with its candidates (and teacher) presented in `order` (`order[i]` = original index
/// of the candidate shown at position `i`); the answer id moves with its candidate.
pub(crate) fn permuted(state: &State, order: &[usize]) -> State {
    let mut s = state.clone();
    s.candidates = order.iter().map(|&i| state.candidates[i].clone()).collect();
    s.teacher = state
        .teacher
        .as_ref()
        .map(|t| order.iter().map(|&i| t[i]).collect());
    s
}

/// The training data stream: epoch orders and candidate orders from the seed.
pub struct Stream<'a> {
    states: &'a [State],
    lengths: Vec<usize>,
    batch: usize,
    seed: u64,
    shuffle: bool,
    epoch: u64,
    position: usize,
    order: Vec<usize>,
}

impl<'a> Stream<'a> {
    /// The stream of `states` in batches of `batch`, standing at example `position` of epoch
    /// `epoch`; `shuffle` shuffles each example's candidates.
    pub fn new(
        states: &'a [State],
        batch: usize,
        seed: u64,
        shuffle: bool,
        epoch: u64,
        position: usize,
    ) -> Self {
        let lengths: Vec<usize> = states.iter().map(approx_length).collect();
        let order = bucketed_order(seed, epoch, &lengths, batch);
        Self {
            states,
            lengths,
            batch,
            seed,
            shuffle,
            epoch,
            position,
            order,
        }
    }

    /// The next example, its candidates in this epoch's order for it.
    pub fn next_state(&mut self) -> State {
        if self.position >= self.order.len() {
            self.epoch += 1;
            self.position = 0;
            self.order = bucketed_order(self.seed, self.epoch, &self.lengths, self.batch);
        }
        let i = self.order[self.position];
        self.position += 1;
        let s = &self.states[i];
        permuted(
            s,
            &candidate_order(self.seed, self.epoch, i, s.candidates.len(), self.shuffle),
        )
    }

    /// The states it draws from, in their original order.
    pub fn states(&self) -> &'a [State] {
        self.states
    }

    /// Where the stream stands: the epoch and how many of its examples were taken.
    pub fn position(&self) -> (u64, usize) {
        (self.epoch, self.position)
    }
}

/// Read states (one file, a folder of shards, JSON Lines or Parquet), checked against the
/// contract. Bad rows fail the run, or with `quarantine` are written there and skipped.
pub(crate) fn load_states(
    path: &Path,
    max_options: usize,
    quarantine: Option<&Path>,
) -> Result<Vec<State>> {
    let opts = decision_data::ValidateOptions {
        max_options,
        ..Default::default()
    };
    let paths = [path.to_path_buf()];
    let Some(qpath) = quarantine else {
        return decision_data::read_states(&paths, opts);
    };
    let mut q = decision_data::Quarantine::create(qpath)?;
    let mut states = Vec::new();
    for item in decision_data::StateReader::open(&paths)?.validated(opts) {
        match item? {
            Ok(row) => states.push(row.value),
            Err(bad) => q.add(&bad)?,
        }
    }
    let n = q.finish()?;
    if n > 0 {
        eprintln!(
            "skipped {n} bad row(s) of {}; they are in {}",
            path.display(),
            qpath.display()
        );
    }
    Ok(states)
}

/// A run refused for bad rows says how to train on the good ones.
fn skip_bad_hint(e: anyhow::Error) -> anyhow::Error {
    if e.downcast_ref::<decision_data::BadRows>().is_some() {
        anyhow::anyhow!(
            "{e:#}\nto train on the good rows, set [data] skip_bad = true (or --set \
             data.skip_bad=true): the bad ones then go, unchanged, to quarantine.jsonl in the run \
             folder"
        )
    } else {
        e
    }
}

/// Training and validation states of a run.
///
/// Each row of `[data] train` has the split the contract gives it: its own `split`, or by
/// hashing its task id when absent. `train` rows train and `test` rows are never used. `valid`
/// rows validate, unless a separate `[data] valid` file is given: then that file's rows validate
/// (all but those marked `test`), the train file's rows marked `valid` validate beside them, and
/// its rows that only hash to `valid` train (the separate file takes the hashed share's place).
/// The two files may share no id and no task: a split never cuts a task in two. With
/// `[data] skip_bad`, bad rows go to `quarantine.jsonl` (and `quarantine.valid.jsonl`) in
/// `run_dir`.
pub fn load_run_states(cfg: &RunConfig, run_dir: &Path) -> Result<(Vec<State>, Vec<State>)> {
    let quarantine = cfg.data.skip_bad.then(|| run_dir.join("quarantine.jsonl"));
    let all = load_states(&cfg.data.train, cfg.data.max_options, quarantine.as_deref())
        .map_err(skip_bad_hint)?;
    let ratios = SplitRatios::default();
    let separate_valid = cfg.data.valid.is_some();
    let (mut train, mut valid) = (Vec::new(), Vec::new());
    // with a separate valid file: the train file's ids and tasks, which that file may not repeat
    let (mut ids_in_train_file, mut tasks_in_train_file) = (HashSet::new(), HashSet::new());
    for s in all {
        if separate_valid {
            ids_in_train_file.insert(s.id.clone());
            tasks_in_train_file.insert(s.task_id.clone());
        }
        let explicit = s.split.as_deref().and_then(Split::parse);
        match ratios.split_of(&s) {
            Split::Train => train.push(s),
            Split::Valid if separate_valid && explicit.is_none() => train.push(s),
            Split::Valid => valid.push(s),
            Split::Test => {}
        }
    }
    if let Some(v) = &cfg.data.valid {
        let q = cfg
            .data
            .skip_bad
            .then(|| run_dir.join("quarantine.valid.jsonl"));
        for s in load_states(v, cfg.data.max_options, q.as_deref()).map_err(skip_bad_hint)? {
            let (file, train_file) = (v.display(), cfg.data.train.display());
            if ids_in_train_file.contains(&s.id) {
                bail!(
                    "{file}: state {:?} is also in [data] train ({train_file}); an id is unique \
                     in the dataset",
                    s.id
                );
            }
            if tasks_in_train_file.contains(&s.task_id) {
                bail!(
                    "{file}: task {:?} (state {:?}) also has states in [data] train \
                     ({train_file}); a split never cuts a task in two, so keep each task's states \
                     in one of the files",
                    s.task_id,
                    s.id
                );
            }
            if s.split.as_deref().and_then(Split::parse) != Some(Split::Test) {
                valid.push(s);
            }
        }
    }
    // unlabelled states have nothing to learn or measure against: counted, then left out
    for (states, what, unused) in [
        (&mut train, "training", "trained on"),
        (&mut valid, "validation", "used"),
    ] {
        let before = states.len();
        states.retain(|s| s.answer.is_some());
        let unlabeled = before - states.len();
        if unlabeled > 0 {
            eprintln!("{unlabeled} unlabeled {what} state(s) have no answer and are not {unused}");
        }
    }
    if train.is_empty() {
        bail!("{}: no labelled training states", cfg.data.train.display());
    }
    if valid.is_empty() {
        bail!(
            "no labelled validation states (give [data] valid, or states whose split is `valid`)"
        );
    }
    Ok((train, valid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(id: &str, task: &str, split: Option<&str>) -> State {
        State {
            id: id.into(),
            task_id: task.into(),
            point: "tool".into(),
            context: format!("context of {id}"),
            candidates: ["a", "b"]
                .iter()
                .map(|c| decision_data::Candidate {
                    id: (*c).into(),
                    label: (*c).into(),
                })
                .collect(),
            answer: Some("a".into()),
            teacher: None,
            after_error: false,
            rules: None,
            split: split.map(String::from),
        }
    }

    #[test]
    fn a_separate_valid_file_keeps_test_rows_out_and_shares_no_state_or_task() {
        let dir = tempfile::tempdir().unwrap();
        let (train_file, valid_file) = (dir.path().join("train.jsonl"), dir.path().join("v.jsonl"));
        let mut rows: Vec<State> = (0..60)
            .map(|t| labelled(&format!("s{t}"), &format!("t{t}"), None))
            .collect();
        rows.push(labelled("marked", "m", Some("valid")));
        decision_data::write_states(&train_file, &rows).unwrap();
        let write_valid = |rows: &[State]| decision_data::write_states(&valid_file, rows).unwrap();
        write_valid(&[
            labelled("v1", "vt1", None),
            labelled("v2", "vt2", Some("test")),
        ]);
        let cfg = RunConfig::parse(
            "name = \"t\"\n[model]\ninit = \"random\"\n[model.arch]\nhidden_size = 32\n\
             [data]\ntrain = \"x\"\n[train]\nmode = \"full\"\nbatch_size = 4\nmax_steps = 1\n",
            &[
                format!("data.train={}", train_file.display()),
                format!("data.valid={}", valid_file.display()),
            ],
        )
        .unwrap();
        let ratios = SplitRatios::default();
        let hashed = |task: &str| ratios.split_of_task(task);
        let count = |want: Split| (0..60).filter(|t| hashed(&format!("t{t}")) == want).count();
        assert!(
            count(Split::Test) > 0 && count(Split::Valid) > 0,
            "the fixture needs both"
        );

        let (train, valid) = load_run_states(&cfg, dir.path()).unwrap();
        // test rows never train; rows that only hash to valid do, the valid file taking their place
        assert!(train.iter().all(|s| hashed(&s.task_id) != Split::Test));
        assert_eq!(train.len(), 60 - count(Split::Test));
        let mut ids: Vec<&str> = valid.iter().map(|s| s.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, ["marked", "v1"]);

        // an id or a task in both files stops the run
        write_valid(&[labelled("s3", "vt3", None)]);
        let e = format!("{:#}", load_run_states(&cfg, dir.path()).unwrap_err());
        assert!(e.contains("state \"s3\" is also in [data] train"), "{e}");
        write_valid(&[labelled("v4", "t4", None)]);
        let e = format!("{:#}", load_run_states(&cfg, dir.path()).unwrap_err());
        assert!(
            e.contains("task \"t4\" (state \"v4\") also has states in [data] train"),
            "{e}"
        );
    }

    #[test]
    fn orders_are_seeded_permutations() {
        let a = epoch_order(7, 0, 50);
        assert_eq!(a, epoch_order(7, 0, 50));
        assert_ne!(a, epoch_order(7, 1, 50));
        assert_ne!(a, epoch_order(8, 0, 50));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_eq!(candidate_order(1, 0, 3, 4, false), vec![0, 1, 2, 3]);
        let shuffled: Vec<Vec<usize>> =
            (0..20).map(|i| candidate_order(1, 0, i, 4, true)).collect();
        assert!(shuffled.iter().any(|o| o != &vec![0, 1, 2, 3]));
    }

    #[test]
    fn bucketing_keeps_a_permutation_and_groups_lengths() {
        let lengths: Vec<usize> = (0..200).map(|i| (i * 37) % 101).collect();
        let o = bucketed_order(3, 0, &lengths, 8);
        let mut sorted = o.clone();
        sorted.sort();
        assert_eq!(sorted, (0..200).collect::<Vec<_>>());
        assert_eq!(o, bucketed_order(3, 0, &lengths, 8));
        let spread = |order: &[usize]| -> usize {
            order
                .chunks(8)
                .map(|b| {
                    let l: Vec<usize> = b.iter().map(|&i| lengths[i]).collect();
                    l.iter().max().unwrap() - l.iter().min().unwrap()
                })
                .sum()
        };
        assert!(
            spread(&o) * 3 < spread(&epoch_order(3, 0, 200)),
            "bucketing does not group lengths"
        );
    }

    #[test]
    fn the_answer_moves_with_its_candidate() {
        let s = State {
            id: "s".into(),
            task_id: "t".into(),
            point: "tool".into(),
            context: "c".into(),
            candidates: ["a", "b", "c"]
                .iter()
                .map(|x| decision_data::Candidate {
                    id: x.to_string(),
                    label: format!("label {x}"),
                })
                .collect(),
            answer: Some("b".into()),
            teacher: Some(vec![0.2, 0.7, 0.1]),
            after_error: false,
            rules: None,
            split: None,
        };
        let p = permuted(&s, &[2, 0, 1]);
        assert_eq!(
            p.candidates
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>(),
            ["c", "a", "b"]
        );
        assert_eq!(p.answer_index(), Some(2));
        assert_eq!(p.teacher, Some(vec![0.1, 0.2, 0.7]));
    }
}
