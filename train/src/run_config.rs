//! The run config: one TOML file per training run, with `--set section.key=value` overrides.
//!
//! Every section and key is listed here; an unknown key (in the file or in `--set`) is an error
//! that names it. The resolved config (file + overrides + defaults) is written into the run
//! folder as `run.toml`, and into every checkpoint, so a run can always be reproduced and
//! resumed. See `configs/tiny.toml` for every key with its meaning.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::model::backend::{Backend, Precision};
use crate::model::config::Qwen3Config;
use crate::model::f16_safety::{F16Overflow, LossScaleMode};

/// The whole run config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Run name: the run folder's default name and the `model` field of shadow receipts.
    pub name: String,
    pub model: ModelSection,
    pub data: DataSection,
    #[serde(default)]
    pub loss: LossSection,
    #[serde(default)]
    pub lora: LoraSection,
    #[serde(default)]
    pub optim: OptimSection,
    pub train: TrainSection,
    #[serde(default)]
    pub eval: EvalSection,
}

/// How the run starts from a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    /// Load `source` (weights and tokenizer).
    Pretrained,
    /// Build the architecture in `[model.arch]` with random weights and a word-level tokenizer
    /// made from the training states.
    Random,
}

/// `full`: every weight trains. `lora`: only the adapters train, the base stays frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Full,
    Lora,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    #[serde(default = "default_init")]
    pub init: Init,
    /// Local folder or Hub id (`Qwen/Qwen3-4B`, optionally `@revision`); required for
    /// `init = "pretrained"`. A relative folder is taken from the config file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For `init = "random"`: the Qwen3 `config.json` fields of the model to build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<toml::Table>,
    /// For `init = "random"`: tokens seen fewer times than this in the training states map to
    /// the unknown token.
    #[serde(default = "default_min_count")]
    pub min_token_count: usize,
    /// For `init = "random"`: how one option is rendered, with `{label}` and `{text}` (default
    /// `"{label}. {text}"`). A pretrained model keeps the template in its decision.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_template: Option<String>,
}

