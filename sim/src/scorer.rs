//! The decision model as the simulation sees it: a [`Scorer`] turns states into calibrated
//! probabilities per candidate. The CLI brings one for an export bundle (through the worker's own
//! `decide`, the harness's code path) and one for a training run or model folder (decision-train).
//! [`Cache`] scores each distinct state once, however many modes or tasks meet it, and keeps the
//! measured time per state so that a cached state still costs its own latency in the report.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use anyhow::{Result, bail};
use decision_data::State;

/// A decision model.
pub trait Scorer {
    /// For each state, its candidates' probabilities in order (summing to 1), or `None` where
    /// the model cannot answer the state (more options than it labels, a prompt longer than it
    /// reads): the LLM decides those.
    fn score(&mut self, states: &[&State]) -> Result<Vec<Option<Vec<f64>>>>;

    /// What is scoring, for reports and receipts (`model` field).
    fn name(&self) -> String;

    /// How many states of one call are scored at once (on parallel threads, each alone): the
    /// cache counts each state's latency as the call's wall time times this over the states.
    fn parallelism(&self) -> usize {
        1
    }
}

/// One state's scores and how long the model took on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub probs: Option<Vec<f64>>,
    /// The model's latency on this state in milliseconds: the wall time of its scoring call
    /// divided by the states it held, times the scorer's parallelism.
    pub ms: f64,
}

/// What the model sees of a state: point, context and candidates (ids and labels). Two states
/// with the same key get the same scores.
fn key(s: &State) -> String {
    let mut k = String::with_capacity(s.context.len() + 16 * s.candidates.len());
    k.push_str(&s.point);
    k.push('\u{1f}');
    k.push_str(&s.context);
    for c in &s.candidates {
        k.push('\u{1f}');
        k.push_str(&c.id);
        k.push('\u{1e}');
        k.push_str(&c.label);
    }
    k
}

/// Scores by state, filled in batches.
pub struct Cache<'a> {
    scorer: &'a mut dyn Scorer,
    map: HashMap<String, Scored>,
    /// States scored by the model, and look-ups answered from the cache.
    pub scored: u64,
    pub hits: u64,
    /// States per scoring call.
    pub batch: usize,
}

impl<'a> Cache<'a> {
    pub fn new(scorer: &'a mut dyn Scorer, batch: usize) -> Self {
        Self {
            scorer,
            map: HashMap::new(),
            scored: 0,
            hits: 0,
            batch: batch.max(1),
        }
    }

    pub fn name(&self) -> String {
        self.scorer.name()
    }

    /// Score every state not yet in the cache (each distinct one once), in batches.
    pub fn fill(&mut self, states: &[&State]) -> Result<()> {
        let mut todo: Vec<&State> = Vec::new();
        let mut keys: Vec<String> = Vec::new();
        let mut queued: HashSet<String> = HashSet::new();
        for s in states {
            let k = key(s);
            if self.map.contains_key(&k) || !queued.insert(k.clone()) {
                continue;
            }
            keys.push(k);
            todo.push(s);
        }
        for (chunk, chunk_keys) in todo.chunks(self.batch).zip(keys.chunks(self.batch)) {
            let t = Instant::now();
            let out = self.scorer.score(chunk)?;
            let at_once = self.scorer.parallelism().clamp(1, chunk.len());
            let ms = t.elapsed().as_secs_f64() * 1000.0 * at_once as f64 / chunk.len() as f64;
            if out.len() != chunk.len() {
                bail!(
                    "{}: {} scores for {} states",
                    self.scorer.name(),
                    out.len(),
                    chunk.len()
                );
            }
            for ((s, k), probs) in chunk.iter().zip(chunk_keys).zip(out) {
                if let Some(p) = &probs {
                    check_probs(s, p, &self.scorer.name())?;
                }
                self.map.insert(k.clone(), Scored { probs, ms });
                self.scored += 1;
            }
        }
        Ok(())
    }

    /// The scores of a state, scoring it first when it is new.
    pub fn get(&mut self, state: &State) -> Result<Scored> {
        let k = key(state);
        if let Some(s) = self.map.get(&k) {
            self.hits += 1;
            return Ok(s.clone());
        }
        self.fill(&[state])?;
        Ok(self.map[&k].clone())
    }
}

fn check_probs(s: &State, p: &[f64], name: &str) -> Result<()> {
    if p.len() != s.candidates.len() {
        bail!(
            "{name}: state {}: {} probabilities for {} candidates",
            s.id,
            p.len(),
            s.candidates.len()
        );
    }
    let sum: f64 = p.iter().sum();
    if p.iter().any(|x| !x.is_finite() || *x < 0.0) || (sum - 1.0).abs() > 1e-3 {
        bail!(
            "{name}: state {}: probabilities {p:?} are not a distribution",
            s.id
        );
    }
    Ok(())
}
