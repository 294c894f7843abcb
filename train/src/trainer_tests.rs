//! Tests of the trainer as a whole, on tiny models and states made here: gradients against
//! finite differences, LoRA (merge equivalence, frozen base, PEFT files), resume, run folder.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use decision_data::State;
use decision_data::r#gen::{GenOptions, RulesVersion, generate};

use crate::loss::{LossTargets, LossWeights, MicroBatch, batch_loss, training_loss};
use crate::model::config::Qwen3Config;
use crate::model::decision_model::DecisionModel;
use crate::model::lora::{self, LoraSpec};
use crate::model::qwen3::{Batch, Qwen3, init_random};
use crate::optim::{AdamW, AdamWSettings, Gradients};
use crate::run_config::RunConfig;
use crate::trainer::{TrainOptions, train};

/// A two-layer Qwen3 of width 16 (4 query heads, 2 key/value heads of 8) with `vocab` tokens.
pub(crate) fn tiny_config(vocab: usize) -> Qwen3Config {
    Qwen3Config::from_json(&serde_json::json!({
        "model_type": "qwen3", "vocab_size": vocab, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false,
        "max_position_embeddings": 64
    }))
    .unwrap()
}

/// Burn's CPU backend draws random numbers (weight init, LoRA's A, dropout) from one
/// process-wide generator that `train` seeds; tests run on parallel threads, so each test here
/// that draws holds this lock, or another test's draws would interleave with its seeded
/// sequence (seen as a resume test whose two runs differed from step 1 under load).
static DEVICE_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn device_rng() -> std::sync::MutexGuard<'static, ()> {
    DEVICE_RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn batch() -> Batch {
    let a: &[u32] = &[3, 7, 1, 9, 4, 2];
    let b: &[u32] = &[5, 8, 6];
    Batch::left_padded(&[a, b], 0)
}

const LABELS: [u32; 3] = [10, 11, 12];

fn loss_of(model: &Qwen3) -> Tensor<1> {
    let logits = model.answer_logits(&batch(), &LABELS);
    let t = LossTargets::build(&[(3, 1, Some(vec![0.2, 0.7, 0.1])), (2, 0, None)], 0.3);
    let (absent, q, onehot) = t.tensors(&logits.device());
    batch_loss(logits, absent, q, onehot, 0.5)
}

/// Adds `delta` to element `index` of the parameter at `path`.
struct Nudge {
    target: String,
    index: usize,
    delta: f32,
    path: Vec<String>,
}

impl ModuleMapper for Nudge {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.path.join(".") != self.target {
            return param;
        }
        let (id, t, mapper) = param.consume();
        let shape = t.shape();
        let mut v = t.into_data().try_to_vec::<f32>().unwrap();
        v[self.index] += self.delta;
        let t = Tensor::<D>::from_data(TensorData::new(v, shape), &Device::flex());
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Every gradient in `grads` as (parameter path, values), in module order.
pub(crate) fn gradients(model: &Qwen3, grads: &GradientsParams) -> Vec<(String, Vec<f32>)> {
    struct Collect<'a> {
        grads: &'a GradientsParams,
        path: Vec<String>,
        out: Vec<(String, Vec<f32>)>,
    }
    impl burn::module::ModuleVisitor for Collect<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(p.id) {
                let v = g.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
                self.out.push((self.path.join("."), v));
            }
        }
    }
    let mut c = Collect {
        grads,
        path: Vec::new(),
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

/// The gradient of the parameter at `path`.
fn grad_of(model: &Qwen3, grads: &GradientsParams, path: &str) -> Vec<f32> {
    gradients(model, grads)
        .into_iter()
        .find(|(p, _)| p == path)
        .map(|(_, g)| g)
        .unwrap_or_else(|| panic!("no gradient for {path}"))
}

/// The model's gradients (autodiff through attention, RoPE, RMSNorm, SwiGLU, the label-token
/// head and the loss) agree with central finite differences. f32 throughout; step 1e-2 on
/// weights drawn with std 0.3; per element |Δ| ≤ 2e-3 + 5% of the gradient.
#[test]
fn gradients_match_finite_differences() {
    let _rng = device_rng();
    let plain = Device::flex();
    plain.seed(3);
    let model = init_random(&tiny_config(16), 0.3, &plain);
    let trained = model.clone().train().set_require_grad(true);
    let loss = loss_of(&trained);
    let grads = GradientsParams::from_grads(loss.backward(), &trained);
    let base: f32 = loss_of(&model).into_scalar();
    assert!(base.is_finite());
    let eps = 1e-2f32;
    let mut checked = 0;
    for path in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
    ] {
        let g = grad_of(&trained, &grads, path);
        // the largest few entries of each tensor
        let mut idx: Vec<usize> = (0..g.len()).collect();
        idx.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
        for &i in idx.iter().take(4) {
            let at = |d: f32| -> f32 {
                let m = model.clone().map(&mut Nudge {
                    target: path.into(),
                    index: i,
                    delta: d,
                    path: vec![],
                });
                loss_of(&m).into_scalar()
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (fd - g[i]).abs() <= 2e-3 + 0.05 * g[i].abs(),
                "{path}[{i}]: autodiff {} vs finite difference {fd}",
                g[i]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 32);
}

fn spec(targets: &[&str]) -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: targets.iter().map(|s| s.to_string()).collect(),
        tokens: Vec::new(),
    }
}

/// Merging (W + s·A·B) gives the same outputs as the unmerged adapters, with B non-zero.
#[test]
fn lora_merge_equals_unmerged() {
    let _rng = device_rng();
    let plain = Device::flex();
    plain.seed(5);
    let base = init_random(&tiny_config(16), 0.3, &plain);
    let mut with = lora::attach(base.clone(), &spec(&crate::run_config::LORA_TARGETS), 9);
    // step 0 equals the base (B = 0)
    let l0 = base
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let l1 = with
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(l0, l1);
    // give every B random values
    for layer in 0..with.model.layers.len() {
        for (_, p) in lora::projections_mut(&mut with, layer) {
            let ad = p.lora.as_mut().unwrap();
            let dims = ad.lora_b.shape().dims::<2>();
            ad.lora_b = Param::from_tensor(Tensor::<2>::random(
                dims,
                burn::tensor::Distribution::Normal(0.0, 0.2),
                &plain,
            ));
        }
    }
    let unmerged = with
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let merged = lora::merge(with)
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let diff = max_abs_diff(&unmerged, &merged);
    assert!(diff < 1e-4, "max |Δ| = {diff}");
    assert_eq!(unmerged.len(), l0.len());
    assert!(
        unmerged.iter().zip(&l0).any(|(a, b)| (a - b).abs() > 1e-3),
        "adapters changed nothing"
    );
}

fn weights_of(model: &Qwen3) -> Vec<(String, Vec<f32>)> {
    crate::model::weights::hf_tensors(model)
        .map(|t| (t.name, t.data))
        .collect()
}

