//! Write a Qwen3 checkpoint of any shape with random weights, tensor by tensor, for measuring
//! real sizes (the 0.6B and 4B shapes of `configs/shapes/`) without downloading one, plus a
//! states file whose prompts have a chosen length.
//!
//!   cargo run --release -p decision-train --example random_qwen3 -- \
//!       --config configs/shapes/qwen3-4b.json --dtype bf16 --out bench-out/qwen3-4b \
//!       --tokenizer tests/fixtures/export/tiny/tokenizer.json [--states 64 --tokens 512]
//!
//! Weights: normal(0, initializer_range) for matrices, ones for norms, zeros for biases, as
//! transformers' `_init_weights`; the file is written in the checkpoint's layout
//! (`model.safetensors`, one file) and never held in memory whole, so an 8 GB bf16 4B checkpoint
//! needs a few MB. With `--states N --tokens T` it also writes `OUT/states.jsonl`: N labelled
//! states of the synthetic shop whose contexts are padded with the tokenizer's words to about T
//! prompt tokens (a word-level tokenizer makes one token per word). `--no-weights` writes all of
//! it but `model.safetensors`: the small part of a checkpoint, to carry to a machine that makes
//! the weights itself (scripts/gpu-check.sh, with transformers).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use decision_train::config::Qwen3Config;
use decision_train::weights::expected_tensors;
use rand::{Rng, SeedableRng};

const USAGE: &str = "\
random_qwen3: a Qwen3 checkpoint of any shape with random weights, and states to train it on

  random_qwen3 --config SHAPE.json --out DIR --tokenizer TOKENIZER.json [options]

  --config FILE     a Hugging Face config.json (configs/shapes/ has Qwen3-0.6B's and -4B's)
  --out DIR         written: config.json, model.safetensors, tokenizer.json, decision.json
  --tokenizer FILE  the tokenizer.json to ship (tests/fixtures/export/tiny/tokenizer.json)
  --dtype bf16|f32  the weights' dtype (default bf16)
  --states N        also write DIR/states.jsonl with N labelled states (default 0: none)
  --tokens T        their prompts padded to about T tokens (default 512)
  --no-weights      everything but model.safetensors (for a machine that makes the weights)
";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut config, mut dtype, mut out, mut tokenizer) = (None, "bf16".to_string(), None, None);
    let (mut states, mut tokens, mut weights) = (0usize, 512usize, true);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--config" => config = Some(PathBuf::from(val()?)),
            "--dtype" => dtype = val()?,
            "--out" => out = Some(PathBuf::from(val()?)),
            "--tokenizer" => tokenizer = Some(PathBuf::from(val()?)),
            "--states" => states = val()?.parse()?,
            "--tokens" => tokens = val()?.parse()?,
            "--no-weights" => weights = false,
            "--help" | "-h" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other} (--help lists them)"),
        }
    }
    let (config, out, tokenizer) = (
        config.context("--config")?,
        out.context("--out")?,
        tokenizer.context("--tokenizer")?,
    );
    let width = match dtype.as_str() {
        "bf16" => 2,
        "f32" => 4,
        other => bail!("--dtype {other}: use bf16 or f32"),
    };
    let text = std::fs::read_to_string(&config)?;
    let mut json: serde_json::Value = serde_json::from_str(&text)?;
    json["torch_dtype"] = if width == 2 { "bfloat16" } else { "float32" }.into();
    let cfg = Qwen3Config::from_json(&json)?;
    let std = json["initializer_range"].as_f64().unwrap_or(0.02) as f32;
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::copy(&tokenizer, out.join("tokenizer.json"))?;
    // decision.json with the label token ids, so that a reference side can render and encode
    // prompts exactly as `decision` does (scripts/bench_scale.py).
    let tok = decision_train::tokenizer::load(&tokenizer)?;
    let mut spec = decision_train::default_spec(&tok);
    spec.max_tokens = 8192;
    spec.label_token_ids = spec.labels[..spec.max_options]
        .iter()
        .map(|l| {
            tok.token_to_id(l)
                .with_context(|| format!("label {l:?} is not one token of {}", tokenizer.display()))
        })
        .collect::<Result<_>>()?;
    std::fs::write(
        out.join("decision.json"),
        serde_json::to_string_pretty(&spec)?,
    )?;

    if weights {
        write_weights(&out, &cfg, width, std)?;
    }
    if states > 0 {
        write_states(&out, &tokenizer, states, tokens)?;
    }
    Ok(())
}