impl ModelSection {
    /// `[model.arch]` as a Qwen3 config (the one place that reads the table): its
    /// `vocab_size`, or `vocab` when the table leaves it out (the word-level vocabulary built
    /// from the data). Also the standard deviation of the random weights (`initializer_range`,
    /// default 0.02).
    pub(crate) fn random_arch(&self, vocab: usize) -> Result<(Qwen3Config, f64)> {
        let mut json = serde_json::to_value(self.arch.as_ref().context("[model.arch]")?)?;
        json["model_type"] = "qwen3".into();
        if json.get("vocab_size").is_none() {
            json["vocab_size"] = vocab.into();
        }
        let std = json
            .get("initializer_range")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.02);
        Ok((Qwen3Config::from_json(&json).context("[model.arch]")?, std))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Training states (Parquet file or folder of shards, or JSON Lines). Relative paths are
    /// taken from the current folder.
    pub train: PathBuf,
    /// Validation states; when absent, the `valid` split of `train` is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid: Option<PathBuf>,
    /// Most options a state may offer; the tokenizer must label this many.
    #[serde(default = "default_max_options")]
    pub max_options: usize,
    /// Longest prompt in tokens; longer prompts lose their oldest context.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Skip bad rows (written to `quarantine.jsonl` in the run folder) instead of refusing.
    #[serde(default)]
    pub skip_bad: bool,
    /// Shuffle the candidate order per example per epoch (the answer moves with it).
    #[serde(default = "yes")]
    pub shuffle_options: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossSection {
    /// β: weight of the multi-class Brier term Σ_i (p_i − y_i)² (a sum over classes, in [0, 2]).
    #[serde(default = "default_brier")]
    pub brier_weight: f32,
    /// λ: teacher share of the target when the teacher's arg-max is the answer.
    #[serde(default = "default_blend")]
    pub teacher_blend: f32,
    /// Weight of an auxiliary next-token cross-entropy over the prompt's tokens (0 = off, the
    /// contract's loss). Only for growing a base from scratch: it gives every position a
    /// training signal, so the copy (induction) heads that bind option letters form sooner.
    #[serde(default)]
    pub lm_weight: f32,
}

impl Default for LossSection {
    fn default() -> Self {
        Self {
            brier_weight: default_brier(),
            teacher_blend: default_blend(),
            lm_weight: 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSection {
    pub rank: usize,
    pub alpha: f32,
    pub dropout: f32,
    /// Projections that get adapters: any of q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj.
    pub targets: Vec<String>,
    /// Tokens whose embedding rows train beside the adapters, in f32 (PEFT's
    /// `trainable_token_indices`): each must be one entry of the tokenizer's vocabulary, e.g. a
    /// tool the base model never answered with. Empty: the embedding stays frozen.
    pub trainable_tokens: Vec<String>,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: ["q_proj", "k_proj", "v_proj", "o_proj"]
                .map(String::from)
                .to_vec(),
            trainable_tokens: Vec::new(),
        }
    }
}

/// The projections LoRA may target.
pub(crate) const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimSection {
    /// Peak learning rate.
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices and embeddings only (not norms, biases).
    pub weight_decay: f64,
    pub warmup_steps: u64,
    /// Final learning rate of the cosine decay, as a share of `lr`.
    pub min_lr_ratio: f64,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Clip gradients to this global L2 norm (0 = no clipping).
    pub clip: f64,
}

impl Default for OptimSection {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            warmup_steps: 100,
            min_lr_ratio: 0.0,
            grad_accum: 1,
            clip: 1.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSection {
    pub mode: Mode,
    /// Optimizer steps; 0 = derive from `epochs`.
    #[serde(default)]
    pub max_steps: u64,
    /// Passes over the training states (0 = no limit). With both set, training stops at
    /// whichever comes first.
    #[serde(default = "default_epochs")]
    pub epochs: u64,
    pub batch_size: usize,
    #[serde(default)]
    pub seed: u64,
    /// Evaluate on the validation split every this many steps (0 = only at the end).
    #[serde(default)]
    pub eval_every: u64,
    /// Write a checkpoint every this many steps (0 = only at the end).
    #[serde(default)]
    pub checkpoint_every: u64,
    /// Newest checkpoints to keep.
    #[serde(default = "default_keep")]
    pub keep_checkpoints: usize,
    #[serde(default = "default_backend")]
    pub backend: Backend,
    /// Write a `metrics.jsonl` line every this many steps.
    #[serde(default = "default_log_every")]
    pub log_every: u64,
    /// Split every micro-batch into this many shards whose forward and backward passes run on
    /// separate threads (data parallelism on the CPU, where one pass keeps about one core busy
    /// on small shapes); the gradients are summed with each shard's share of the batch, so the
    /// loss is the same, up to float rounding. A run reproduces for the same value.
    #[serde(default = "default_shards")]
    pub shards: usize,
    /// The frozen base's dtype in LoRA mode: `auto` (bf16 where the device computes it, else
    /// f16, else f32), `f32`, `bf16` or `f16`, loaded straight from the checkpoint's own dtype.
    /// Adapters, their gradients and the optimizer state stay f32; norms, softmax and the loss
    /// compute in f32. Full fine-tuning trains in f32 only (`f32` or `auto`).
    #[serde(default)]
    pub dtype: Precision,
    /// Layer recomputation: keep only each decoder layer's input during the forward pass and
    /// recompute one layer at a time in the backward pass (`crate::recompute`). Same gradients,
    /// activation memory of one layer plus `layers × batch × seq × hidden`, about a third more
    /// compute.
    #[serde(default)]
    pub recompute: bool,
    /// With recompute, at most about this many MiB of tape for the second half of a layer's
    /// replay (everything after the attention core) at a time: the half replays in as few pieces
    /// of tokens as keep within it (`crate::recompute::finish_pieces`). Each piece more runs the
    /// half's kernels again (on a GPU about 60 to 90 launches a piece a layer); each piece fewer
    /// holds more, though a piece within the attention core's three blocks of scores takes
    /// their memory, never alive at the same time. At the 4B's 2 x 2048 tokens the whole half
    /// holds 0.88 GiB: one piece at the default 1024, 2 at 512. Only the launches and the memory
    /// change, and the gradients' rounding.
    #[serde(default = "default_replay_piece_mib")]
    pub replay_piece_mib: usize,
    /// Dynamic loss scaling of the backward pass (`crate::model::f16_safety`): `auto` (on for an f16
    /// base), `dynamic`, `off`.
    #[serde(default)]
    pub loss_scale: LossScaleMode,
    /// An f16 product that overflows: `f32` computes that projection in f32 from then on,
    /// `stop` ends the run naming it.
    #[serde(default)]
    pub f16_overflow: F16Overflow,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSection {
    /// Batch size for scoring.
    pub batch_size: usize,
    /// Points with fewer validation states than this use the global temperature.
    pub min_states_per_point: usize,
    /// Extra candidate orders per state for the flip rate at the end of training (0 = skip).
    pub permutations: usize,
    /// At most this many validation states in the periodic evaluation (0 = all).
    pub max_states: usize,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            batch_size: 64,
            min_states_per_point: 50,
            permutations: 2,
            max_states: 0,
        }
    }
}

fn default_init() -> Init {
    Init::Pretrained
}
fn default_min_count() -> usize {
    1
}
fn default_max_options() -> usize {
    26
}
fn default_max_tokens() -> usize {
    1024
}
fn yes() -> bool {
    true
}
fn default_brier() -> f32 {
    0.5
}
fn default_blend() -> f32 {
    0.3
}
fn default_epochs() -> u64 {
    0
}
fn default_keep() -> usize {
    2
}
fn default_backend() -> Backend {
    Backend::Cpu
}
fn default_log_every() -> u64 {
    10
}
fn default_shards() -> usize {
    1
}
/// The settings a resumed run may change (`decision train --resume`): how a step or an
/// evaluation runs, its memory and launches, not what the run trains or in what order (the
/// batch size orders each epoch's batches by length, and the prompts' length is the data).
pub(crate) const RESUMABLE: &[&str] = &[
    "train.recompute",
    "train.replay_piece_mib",
    "eval.batch_size",
];

fn default_replay_piece_mib() -> usize {
    crate::recompute::FINISH_BUDGET >> 20
}

impl TrainSection {
    /// `replay_piece_mib` in bytes, as the replay and the memory plan both read it (a value past
    /// what a `usize` of bytes holds means the whole half in one piece, as any budget above it).
    pub(crate) fn replay_piece_bytes(&self) -> usize {
        self.replay_piece_mib.saturating_mul(1 << 20)
    }
}

impl RunConfig {
    /// Read `path`, apply the `--set` overrides, check, and resolve relative model folders
    /// against the config file's folder.
    pub fn load(path: &Path, sets: &[String]) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut cfg = Self::parse(&text, sets)
            .with_context(|| format!("in run config {}", path.display()))?;
        if let Some(src) = &cfg.model.source {
            let base = path.parent().unwrap_or(Path::new("."));
            let candidate = base.join(src);
            if !Path::new(src).is_absolute() && !Path::new(src).exists() && candidate.exists() {
                cfg.model.source = Some(candidate.to_string_lossy().into_owned());
            }
        }
        Ok(cfg)
    }