/// LoRA training: only adapter parameters get gradients and optimizer state; the base weights
/// stay bit-identical through several AdamW steps (with weight decay).
#[test]
fn lora_base_is_frozen_bit_for_bit() {
    let _rng = device_rng();
    let plain = Device::flex();
    plain.seed(11);
    let base = init_random(&tiny_config(16), 0.3, &plain);
    let before = weights_of(&base);
    let mut model = lora::attach(base, &spec(&["q_proj", "v_proj", "down_proj"]), 1).train();
    let mut opt = AdamW::new(AdamWSettings {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    });
    let adapters = 2 * 3 * 2; // A and B, three targets, two layers
    for _ in 0..3 {
        let mut grads = GradientsParams::from_grads(loss_of(&model).backward(), &model);
        assert_eq!(
            grads.len(),
            adapters,
            "gradients reached non-adapter parameters"
        );
        let grads = Gradients::take(&model, &mut grads);
        model = opt.update(model, grads, 1e-2, 1.0);
    }
    assert_eq!(opt.paths().len(), adapters);
    assert!(
        opt.paths().iter().all(|k| k.contains(".lora.")),
        "{:?}",
        opt.paths()
    );
    let after_model = model.valid();
    // adapters moved
    let b = after_model.model.layers[0]
        .self_attn
        .q_proj
        .lora
        .as_ref()
        .unwrap()
        .lora_b
        .val();
    assert!(b.abs().max().into_scalar::<f32>() > 0.0);
    // hf_tensors reads base weights only (adapters are not HF tensors)
    assert_eq!(before, weights_of(&after_model), "a base weight changed");
}

/// PEFT files round-trip: saved adapters load back onto the base and give the same outputs;
/// a wrong key is refused.
#[test]
fn peft_adapter_round_trip() {
    let _rng = device_rng();
    let plain = Device::flex();
    plain.seed(2);
    let base = init_random(&tiny_config(16), 0.3, &plain);
    // Every adapter's A and B non-zero (attach starts B at zero), so an adapter loaded onto the
    // wrong module, transposed or dropped changes the outputs below.
    struct Randomize(Vec<String>);
    impl ModuleMapper for Randomize {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            if !self.0.iter().any(|p| p == "lora") {
                return param;
            }
            let (id, t, mapper) = param.consume();
            let t = Tensor::<D>::random(
                t.shape(),
                burn::tensor::Distribution::Normal(0.0, 0.5),
                &t.device(),
            );
            Param::from_mapped_value(id, t, mapper)
        }
    }
    let with = lora::attach(base.clone(), &spec(&["q_proj", "up_proj"]), 4)
        .map(&mut Randomize(Vec::new()));
    for layer in &with.model.layers {
        for ad in [&layer.self_attn.q_proj.lora, &layer.mlp.up_proj.lora] {
            let ad = ad.as_ref().unwrap();
            for m in [ad.lora_a.val(), ad.lora_b.val()] {
                assert!(m.abs().min().into_scalar::<f32>() > 0.0);
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    lora::save_peft(
        &with,
        &spec(&["q_proj", "up_proj"]),
        "base-model",
        dir.path(),
    )
    .unwrap();
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["base_model_name_or_path"], "base-model");
    let bytes = std::fs::read(dir.path().join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let a = st
        .tensor("base_model.model.model.layers.1.mlp.up_proj.lora_A.weight")
        .unwrap();
    assert_eq!(a.shape(), [4, 16]);
    let b = st
        .tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
        .unwrap();
    assert_eq!(b.shape(), [32, 4]);
    assert_eq!(st.names().len(), 8);
    let (loaded, s, base_ref) = lora::load_peft(base.clone(), dir.path()).unwrap();
    assert_eq!(s.rank, 4);
    assert_eq!(base_ref, "base-model");
    let x = with
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let y = loaded
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(x, y);
    // Each adapter shows in the outputs: without the q_proj adapters they differ.
    let mut no_q = loaded.clone();
    for layer in &mut no_q.model.layers {
        layer.self_attn.q_proj.lora = None;
    }
    let z = no_q
        .answer_logits(&batch(), &LABELS)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(x.len(), z.len());
    assert!(
        x.iter().zip(&z).any(|(a, b)| (a - b).abs() > 1e-4),
        "{x:?} vs {z:?}"
    );
    // an adapter for a module the config does not list is an error
    let mut cfg2 = cfg.clone();
    cfg2["target_modules"] = serde_json::json!(["q_proj"]);
    std::fs::write(dir.path().join("adapter_config.json"), cfg2.to_string()).unwrap();
    let e = lora::load_peft(base, dir.path()).unwrap_err().to_string();
    assert!(e.contains("unexpected key"), "{e}");
}

// ---- whole runs -------------------------------------------------------------------------

fn states_file(dir: &Path, rules: RulesVersion, tasks: usize) -> PathBuf {
    let states: Vec<State> = generate(&GenOptions {
        rules,
        tasks,
        seed: 5,
        ..GenOptions::default()
    })
    .unwrap();
    let p = dir.join(format!("states-{}.jsonl", rules.as_str()));
    decision_data::write_states(&p, &states).unwrap();
    p
}

fn tiny_run_config(train: &Path, extra: &str) -> RunConfig {
    let text = format!(
        r#"
name = "t"
[model]
init = "random"
[model.arch]
hidden_size = 16
intermediate_size = 32
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 8
rms_norm_eps = 1e-6
rope_theta = 10000.0
tie_word_embeddings = true
max_position_embeddings = 1024
[data]
train = "{}"
max_options = 16
max_tokens = 1024
[optim]
lr = 3e-3
beta1 = 0.9
beta2 = 0.999
eps = 1e-8
weight_decay = 0.01
warmup_steps = 2
min_lr_ratio = 0.0
grad_accum = 2
clip = 1.0
[train]
mode = "full"
max_steps = 6
batch_size = 3
seed = 7
checkpoint_every = 3
keep_checkpoints = 5
log_every = 1
[eval]
batch_size = 16
min_states_per_point = 5
permutations = 1
max_states = 0
{extra}
"#,
        train.display()
    );
    RunConfig::parse(&text, &[]).unwrap()
}

/// `a` and `b` hold the same values bit for bit (same length first); names the first that differs.
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: {} values vs {}",
        a.len(),
        b.len()
    );
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!(
            "{what} differ first at {i} of {}: {} vs {}",
            a.len(),
            a[i],
            b[i]
        );
    }
}

/// Largest |a_i - b_i| of two equally long vectors (the lengths are asserted equal).
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared vectors differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The weights of a saved model as f32, tensors in name order (F32, BF16 or F16 files).
fn model_bytes(dir: &Path) -> Vec<f32> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    names
        .iter()
        .flat_map(|n| {
            let t = st.tensor(n).unwrap();
            match t.dtype() {
                safetensors::Dtype::F32 => t
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect::<Vec<_>>(),
                safetensors::Dtype::BF16 => t
                    .data()
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                safetensors::Dtype::F16 => t
                    .data()
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                d => panic!("{n}: {d:?}"),
            }
        })
        .collect()
}

