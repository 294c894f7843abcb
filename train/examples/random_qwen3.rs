//! Write a Qwen3 checkpoint of any shape with random weights, tensor by tensor, for measuring
//! real sizes (the 0.6B and 4B shapes of `configs/shapes/`) without downloading one, plus a
//! states file whose prompts have a chosen length.
//!
//!   cargo run --release -p decision-train --example random_qwen3 -- \
//!       --config configs/shapes/qwen3-4b.json --dtype bf16 --out bench-out/qwen3-4b \
//!       --tokenizer tests/fixtures/export/tiny/tokenizer.json [--states 64 --tokens 512]
//!
//! Weights: normal(0, initializer_range) for matrices, ones for norms, zeros for biases, as
//! transformers' `_init_weights`, written by `decision_train::model::random_checkpoint` in the
//! checkpoint's layout (one `model.safetensors` or `--shards N` with their index, optionally in a
//! hub cache: `--hub-cache`) and never held in memory whole, so an 8 GB bf16 4B checkpoint
//! needs a few MB. With `--states N --tokens T` it also writes `OUT/states.jsonl`: N labelled
//! states of the synthetic shop whose contexts are padded with the tokenizer's words to about T
//! prompt tokens (a word-level tokenizer makes one token per word). `--no-weights` writes all of
//! it but `model.safetensors`: the small part of a checkpoint, to carry to a machine that makes
//! the weights itself (scripts/gpu-check.sh, with transformers).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use decision_train::model::random_checkpoint;
use decision_train::model::weights::expected_tensors;
use rand::{Rng, SeedableRng};

const USAGE: &str = "\
random_qwen3: a Qwen3 checkpoint of any shape with random weights, and states to train it on

  random_qwen3 --config SHAPE.json --out DIR --tokenizer TOKENIZER [options]

  --config FILE     a Hugging Face config.json (configs/shapes/ has Qwen3-0.6B's and -4B's)
  --out DIR         written: config.json, generation_config.json, model.safetensors, the
                    tokenizer's files, decision.json
  --tokenizer PATH  the tokenizer.json to ship (tests/fixtures/export/tiny/tokenizer.json), or a
                    folder with tokenizer.json and tokenizer_config.json (Qwen3's real one:
                    `make qwen3-tokenizer` puts it in target/qwen3-tokenizer)
  --dtype bf16|f32  the weights' dtype (default bf16)
  --shards N        split the weights into N files with model.safetensors.index.json (default 1)
  --hub-cache DIR   lay DIR/ out as a Hugging Face hub cache holding the model, as
                    `hf download REPO` leaves it: models--OWNER--NAME/ with blobs/, snapshots/REV/
                    (links to the blobs), refs/main; no decision.json (a download has none).
                    --out is then unused.
  --repo ID         the hub id for --hub-cache (default Qwen/Qwen3-4B)
  --revision REV    the snapshot's revision (default a fixed 40-hex name)
  --states N        also write DIR/states.jsonl (with --hub-cache: CACHE/states.jsonl) with N
                    labelled states (default 0: none)
  --tokens T        their prompts padded to about T tokens (default 512)
  --no-weights      everything but the weights (for a machine that makes them)
";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut config, mut dtype, mut out, mut tokenizer) = (None, "bf16".to_string(), None, None);
    let (mut states, mut tokens, mut weights, mut shards) = (0usize, 512usize, true, 1usize);
    let (mut hub_cache, mut repo) = (None, "Qwen/Qwen3-4B".to_string());
    let mut revision = "0123456789abcdef0123456789abcdef01234567".to_string();
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--config" => config = Some(PathBuf::from(val()?)),
            "--dtype" => dtype = val()?,
            "--out" => out = Some(PathBuf::from(val()?)),
            "--tokenizer" => tokenizer = Some(PathBuf::from(val()?)),
            "--shards" => shards = val()?.parse()?,
            "--hub-cache" => hub_cache = Some(PathBuf::from(val()?)),
            "--repo" => repo = val()?,
            "--revision" => revision = val()?,
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
    let config = config.context("--config")?;
    let tokenizer = tokenizer.context("--tokenizer")?;
    let tokenizer_json = if tokenizer.is_dir() {
        tokenizer.join("tokenizer.json")
    } else {
        tokenizer.clone()
    };
    // With --hub-cache the files are made in a folder beside the cache, then moved into it.
    let out = match (&hub_cache, out) {
        (Some(cache), _) => cache.join(format!(".random_qwen3-{}", std::process::id())),
        (None, Some(out)) => out,
        (None, None) => bail!("--out (or --hub-cache)"),
    };
    let width = match dtype.as_str() {
        "bf16" => 2,
        "f32" => 4,
        other => bail!("--dtype {other}: use bf16 or f32"),
    };
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config)?)?;
    let cfg = random_checkpoint::write_download(&out, &json, &tokenizer, width, shards, weights)?;
    let params: usize = expected_tensors(&cfg)
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    eprintln!(
        "{}: {:.3} B parameters ({dtype}{})",
        out.display(),
        params as f64 / 1e9,
        if weights { "" } else { ", weights not written" }
    );
    if hub_cache.is_none() {
        // decision.json with the label token ids, so that a reference side can render and
        // encode prompts exactly as `decision` does (scripts/bench_scale.py).
        let tok = decision_prompt::tokenizer::load(&tokenizer_json)?;
        let mut spec = decision_train::default_spec(&tok);
        spec.max_tokens = 8192;
        spec.label_token_ids = spec.labels[..spec.max_options]
            .iter()
            .map(|l| {
                tok.token_to_id(l).with_context(|| {
                    format!("label {l:?} is not one token of {}", tokenizer.display())
                })
            })
            .collect::<Result<_>>()?;
        std::fs::write(
            out.join("decision.json"),
            serde_json::to_string_pretty(&spec)?,
        )?;
    }
    if states > 0 {
        // Beside the hub cache's model folder, not inside it.
        write_states(
            hub_cache.as_ref().unwrap_or(&out),
            &tokenizer_json,
            states,
            tokens,
        )?;
    }
    if let Some(cache) = &hub_cache {
        let snapshot = random_checkpoint::into_hub_cache(&out, cache, &repo, &revision)?;
        std::fs::remove_dir(&out)?;
        eprintln!("{repo}@{revision}: {}", snapshot.display());
    }
    Ok(())
}

/// `n` labelled shop states whose contexts are padded to about `tokens` words.
fn write_states(
    out: &std::path::Path,
    tokenizer: &std::path::Path,
    n: usize,
    tokens: usize,
) -> Result<()> {
    let tok = decision_prompt::tokenizer::load(tokenizer)?;
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