    /// Parse config text and apply overrides (`section.key=value`; the value is read as a TOML
    /// value, and as a plain string when it is not one).
    pub fn parse(text: &str, sets: &[String]) -> Result<Self> {
        let mut table: toml::Table = toml::from_str(text).context("not valid TOML")?;
        // Check the file alone first so its own mistakes are reported as such.
        let _: RunConfig = table
            .clone()
            .try_into()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for s in sets {
            apply_set(&mut table, s)?;
        }
        let cfg: RunConfig = table
            .try_into()
            .map_err(|e| anyhow::anyhow!("after --set overrides: {e}"))?;
        cfg.check()?;
        Ok(cfg)
    }

    /// The resolved config as TOML text (what `run.toml` holds).
    pub(crate) fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("run config serialises")
    }

    /// The settings (`section.key`) whose values differ from `other`'s, with this config's value
    /// and `other`'s, as TOML writes them.
    pub(crate) fn differences(&self, other: &RunConfig) -> Vec<(String, String, String)> {
        fn walk(
            at: &str,
            a: Option<&toml::Value>,
            b: Option<&toml::Value>,
            out: &mut Vec<(String, String, String)>,
        ) {
            if let (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) = (a, b) {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    walk(&path, a.get(k), b.get(k), out);
                }
            } else if a != b {
                let show =
                    |v: Option<&toml::Value>| v.map_or_else(|| "(unset)".into(), |v| v.to_string());
                out.push((at.to_string(), show(a), show(b)));
            }
        }
        let value = |c: &RunConfig| toml::Value::try_from(c).expect("run config serialises");
        let mut out = Vec::new();
        walk("", Some(&value(self)), Some(&value(other)), &mut out);
        out
    }

    fn check(&self) -> Result<()> {
        match self.model.init {
            Init::Pretrained if self.model.source.is_none() => {
                bail!("[model] init = \"pretrained\" needs `source` (a folder or a Hub id)")
            }
            Init::Random if self.model.arch.is_none() => {
                bail!("[model] init = \"random\" needs a [model.arch] table")
            }
            _ => {}
        }
        if self.train.batch_size == 0 {
            bail!("[train] batch_size must be at least 1");
        }
        if self.optim.grad_accum == 0 {
            bail!("[optim] grad_accum must be at least 1");
        }
        if self.train.max_steps == 0 && self.train.epochs == 0 {
            bail!("[train] set max_steps or epochs");
        }
        if !(self.loss.lm_weight >= 0.0 && self.loss.lm_weight.is_finite()) {
            bail!("[loss] lm_weight must be a finite number >= 0");
        }
        if !(0.0..=1.0).contains(&self.loss.teacher_blend) {
            bail!("[loss] teacher_blend must be in [0, 1]");
        }
        if self.loss.brier_weight < 0.0 {
            bail!("[loss] brier_weight must not be negative");
        }
        if self.data.max_options < 2 {
            bail!("[data] max_options must be at least 2");
        }
        if self.train.replay_piece_mib == 0 {
            bail!("[train] replay_piece_mib must be at least 1");
        }
        if self.train.shards == 0 || self.train.shards > self.train.batch_size {
            bail!(
                "[train] shards must be between 1 and batch_size ({})",
                self.train.batch_size
            );
        }
        if self.train.shards > 1 && self.train.mode == Mode::Lora && self.lora.dropout > 0.0 {
            bail!(
                "[train] shards > 1 needs [lora] dropout = 0: Burn draws dropout masks from one \
                 process-wide generator, so shards on parallel threads would make the run \
                 irreproducible"
            );
        }
        if !matches!(self.train.dtype, Precision::F32 | Precision::Auto)
            && self.train.mode != Mode::Lora
        {
            bail!(
                "[train] dtype = \"{}\" needs mode = \"lora\": full fine-tuning trains in f32 \
                 only (f32 master weights and optimizer state)",
                self.train.dtype
            );
        }
        if self.train.recompute && self.train.mode == Mode::Lora && self.lora.dropout > 0.0 {
            bail!(
                "[train] recompute = true needs [lora] dropout = 0: the recomputed pass would \
                 draw other dropout masks than the forward pass it replays"
            );
        }
        if self.train.mode == Mode::Full && !self.lora.trainable_tokens.is_empty() {
            bail!(
                "[lora] trainable_tokens applies to mode = \"lora\"; full fine-tuning trains \
                 the whole embedding already"
            );
        }
        if self.train.mode == Mode::Lora {
            if self.lora.rank == 0 {
                bail!("[lora] rank must be at least 1");
            }
            if self.lora.targets.is_empty() {
                bail!("[lora] targets is empty");
            }
            for t in &self.lora.targets {
                if !LORA_TARGETS.contains(&t.as_str()) {
                    bail!(
                        "[lora] unknown target `{t}`; expected some of {}",
                        LORA_TARGETS.join(", ")
                    );
                }
            }
            if !(0.0..1.0).contains(&self.lora.dropout) {
                bail!("[lora] dropout must be in [0, 1)");
            }
            let tokens = &self.lora.trainable_tokens;
            for (i, t) in tokens.iter().enumerate() {
                if let Some(first) = tokens[..i].iter().position(|x| x == t) {
                    bail!(
                        "[lora] trainable_tokens lists {t:?} twice (entries {} and {})",
                        first + 1,
                        i + 1
                    );
                }
            }
            if self.model.init == Init::Random {
                bail!(
                    "[train] mode = \"lora\" needs a pretrained base ([model] init = \"pretrained\")"
                );
            }
        }
        Ok(())
    }
}