/// 6 steps straight against 3 steps, stop, `--resume`, 3 more: same losses, same weights.
#[test]
fn resume_continues_exactly() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 12);
    let cfg = tiny_run_config(&data, "");
    let straight = dir.path().join("straight");
    let a = train(&cfg, &straight, &TrainOptions::default()).unwrap();
    let split = dir.path().join("split");
    let b1 = train(
        &cfg,
        &split,
        &TrainOptions {
            stop_after: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(b1.interrupted && b1.steps == 3);
    assert!(!split.join("final").exists());
    // what a kill after step 5 (checkpoint at 3) leaves in metrics.jsonl, torn line included
    let metrics = split.join("metrics.jsonl");
    let mut logged = std::fs::read_to_string(&metrics).unwrap();
    logged.push_str("{\"kind\":\"train\",\"step\":4,\"loss\":9.0}\n{\"kind\":\"train\",\"step\":5,\"loss\":9.0}\n{\"kind\":\"tr");
    std::fs::write(&metrics, logged).unwrap();
    // without --resume an existing run is refused
    assert!(train(&cfg, &split, &TrainOptions::default()).is_err());
    let b2 = train(
        &cfg,
        &split,
        &TrainOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(b2.steps, 6);
    // the resume logged steps 4..6 once each: the killed run's 4 and 5 were dropped
    let steps: Vec<u64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
    let la =
        crate::checkpoint::read_state(&crate::checkpoint::latest(&straight).unwrap().unwrap().1)
            .unwrap();
    let lb = crate::checkpoint::read_state(&crate::checkpoint::latest(&split).unwrap().unwrap().1)
        .unwrap();
    // Bit for bit, as the README promises: the same losses, weights and accuracy.
    assert_eq!(la.losses.len(), 6);
    assert_same_bits(&la.losses, &lb.losses, "losses");
    let wa = model_bytes(&straight.join("final"));
    let wb = model_bytes(&split.join("final"));
    assert_same_bits(&wa, &wb, "final weights");
    assert_eq!(
        a.valid_after.accuracy.to_bits(),
        b2.valid_after.accuracy.to_bits()
    );
    // the run folder holds what the exporter and the demo read
    for f in [
        "run.toml",
        "metrics.jsonl",
        "summary.json",
        "tokenizer.json",
        "plots/loss.svg",
        "plots/reliability.svg",
    ] {
        assert!(straight.join(f).is_file(), "missing {f}");
    }
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "decision.json",
    ] {
        assert!(
            straight.join("final").join(f).is_file(),
            "missing final/{f}"
        );
    }
    let kinds: Vec<String> = std::fs::read_to_string(straight.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds.iter().filter(|k| *k == "train").count(), 6);
    assert_eq!(kinds.last().map(String::as_str), Some("final"));
    // checkpoints: step 3 and 6, both complete
    let steps: Vec<u64> = crate::checkpoint::list_complete(&straight)
        .unwrap()
        .iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(steps, vec![3, 6]);
    // final/ loads as a decision model, with the fitted temperatures
    let dm = DecisionModel::load(
        &straight.join("final").to_string_lossy(),
        &Default::default(),
    )
    .unwrap();
    assert!((dm.spec.temperature - a.temperatures.global as f64).abs() < 1e-6);
}

/// A LoRA run on top of a saved base: final/ holds the merged model and the PEFT adapter,
/// and the adapter on the base reproduces the merged model.
#[test]
fn lora_run_writes_merged_model_and_adapter() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V2, 10);
    // the base: a quick full run
    let base_cfg = tiny_run_config(&data, "");
    let base_run = dir.path().join("base");
    train(
        &RunConfig {
            train: crate::run_config::TrainSection {
                max_steps: 2,
                ..base_cfg.train.clone()
            },
            ..base_cfg.clone()
        },
        &base_run,
        &TrainOptions::default(),
    )
    .unwrap();
    let base_dir = base_run.join("final");
    let text = base_cfg.to_toml();
    let cfg = RunConfig::parse(
        &text,
        &[
            "model.init=pretrained".into(),
            format!(
                "model.source={}",
                toml::Value::String(base_dir.display().to_string())
            ),
            "train.mode=lora".into(),
            "lora.rank=2".into(),
            "lora.alpha=4".into(),
            "lora.dropout=0.1".into(),
            "lora.targets=[\"q_proj\",\"v_proj\",\"gate_proj\"]".into(),
        ],
    );
    let mut cfg = cfg.unwrap();
    cfg.model.arch = None;
    let run = dir.path().join("lora");
    let s = train(&cfg, &run, &TrainOptions::default()).unwrap();
    assert!(
        s.trainable_params < s.total_params / 5,
        "{} of {}",
        s.trainable_params,
        s.total_params
    );
    let fin = run.join("final");
    assert!(fin.join("adapter/adapter_config.json").is_file());
    let merged = DecisionModel::load(&fin.to_string_lossy(), &Default::default()).unwrap();
    let base = DecisionModel::load(&base_dir.to_string_lossy(), &Default::default()).unwrap();
    let (with_adapter, _, base_ref) =
        lora::load_peft(base.model.clone(), &fin.join("adapter")).unwrap();
    assert_eq!(base_ref, base_dir.display().to_string());
    let states: Vec<State> = decision_data::read_states(&[data], Default::default()).unwrap();
    let enc: Vec<_> = states
        .iter()
        .take(4)
        .map(|s| merged.encode(s).unwrap())
        .collect();
    let refs: Vec<&decision_prompt::Encoded> = enc.iter().collect();
    let a = crate::model::score::label_logits(&merged.model, &refs, merged.pad_id);
    let b = crate::model::score::label_logits(&with_adapter, &refs, merged.pad_id);
    assert_eq!(
        a.iter().map(Vec::len).collect::<Vec<_>>(),
        b.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert!((x - y).abs() < 1e-4, "merged {x} vs adapter {y}");
    }
}

/// Sharded micro-batches (forward and backward on parallel threads) train the same model as one
/// pass: the gradients are summed with each shard's share, so only float rounding differs. The
/// batch of 3 splits unevenly (2 + 1), which a wrong share would show. Full and LoRA modes.
#[test]
fn shards_train_the_same_model_as_one_pass() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 12);
    let run = |cfg: &RunConfig, name: &str| {
        let out = dir.path().join(name);
        let s = train(cfg, &out, &TrainOptions::default()).unwrap();
        (s, model_bytes(&out.join("final")))
    };
    let one = tiny_run_config(&data, "");
    let sharded = RunConfig::parse(&one.to_toml(), &["train.shards=2".into()]).unwrap();
    let (s1, w1) = run(&one, "one");
    let (s2, w2) = run(&sharded, "two");
    let (s2b, w2b) = run(&sharded, "two-again");
    assert_eq!(w2, w2b, "a sharded run reproduces bit for bit");
    assert_eq!(s2.final_train_loss, s2b.final_train_loss);
    let diff = max_abs_diff(&w1, &w2);
    assert!(diff <= 1e-4, "full: sharded weights differ by {diff}");
    assert!(
        (s1.final_train_loss.unwrap() - s2.final_train_loss.unwrap()).abs() <= 1e-4,
        "{:?} vs {:?}",
        s1.final_train_loss,
        s2.final_train_loss
    );

    // LoRA on top of the full run's model, 3 shards of one state each
    let base = dir.path().join("one").join("final");
    let lora = |shards: usize| lora_on(&one, &base, &[&format!("train.shards={shards}")]);
    let (_, l1) = run(&lora(1), "lora-one");
    let (_, l3) = run(&lora(3), "lora-three");
    let base_w = model_bytes(&base);
    assert_eq!(l1.len(), base_w.len());
    let moved = l1.iter().zip(&base_w).any(|(x, y)| x != y);
    assert!(moved, "the LoRA run changed the merged weights");
    let diff = max_abs_diff(&l1, &l3);
    assert!(diff <= 1e-4, "LoRA: sharded weights differ by {diff}");
}