/// `model.safetensors`: the header, then each tensor's bytes in header order.
fn write_weights(out: &std::path::Path, cfg: &Qwen3Config, width: usize, std: f32) -> Result<()> {
    let tensors = expected_tensors(cfg);
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in &tensors {
        let n: usize = shape.iter().product();
        let tag = if width == 2 { "BF16" } else { "F32" };
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": tag, "shape": shape, "data_offsets": [offset, offset + n * width]}),
        );
        offset += n * width;
    }
    let mut head = serde_json::to_vec(&header)?;
    while head.len() % 8 != 0 {
        head.push(b' ');
    }
    let path = out.join("model.safetensors");
    let mut f = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(&path)?);
    f.write_all(&(head.len() as u64).to_le_bytes())?;
    f.write_all(&head)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    let total: usize = tensors
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    eprintln!(
        "{}: {} tensors, {:.2} B parameters",
        path.display(),
        tensors.len(),
        total as f64 / 1e9
    );
    let mut buf = Vec::with_capacity(1 << 22);
    for (name, shape) in &tensors {
        let n: usize = shape.iter().product();
        let constant = if name.ends_with("norm.weight") {
            Some(1.0f32)
        } else if name.ends_with(".bias") {
            Some(0.0)
        } else {
            None
        };
        let mut left = n;
        while left > 0 {
            let m = left.min(1 << 20);
            buf.clear();
            for _ in 0..m {
                let x = constant.unwrap_or_else(|| normal(&mut rng) * std);
                if width == 2 {
                    buf.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes());
                } else {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            }
            f.write_all(&buf)?;
            left -= m;
        }
    }
    f.flush()?;
    Ok(())
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut impl Rng) -> f32 {
    let u1: f32 = rng.random_range(f32::EPSILON..1.0);
    let u2: f32 = rng.random::<f32>();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// `n` labelled shop states whose contexts are padded to about `tokens` words.
fn write_states(
    out: &std::path::Path,
    tokenizer: &std::path::Path,
    n: usize,
    tokens: usize,
) -> Result<()> {
    let tok = decision_train::tokenizer::load(tokenizer)?;
    let mut words: Vec<String> = tok
        .get_vocab(false)
        .into_keys()
        .filter(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
        .collect();
    words.sort();
    if words.is_empty() {
        bail!(
            "{}: no plain words to pad contexts with",
            tokenizer.display()
        );
    }
    let mut states = decision_data::r#gen::generate(&decision_data::r#gen::GenOptions {
        tasks: n,
        seed: 11,
        ..Default::default()
    })?;
    states.retain(|s| s.answer.is_some());
    states.truncate(n);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for s in &mut states {
        let have = s.context.split_whitespace().count()
            + s.candidates
                .iter()
                .map(|c| c.label.split_whitespace().count() + 2)
                .sum::<usize>();
        let pad: Vec<&str> = (have..tokens)
            .map(|_| words[rng.random_range(0..words.len())].as_str())
            .collect();
        s.context = format!("{} {}", pad.join(" "), s.context);
    }
    let path = out.join("states.jsonl");
    decision_data::write_states(&path, &states)?;
    eprintln!(
        "{}: {} states of about {tokens} tokens",
        path.display(),
        states.len()
    );
    Ok(())
}