/// Apply one `section.key=value` (or `key=value` for a top-level key) to the table.
fn apply_set(table: &mut toml::Table, set: &str) -> Result<()> {
    let (key, raw) = set
        .split_once('=')
        .with_context(|| format!("--set {set}: expected section.key=value"))?;
    let key = key.trim();
    let value = parse_value(raw.trim());
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("--set {set}: empty key part");
    }
    let mut t = table;
    for p in &parts[..parts.len() - 1] {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .with_context(|| format!("--set {set}: `{p}` is not a section"))?;
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
    // Unknown keys are caught by deserialisation; make the error name the override.
    let probe: Result<RunConfig, _> = toml::Value::Table(root_of(set, key, raw)?).try_into();
    if let Err(e) = probe {
        let msg = e.to_string();
        if msg.contains("unknown field") {
            bail!("--set {set}: unknown key `{key}` ({})", msg.trim());
        }
    }
    Ok(())
}

/// A minimal table holding only the override, to tell unknown keys from missing ones.
fn root_of(set: &str, key: &str, raw: &str) -> Result<toml::Table> {
    let _ = set;
    let mut root = toml::Table::new();
    let parts: Vec<&str> = key.split('.').collect();
    let mut t = &mut root;
    for p in &parts[..parts.len() - 1] {
        t = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("fresh table");
    }
    t.insert(parts[parts.len() - 1].to_string(), parse_value(raw.trim()));
    Ok(root)
}