#[test]
fn shards_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("x.parquet");
    let cfg = tiny_run_config(&data, "");
    let text = cfg.to_toml();
    let err = RunConfig::parse(&text, &["train.shards=0".into()]).unwrap_err();
    assert!(format!("{err:#}").contains("shards"), "{err:#}");
    let err = RunConfig::parse(&text, &["train.shards=4".into()]).unwrap_err();
    assert!(format!("{err:#}").contains("batch_size (3)"), "{err:#}");
}

/// `[train] recompute` trains the same model as the taped pass (full: 6 steps; LoRA in f32 and
/// on a bf16 base), and a recomputed run killed after 3 steps resumes to the same weights.
#[test]
fn recompute_trains_the_same_model_and_resumes() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 12);
    let run = |cfg: &RunConfig, name: &str, opts: TrainOptions| {
        let out = dir.path().join(name);
        let s = train(cfg, &out, &opts).unwrap();
        (s, out)
    };
    let taped = tiny_run_config(&data, "");
    let recomputed = RunConfig::parse(&taped.to_toml(), &["train.recompute=true".into()]).unwrap();
    let (s1, o1) = run(&taped, "taped", TrainOptions::default());
    let (s2, o2) = run(&recomputed, "recomputed", TrainOptions::default());
    let (w1, w2) = (
        model_bytes(&o1.join("final")),
        model_bytes(&o2.join("final")),
    );
    let diff = max_abs_diff(&w1, &w2);
    assert!(diff <= 1e-4, "full: recomputed weights differ by {diff}");
    let (l1, l2) = (s1.final_train_loss.unwrap(), s2.final_train_loss.unwrap());
    assert!((l1 - l2).abs() <= 1e-4, "{l1} vs {l2}");

    // killed after 3 steps, resumed: the same run
    let split = resumed_after_3_steps(&recomputed, &dir.path().join("split"));
    assert_same_bits(&w2, &model_bytes(&split.join("final")), "resumed weights");

    // LoRA on the full run's model: recompute in f32 matches, and a bf16 base trains
    let base = o1.join("final");
    let lora = |extra: &[&str]| lora_on(&taped, &base, extra);
    let (_, a) = run(&lora(&[]), "lora-taped", TrainOptions::default());
    let (_, b) = run(
        &lora(&["train.recompute=true"]),
        "lora-recomputed",
        TrainOptions::default(),
    );
    let (la, lb) = (model_bytes(&a.join("final")), model_bytes(&b.join("final")));
    let diff = max_abs_diff(&la, &lb);
    assert!(diff <= 1e-4, "LoRA: recomputed weights differ by {diff}");
    let base_w = model_bytes(&base);
    assert_eq!(la.len(), base_w.len());
    assert!(la.iter().zip(&base_w).any(|(x, y)| x != y));

    // bf16 base: the adapters train in f32 and the result stays near the f32 run (bf16 keeps
    // 8 bits of mantissa: the merged weights of a 6-step run agree to a few 1e-2)
    let (s, c) = run(
        &lora(&["train.recompute=true", "train.dtype=bf16"]),
        "lora-bf16",
        TrainOptions::default(),
    );
    assert!(s.final_train_loss.unwrap().is_finite());
    assert_all_dtype(
        &c.join("final/model.safetensors"),
        safetensors::Dtype::BF16,
        "final/ keeps the bf16 base's dtype",
    );
    let lc = model_bytes(&c.join("final"));
    let diff = max_abs_diff(&la, &lc);
    assert!(
        diff <= 5e-2,
        "bf16 base: merged weights differ from f32's by {diff}"
    );
    assert_all_dtype(
        &c.join("final/adapter/adapter_model.safetensors"),
        safetensors::Dtype::F32,
        "adapters are kept in f32",
    );

    // Trainable tokens beside the adapters (a tool in every prompt, and a label the tied head
    // reads): recompute matches the taped pass, a killed run resumes to the same bits, and in the
    // merged model's embedding exactly those two rows moved.
    let tokens = "lora.trainable_tokens=[\"lookup_order\",\"A\"]";
    let (_, t1) = run(&lora(&[tokens]), "tokens-taped", TrainOptions::default());
    let (_, t2) = run(
        &lora(&[tokens, "train.recompute=true"]),
        "tokens-recomputed",
        TrainOptions::default(),
    );
    let (w1, w2) = (
        model_bytes(&t1.join("final")),
        model_bytes(&t2.join("final")),
    );
    let diff = max_abs_diff(&w1, &w2);
    assert!(diff <= 1e-4, "tokens: recomputed weights differ by {diff}");
    let split_cfg = lora(&[tokens, "train.recompute=true"]);
    let split = resumed_after_3_steps(&split_cfg, &dir.path().join("tokens-split"));
    assert_same_bits(
        &w2,
        &model_bytes(&split.join("final")),
        "tokens: resumed weights",
    );

    let embed = |dir: &Path| {
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("model.embed_tokens.weight").unwrap();
        let values: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (values, t.shape()[1])
    };
    let ((before, h), (after, _)) = (embed(&base), embed(&t2.join("final")));
    let tok = decision_prompt::tokenizer::load(&base.join("tokenizer.json")).unwrap();
    let mut want: Vec<usize> = ["lookup_order", "A"]
        .iter()
        .map(|t| tok.token_to_id(t).unwrap() as usize)
        .collect();
    want.sort();
    let moved: Vec<usize> = (0..before.len() / h)
        .filter(|&r| before[r * h..(r + 1) * h] != after[r * h..(r + 1) * h])
        .collect();
    assert_eq!(moved, want, "the embedding rows that trained");
    let adapter: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(t2.join("final/adapter/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        adapter["trainable_token_indices"].as_array().unwrap().len(),
        2
    );
}

/// Every tensor of the safetensors file `path` has `dtype`.
fn assert_all_dtype(path: &Path, dtype: safetensors::Dtype, what: &str) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(
        st.tensors().iter().all(|(_, t)| t.dtype() == dtype),
        "{what}"
    );
}

#[test]
fn precision_and_recompute_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run_config(&dir.path().join("x.parquet"), "");
    let text = cfg.to_toml();
    let err = RunConfig::parse(&text, &["train.dtype=bf16".into()]).unwrap_err();
    assert!(
        format!("{err:#}").contains("full fine-tuning trains in f32"),
        "{err:#}"
    );
    let err = RunConfig::parse(&text, &["train.dtype=f64".into()]).unwrap_err();
    assert!(format!("{err:#}").contains("dtype"), "{err:#}");
    let lora = [
        "model.init=pretrained".to_string(),
        "model.source=somewhere".into(),
        "train.mode=lora".into(),
        "lora.dropout=0.1".into(),
        "train.recompute=true".into(),
    ];
    let mut t: toml::Table = toml::from_str(&text).unwrap();
    t["model"].as_table_mut().unwrap().remove("arch");
    let err = RunConfig::parse(&toml::to_string(&t).unwrap(), &lora).unwrap_err();
    assert!(
        format!("{err:#}").contains("recompute = true needs [lora] dropout = 0"),
        "{err:#}"
    );
}

/// The 4B shape at 8 x 2048 tokens in f32 without recompute does not fit 24 GiB; the refusal
/// says so and names settings whose plan does fit, and those settings pass the same check.
#[test]
fn an_oversized_plan_is_refused_with_settings_that_fit() {
    let arch = Qwen3Config::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/shapes/qwen3-4b.json"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_run_config(&dir.path().join("x.parquet"), "").to_toml();
    let mut t: toml::Table = toml::from_str(&base).unwrap();
    t["model"].as_table_mut().unwrap().remove("arch");
    let sets = [
        "model.init=pretrained",
        "model.source=Qwen/Qwen3-4B",
        "train.mode=lora",
        "lora.rank=16",
        "lora.alpha=32",
        "lora.dropout=0",
        "train.batch_size=8",
        "optim.grad_accum=4",
        "data.max_tokens=2048",
    ]
    .map(String::from);
    let cfg = RunConfig::parse(&toml::to_string(&t).unwrap(), &sets).unwrap();
    let gpu = crate::plan::DeviceMemory {
        bytes: 24 << 30,
        what: "a 24 GiB GPU".into(),
        narrowest: crate::Precision::Bf16,
    };
    let plan = crate::plan::plan(&cfg, &arch);
    assert_eq!(plan.params, 4_022_468_096, "Qwen3-4B's parameter count");
    assert_eq!(plan.weights, plan.params * 4, "f32 base");
    let err = format!("{:#}", plan.check(&cfg, &arch, &gpu).unwrap_err());
    assert!(
        err.contains("a 24 GiB GPU") && err.contains("this would fit"),
        "{err}"
    );
    // apply the suggested settings: they fit
    let suggested: Vec<String> = err
        .split("this would fit: ")
        .nth(1)
        .unwrap()
        .split("; or ")
        .last()
        .unwrap()
        .split(" (")
        .next()
        .unwrap()
        .split("--set ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert!(
        suggested.iter().any(|s| s == "train.recompute=true"),
        "{suggested:?}"
    );
    let fixed = RunConfig::parse(&cfg.to_toml(), &suggested).unwrap();
    let p = crate::plan::plan(&fixed, &arch);
    assert!(p.check(&fixed, &arch, &gpu).is_ok());
    assert_eq!(
        fixed.train.batch_size * fixed.optim.grad_accum,
        32,
        "the effective batch is kept"
    );
    // recompute's activations are a small share of the taped ones at this size
    assert!(p.activations_recompute * 10 < p.activations_taped);
}

/// A run folder another live process trains into is refused, before anything is written; a lock
/// left by a process that is gone is replaced; the lock goes when the run ends.
#[test]
fn a_run_folder_takes_one_run_at_a_time() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 8);
    let cfg = tiny_run_config(&data, "");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let lock = run.join(crate::run_lock::FILE);
    // held by a live process: this one
    std::fs::write(&lock, std::process::id().to_string()).unwrap();
    let err = format!(
        "{:#}",
        train(&cfg, &run, &TrainOptions::default()).unwrap_err()
    );
    assert!(err.contains("in use by another `decision train`"), "{err}");
    assert!(!run.join("run.toml").exists(), "nothing written");
    // left by a process that is gone (above Linux's largest pid)
    std::fs::write(&lock, "4194305").unwrap();
    train(&cfg, &run, &TrainOptions::default()).unwrap();
    assert!(run.join("final").is_dir());
    assert!(!lock.exists(), "released at the end");
}

/// Each GPU failure's error names what happened, the plan's figure, the device's memory, the
/// setting to change and where the run resumes: from its last checkpoint (a run stopped early
/// writes one where it stops), or from the start.
#[test]
fn a_gpu_failure_says_what_the_plan_needed_and_where_to_resume() {
    use crate::model::backend::GpuFailure;
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 8);
    let cfg = tiny_run_config(&data, "");
    let run = dir.path().join("run");
    let opts = TrainOptions {
        stop_after: Some(4),
        ..TrainOptions::default()
    };
    train(&cfg, &run, &opts).unwrap();
    let device = Device::flex();
    let planned = {
        let arch = crate::plan::architecture(&cfg).unwrap();
        crate::plan::gib(crate::plan::plan(&cfg, &arch).total)
    };
    let told = |failure, run: &Path, message: &str| {
        format!(
            "{:#}",
            crate::trainer::gpu_failure(&cfg, &device, run, failure, message)
        )
    };
    let oom = told(
        Some(GpuFailure::OutOfMemory),
        &run,
        " out of device memory\n",
    );
    for part in [
        "ran out of memory",
        &format!("the plan needs about {planned} and the device has "),
        "--set train.recompute=true with --resume, or lower --set train.batch_size (now 3",
        "--set data.max_tokens (now 1024) in a new run (another --out",
        "resumes from its checkpoint of step 4 with --resume",
        "The runtime said: out of device memory",
    ] {
        assert!(oom.contains(part), "{part:?} in {oom}");
    }
    let lost = told(Some(GpuFailure::DeviceLost), &run, "device lost");
    assert!(
        lost.contains("was lost") && lost.contains(&planned),
        "{lost}"
    );
    let kernel = told(Some(GpuFailure::Kernel), &run, "shader");
    assert!(kernel.contains("train.dtype=f32"), "{kernel}");
    let fresh = dir.path().join("fresh");
    let other = told(None, &fresh, "Could not lock adapter context.");
    for part in [
        "a thread of the GPU's runtime failed",
        &format!("it needed about {planned} and the device has "),
        "no checkpoint was written yet",
        "The runtime said: Could not lock adapter context.",
    ] {
        assert!(other.contains(part), "{part:?} in {other}");
    }
}

/// A copy of the folder `from` (files and folders) at `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Flip one bit of a weight in the middle of a safetensors file's data: the exponent's lowest
/// bit of that f32, which doubles or halves it (finite, so only the hashes can tell).
fn flip_weight(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    let header = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let start = 8 + header;
    let at = start + (((b.len() - start) / 2) & !3) + 2;
    b[at] ^= 0x80;
    std::fs::write(path, b).unwrap();
}