fn parse_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
name = "t"
[model]
init = "random"
[model.arch]
hidden_size = 32
[data]
train = "states.jsonl"
[train]
mode = "full"
batch_size = 4
max_steps = 10
"#;

    #[test]
    fn defaults_and_overrides() {
        let c = RunConfig::parse(MIN, &[]).unwrap();
        assert_eq!(c.optim.eps, 1e-8);
        assert_eq!(c.train.max_steps, 10);
        let c = RunConfig::parse(
            MIN,
            &[
                "train.max_steps=20".into(),
                "optim.lr=3e-4".into(),
                "name=other".into(),
                "data.valid=v.jsonl".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.train.max_steps, 20);
        assert_eq!(c.optim.lr, 3e-4);
        assert_eq!(c.name, "other");
        assert_eq!(c.data.valid.as_deref(), Some(Path::new("v.jsonl")));
        // a resolved config parses back to itself
        assert_eq!(RunConfig::parse(&c.to_toml(), &[]).unwrap(), c);
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = RunConfig::parse(MIN, &["train.batchsize=3".into()]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("train.batchsize"), "{msg}");
        let bad = MIN.replace("batch_size = 4", "batch_size = 4\nbatchsize = 4");
        let e = RunConfig::parse(&bad, &[]).unwrap_err();
        assert!(format!("{e:#}").contains("batchsize"), "{e:#}");
        let e = RunConfig::parse(MIN, &["nosuch.key=1".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("nosuch.key"), "{e:#}");
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(RunConfig::parse(MIN, &["train.mode=lora".into()]).is_err()); // lora needs a base
        assert!(RunConfig::parse(MIN, &["loss.teacher_blend=1.5".into()]).is_err());
        assert!(RunConfig::parse(MIN, &["train.batch_size=zero".into()]).is_err());
        let lora = MIN
            .replace("init = \"random\"", "init = \"pretrained\"\nsource = \"m\"")
            .replace("mode = \"full\"", "mode = \"lora\"");
        assert!(RunConfig::parse(&lora, &[]).is_ok());
        assert!(RunConfig::parse(&lora, &["lora.targets=[\"qkv\"]".into()]).is_err());
        let twice = RunConfig::parse(&lora, &["lora.trainable_tokens=[\"a\",\"b\",\"a\"]".into()]);
        let msg = format!("{:#}", twice.unwrap_err());
        assert!(msg.contains("\"a\" twice (entries 1 and 3)"), "{msg}");
        let full = RunConfig::parse(MIN, &["lora.trainable_tokens=[\"a\"]".into()]);
        assert!(format!("{:#}", full.unwrap_err()).contains("applies to mode = \"lora\""));
    }
}