/// `--resume` after a kill whose newest checkpoint is damaged (a flipped bit in the weights, a
/// truncated optimizer file, a missing trainer state) goes back to the checkpoint before it and
/// still ends with the weights of an uninterrupted run; with no intact checkpoint it stops with
/// an error naming each.
#[test]
fn resume_passes_over_a_damaged_checkpoint() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 12);
    let cfg = tiny_run_config(&data, "");
    let straight = dir.path().join("straight");
    train(&cfg, &straight, &TrainOptions::default()).unwrap();
    let want = model_bytes(&straight.join("final"));
    // killed after step 5: checkpoints at 3 (checkpoint_every) and 5 (the stop)
    let killed = dir.path().join("killed");
    let stop = TrainOptions {
        stop_after: Some(5),
        ..Default::default()
    };
    train(&cfg, &killed, &stop).unwrap();
    let steps: Vec<u64> = crate::checkpoint::list_complete(&killed)
        .unwrap()
        .iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(steps, vec![3, 5]);
    let resume = TrainOptions {
        resume: true,
        ..Default::default()
    };
    let step = |run: &Path, n: u64| {
        crate::checkpoint::checkpoints_dir(run).join(crate::checkpoint::step_dir_name(n))
    };
    type Damage = fn(&Path);
    let cases: [(&str, Damage); 3] = [
        ("flipped", |c| {
            flip_weight(&c.join("model/model.safetensors"))
        }),
        ("truncated", |c| {
            let p = c.join(crate::checkpoint::OPTIMIZER_FILE);
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() - 100]).unwrap();
        }),
        ("missing", |c| {
            std::fs::remove_file(c.join(crate::checkpoint::STATE_FILE)).unwrap()
        }),
    ];
    for (name, damage) in cases {
        let run = dir.path().join(name);
        copy_dir(&killed, &run);
        damage(&step(&run, 5));
        let s =
            train(&cfg, &run, &resume).unwrap_or_else(|e| panic!("{name}: resume failed: {e:#}"));
        assert_eq!(s.steps, 6, "{name}");
        assert_same_bits(
            &want,
            &model_bytes(&run.join("final")),
            &format!("{name}: final weights"),
        );
    }
    // every checkpoint damaged: nothing to resume from
    let run = dir.path().join("none");
    copy_dir(&killed, &run);
    for n in [3, 5] {
        flip_weight(&step(&run, n).join("model/model.safetensors"));
    }
    let err = format!("{:#}", train(&cfg, &run, &resume).unwrap_err());
    assert!(
        err.contains("nothing to resume from")
            && err.contains("step-0000003")
            && err.contains("step-0000005"),
        "{err}"
    );
    assert!(!run.join("final").exists());
}

// ---- f16 safety -------------------------------------------------------------------------

/// Every float weight of `model` cast to `dtype`, as a checkpoint loaded in that dtype holds it.
pub(crate) fn cast_weights(model: Qwen3, dtype: burn::tensor::FloatDType) -> Qwen3 {
    struct Cast(burn::tensor::FloatDType);
    impl ModuleMapper for Cast {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let dtype = self.0;
            p.map(|t| t.cast(dtype))
        }
    }
    model.map(&mut Cast(dtype))
}

pub(crate) fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// ‖a − b‖ / ‖b‖.
pub(crate) fn relative_l2(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| (x as f64).powi(2)).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| x - y)) / norm(&mut b.iter().copied())
}

/// A layer whose MLP input is 1000 times louder than the rest: gate and up stay within f16
/// (a few thousand), their product, down_proj's input, passes 65 504. In f32 the model is
/// finite; in f16 exactly that product is flagged, by name; computed in f32 it is finite again
/// and agrees with the f32 model to f16's rounding of the other products.
#[test]
fn an_overflowing_f16_product_is_named_and_computed_in_f32() {
    use crate::model::f16_safety::{ProductChecks, promote};
    use burn::tensor::FloatDType;
    let _rng = device_rng();
    let device = Device::flex();
    device.seed(21);
    let mut model = init_random(&tiny_config(16), 0.3, &device);
    model.model.layers[1].post_attention_layernorm.weight =
        Param::from_tensor(Tensor::<1>::full([16], 1000.0, &device));
    let want = values(model.decode(&batch()));
    assert!(want.iter().all(|x| x.is_finite()));

    let mut half = cast_weights(model.clone(), FloatDType::F16);
    let checks = ProductChecks::new();
    let got = values(half.decode_checked(&batch(), Some(&checks)));
    assert!(
        got.iter().any(|x| !x.is_finite()),
        "the f16 model overflows"
    );
    let names = checks.overflowed();
    assert_eq!(names, ["model.layers.1.mlp.down_proj"]);

    promote(&mut half, &names).unwrap();
    let checks = ProductChecks::new();
    let got = values(half.decode_checked(&batch(), Some(&checks)));
    assert!(checks.overflowed().is_empty());
    let rel = relative_l2(&got, &want);
    assert!(rel < 1e-2, "promoted f16 model vs f32: relative L2 {rel:e}");
    assert!(promote(&mut half, &["model.layers.2.mlp.down_proj".into()]).is_err());
    assert!(promote(&mut half, &["model.layers.1.mlp.out_proj".into()]).is_err());

    // bf16 has f32's range: the same model is finite, and nothing is checked.
    let checks = ProductChecks::new();
    let bf = values(cast_weights(model, FloatDType::BF16).decode_checked(&batch(), Some(&checks)));
    assert!(bf.iter().all(|x| x.is_finite()));
    assert!(checks.overflowed().is_empty());
}

/// The gradients of the adapters on q_proj and gate_proj reach the loss only through o_proj's
/// and down_proj's frozen products. With a loss this small (1e-8 of the decision loss), those
/// products' f16 backward flushes them to zero; multiplied by the loss scale before the backward
/// pass and divided after, they match the f32 base's (to f16's rounding).
#[test]
fn loss_scaling_keeps_gradients_an_f16_base_would_flush_to_zero() {
    use crate::model::f16_safety::LossScaler;
    use burn::tensor::FloatDType;
    let _rng = device_rng();
    let device = Device::flex();
    device.seed(22);
    let base = init_random(&tiny_config(16), 0.3, &device);
    let lspec = spec(&["q_proj", "gate_proj"]);
    let grads = |base: Qwen3, factor: f32| -> Vec<(String, Vec<f32>)> {
        let mut model = lora::attach(base.train(), &lspec, 1);
        // B = 0 at initialisation would leave A's gradients zero: give B fixed values.
        for layer in 0..model.model.layers.len() {
            for (_, proj) in lora::projections_mut(&mut model, layer) {
                if let Some(ad) = proj.lora.as_mut() {
                    let dims = ad.lora_b.shape().dims::<2>();
                    let v: Vec<f32> = (0..dims[0] * dims[1])
                        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.05)
                        .collect();
                    let b = Tensor::<2>::from_data(TensorData::new(v, dims), &ad.lora_b.device());
                    ad.lora_b = Param::initialized(ad.lora_b.id, b.require_grad());
                }
            }
        }
        let mb = MicroBatch {
            batch: batch(),
            targets: LossTargets::build(&[(3, 1, Some(vec![0.2, 0.7, 0.1])), (2, 0, None)], 0.3),
            label_ids: LABELS.to_vec(),
            tokens: 9,
        };
        let w = LossWeights {
            brier_weight: 0.5,
            teacher_blend: 0.3,
            lm_weight: 0.0,
        };
        let head = |decoded| training_loss(&model, decoded, &mb, w).mul_scalar(factor);
        let (_, g) = crate::recompute::loss_and_grads(
            &model,
            &batch(),
            head,
            None,
            true,
            crate::recompute::FINISH_BUDGET,
        );
        let mut out = Vec::new();
        for layer in 0..2 {
            for p in ["self_attn.q_proj", "mlp.gate_proj"] {
                for m in ["lora_a", "lora_b"] {
                    let path = format!("model.layers.{layer}.{p}.lora.{m}");
                    out.push((path.clone(), grad_of(&model, &g, &path)));
                }
            }
        }
        out
    };
    let tiny = 1e-8;
    let scale = LossScaler::default().scale;
    let f32_base = grads(base.clone(), tiny);
    let f16_base = cast_weights(base, FloatDType::F16);
    let flushed = grads(f16_base.clone(), tiny);
    let scaled = grads(f16_base, tiny * scale);
    for (((name, want), (_, zero)), (_, got)) in f32_base.iter().zip(&flushed).zip(&scaled) {
        assert!(
            want.iter().any(|&x| x != 0.0),
            "{name}: the f32 base's gradient is 0"
        );
        assert!(
            zero.iter().all(|&x| x == 0.0),
            "{name}: not flushed to zero in f16"
        );
        let got: Vec<f32> = got.iter().map(|x| x / scale).collect();
        let rel = relative_l2(&got, want);
        assert!(rel < 2e-2, "{name}: scaled f16 vs f32 relative L2 {rel:e}");
    }
}

/// A copy of the f32 model folder `from` at `to`, the named tensors of its model.safetensors
/// multiplied by their factors: a synthetic checkpoint built to make an f16 base misbehave.
fn scaled_model(from: &Path, to: &Path, factors: &[(&str, f32)]) {
    copy_dir(from, to);
    let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
        let factor = factors.iter().find(|(n, _)| *n == name).map(|(_, f)| *f);
        let data: Vec<u8> = match factor {
            None => view.data().to_vec(),
            Some(f) => view
                .data()
                .chunks_exact(4)
                .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * f).to_le_bytes())
                .collect(),
        };
        tensors.push((name, view.shape().to_vec(), data));
    }
    for (name, _) in factors {
        assert!(
            tensors.iter().any(|(n, _, _)| n == name),
            "no tensor {name}"
        );
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, shape, data)| {
            let v =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &to.join("model.safetensors")).unwrap();
}

/// The `metrics.jsonl` lines of `kind`.
fn metrics_of(run: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// The tiny run `full`'s config turned into a LoRA run (rank 2, lr 3e-2) on the model folder
/// `base`, with `extra` overrides.
fn lora_on(full: &RunConfig, base: &Path, extra: &[&str]) -> RunConfig {
    let mut sets = vec![
        "model.init=pretrained".to_string(),
        format!(
            "model.source={}",
            toml::Value::String(base.display().to_string())
        ),
        "train.mode=lora".into(),
        "lora.rank=2".into(),
        "lora.alpha=4".into(),
        "lora.dropout=0".into(),
        "optim.lr=3e-2".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let mut c = RunConfig::parse(&full.to_toml(), &sets).unwrap();
    c.model.arch = None;
    c
}

/// The tiny full run's model as a LoRA base in f16 with adapters on all seven projections and
/// recompute on, `factors` applied to its weights: a maker of such run configs, given overrides.
fn f16_lora_on(dir: &Path, factors: &[(&str, f32)]) -> impl Fn(&[&str]) -> RunConfig + use<> {
    let data = states_file(dir, RulesVersion::V1, 12);
    let cfg = tiny_run_config(&data, "");
    let full = dir.join("full");
    train(&cfg, &full, &TrainOptions::default()).unwrap();
    let base = dir.join("base");
    scaled_model(&full.join("final"), &base, factors);
    move |extra: &[&str]| {
        let targets = format!("lora.targets={:?}", crate::run_config::LORA_TARGETS);
        let mut sets = vec![targets.as_str(), "train.dtype=f16", "train.recompute=true"];
        sets.extend_from_slice(extra);
        lora_on(&cfg, &base, &sets)
    }
}

/// A run stopped (for memory, say) resumes with the settings that change how a step runs
/// (recompute, the replay's pieces, the evaluation's batch) and trains to what it would have
/// trained; a resume that changes what the run trains or its data's order (the learning rate,
/// the batch size) is refused, naming each change.
#[test]
fn a_resume_may_change_how_a_step_runs_not_what_it_trains() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 12);
    let taped = tiny_run_config(&data, "");
    let with = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::parse(&taped.to_toml(), &sets).unwrap()
    };
    let whole = dir.path().join("whole");
    train(&taped, &whole, &TrainOptions::default()).unwrap();
    let out = dir.path().join("split");
    let stop = TrainOptions {
        stop_after: Some(3),
        ..Default::default()
    };
    assert!(train(&taped, &out, &stop).unwrap().interrupted);
    let resume = TrainOptions {
        resume: true,
        ..Default::default()
    };
    let other = with(&[
        "optim.lr=0.001",
        "train.batch_size=1",
        "optim.grad_accum=6",
        "eval.batch_size=4",
    ]);
    let refused = format!("{:#}", train(&other, &out, &resume).unwrap_err());
    for part in [
        "optim.lr 0.003 -> 0.001",
        "train.batch_size 3 -> 1",
        "optim.grad_accum 2 -> 6",
        "A resumed run keeps what it trains and its data's order; it may change only \
         train.recompute, train.replay_piece_mib, eval.batch_size. Resume with the run's values",
    ] {
        assert!(refused.contains(part), "{part:?} in {refused}");
    }
    assert!(!refused.contains("eval.batch_size 16"), "{refused}");
    let changed = with(&[
        "train.recompute=true",
        "train.replay_piece_mib=1",
        "eval.batch_size=4",
    ]);
    train(&changed, &out, &resume).unwrap();
    let diff = max_abs_diff(
        &model_bytes(&whole.join("final")),
        &model_bytes(&out.join("final")),
    );
    assert!(
        diff <= 1e-4,
        "resumed with recompute: weights differ by {diff}"
    );
    // run.toml says how the run went on
    let saved = std::fs::read_to_string(out.join("run.toml")).unwrap();
    assert_eq!(RunConfig::parse(&saved, &[]).unwrap(), changed);
}

/// `cfg` run into `out`, killed after 3 steps and resumed to its end; returns `out`.
fn resumed_after_3_steps(cfg: &RunConfig, out: &Path) -> PathBuf {
    let stop = TrainOptions {
        stop_after: Some(3),
        ..Default::default()
    };
    assert!(train(cfg, out, &stop).unwrap().interrupted);
    let resume = TrainOptions {
        resume: true,
        ..Default::default()
    };
    train(cfg, out, &resume).unwrap();
    out.to_path_buf()
}

/// A synthetic checkpoint whose MLP input is 3000 times louder (its post_attention_layernorm):
/// in an f16 LoRA run the down_proj product overflows at the first step. With
/// `f16_overflow = "f32"` the run names it, computes it in f32 from then on (metrics.jsonl and
/// the checkpoints say so), trains to a finite loss, and a run killed after 3 steps resumes to the
/// same bits; with `"stop"` it ends with an error naming the projection and the settings.
#[test]
fn an_f16_run_computes_an_overflowing_projection_in_f32() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let lora = f16_lora_on(
        dir.path(),
        &[("model.layers.0.post_attention_layernorm.weight", 3000.0)],
    );
    let down = "model.layers.0.mlp.down_proj";
    let straight = dir.path().join("straight");
    let s = train(&lora(&[]), &straight, &TrainOptions::default()).unwrap();
    assert!(s.final_train_loss.unwrap().is_finite());
    let promoted = metrics_of(&straight, "precision");
    assert_eq!(promoted.len(), 1, "{promoted:?}");
    assert_eq!(promoted[0]["step"], 1);
    assert_eq!(promoted[0]["f32_projections"], serde_json::json!([down]));
    let state = crate::checkpoint::read_state(&straight.join("checkpoints/step-0000003")).unwrap();
    assert_eq!(state.f32_projections, [down]);
    assert_all_dtype(
        &straight.join("final/model.safetensors"),
        safetensors::Dtype::F16,
        "final/ keeps the f16 base's dtype",
    );

    let split = resumed_after_3_steps(&lora(&[]), &dir.path().join("split"));
    assert_same_bits(
        &model_bytes(&straight.join("final")),
        &model_bytes(&split.join("final")),
        "resumed weights",
    );
    assert_eq!(metrics_of(&split, "precision").len(), 1);

    let err = train(
        &lora(&["train.f16_overflow=stop"]),
        &dir.path().join("stopped"),
        &TrainOptions::default(),
    )
    .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains(down)
            && err.contains("--set train.f16_overflow=f32")
            && err.contains("step 1"),
        "{err}"
    );
}

/// A synthetic checkpoint whose final norm is 10 times larger: at the initial loss scale (2^16)
/// the gradients flowing back into the f16 products overflow.
/// Each such step is skipped (no update, AdamW's count unchanged) and the scale halves, logged
/// in metrics.jsonl, until the gradients fit; the run ends with a finite loss, and a run killed
/// after 3 steps resumes to the same bits (the scale and AdamW's count come back).
#[test]
fn an_f16_run_skips_overflowing_steps_and_halves_the_loss_scale() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let lora = f16_lora_on(dir.path(), &[("model.norm.weight", 10.0)]);
    let straight = dir.path().join("straight");
    let s = train(&lora(&[]), &straight, &TrainOptions::default()).unwrap();
    assert!(s.final_train_loss.unwrap().is_finite());
    let skips = metrics_of(&straight, "skip");
    assert!(!skips.is_empty() && skips.len() < 6, "{skips:?}");
    for (i, skip) in skips.iter().enumerate() {
        assert_eq!(
            skip["step"],
            i as u64 + 1,
            "the first steps are the ones skipped"
        );
        assert_eq!(skip["loss_scale"], 32768.0 / 2f64.powi(i as i32), "halving");
    }
    let trains = metrics_of(&straight, "train");
    let last = trains.last().unwrap();
    assert_eq!(last["loss_scale"], 65536.0 / 2f64.powi(skips.len() as i32));
    assert!(metrics_of(&straight, "precision").is_empty());
    let (_, meta) = crate::checkpoint::read_tensors(
        &straight
            .join("checkpoints/step-0000006")
            .join(crate::checkpoint::OPTIMIZER_FILE),
    )
    .unwrap();
    assert_eq!(
        meta["step"],
        (6 - skips.len()).to_string(),
        "AdamW counts applied steps"
    );

    let split = resumed_after_3_steps(&lora(&[]), &dir.path().join("split"));
    assert_same_bits(
        &model_bytes(&straight.join("final")),
        &model_bytes(&split.join("final")),
        "resumed weights",
    );
}

/// `answer_logits` runs the last layer at the answer slot alone (`forward_last`). The full
/// pass's last position, normed and through the same head rows, gives the same logits on rows
/// with left padding: to f32 rounding with f32 weights; with bf16 weights within the bf16
/// rounding of the full pass's attention tiles (their products in bf16, the slot's in f32).
#[test]
fn the_last_layer_at_the_answer_slot_alone_gives_the_full_pass() {
    use burn::tensor::FloatDType;
    let _rng = device_rng();
    let device = Device::flex();
    device.seed(23);
    let model = init_random(&tiny_config(16), 0.3, &device);
    for (model, tol) in [
        (model.clone(), 1e-5),
        (cast_weights(model, FloatDType::BF16), 1e-2),
    ] {
        let full = model.decode(&batch());
        let [b, s, h] = full.dims();
        let slot = model
            .model
            .norm
            .forward(full.narrow(1, s - 1, 1).reshape([b, h]));
        let want = values(model.token_logits(slot, &LABELS));
        let got = values(model.answer_logits(&batch(), &LABELS));
        let rel = relative_l2(&got, &want);
        assert!(rel < tol, "{:?}: relative L2 {rel:e}", model.dtype());
    }
}

/// The final evaluation scores every validation state, flip rate included, yet runs no more
/// batches side by side than the plan counts for an evaluation of `max_states`: here 2, in a
/// pool of 4 threads (before, the final evaluation ran one batch per thread).
#[test]
fn the_final_evaluation_runs_the_batches_side_by_side_that_the_plan_counts() {
    let _rng = device_rng();
    let dir = tempfile::tempdir().unwrap();
    let data = states_file(dir.path(), RulesVersion::V1, 12);
    let mut cfg = tiny_run_config(&data, "");
    cfg.train.max_steps = 1;
    cfg.eval.batch_size = 1;
    cfg.eval.max_states = 2;
    cfg.eval.permutations = 2;
    let arch = crate::plan::architecture(&cfg).unwrap();
    let four = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let (planned, rounds, summary) = four.install(|| {
        let planned = crate::plan::plan(&cfg, &arch).eval_alive;
        crate::model::score::tests::SIDE_BY_SIDE.with(|s| s.borrow_mut().clear());
        let summary = train(&cfg, &dir.path().join("run"), &TrainOptions::default()).unwrap();
        let rounds = crate::model::score::tests::SIDE_BY_SIDE.with(|s| s.borrow().clone());
        (planned, rounds, summary)
    });
    assert_eq!(planned, 2, "the plan's evaluation: 2 states, a batch each");
    assert!(summary.flip_rate.is_some(), "the flip rate was measured");
    // The final evaluation and 2 permutations: 3 passes over the validation states.
    assert!(rounds.len() >= 3 * 2, "rounds {rounds:?}");
    assert_eq!(rounds.iter().max(), Some(&2), "rounds {rounds:?}");
}
