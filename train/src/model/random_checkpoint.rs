//! Qwen3 checkpoints of any shape with random weights, written as a download would leave them:
//! one `model.safetensors` or shards with their index, and optionally inside a Hugging Face hub
//! cache (`models--OWNER--NAME/{blobs,snapshots/REV,refs/main}`). For measuring real sizes and
//! testing real layouts without downloading a model (`examples/random_qwen3.rs`, the
//! real-vocabulary tests).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use crate::model::config::Qwen3Config;
use crate::model::weights::{INDEX_FILE, expected_tensors};

/// Write `cfg`'s tensors with random values into `dir`: normal(0, `std`) for matrices, ones for
/// norms, zeros for biases (transformers' `_init_weights`), in bf16 (`width` 2) or f32 (4).
/// `shards` = 1 writes `model.safetensors`; more write `model-0000N-of-0000M.safetensors` of
/// about equal size and `model.safetensors.index.json`. Streamed: a few MB of memory whatever the
/// size. Returns the files written.
pub(crate) fn write_weights(
    dir: &Path,
    cfg: &Qwen3Config,
    width: usize,
    std: f32,
    shards: usize,
) -> Result<Vec<PathBuf>> {
    if width != 2 && width != 4 {
        bail!("width {width}: 2 (bf16) or 4 (f32)");
    }
    let tensors = expected_tensors(cfg);
    let size = |s: &[usize]| s.iter().product::<usize>() * width;
    let total: usize = tensors.iter().map(|(_, s)| size(s)).sum();
    let shards = shards.clamp(1, tensors.len());
    // Consecutive tensors into shards of about total / shards bytes.
    let mut groups: Vec<Vec<&(String, Vec<usize>)>> = vec![Vec::new()];
    let mut filled = 0usize;
    for t in &tensors {
        let open = groups.len();
        if filled >= total * open / shards && open < shards && !groups[open - 1].is_empty() {
            groups.push(Vec::new());
        }
        groups.last_mut().expect("one group").push(t);
        filled += size(&t.1);
    }
    let n = groups.len();
    let name = |k: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", k + 1)
        }
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    let mut written = Vec::new();
    let mut weight_map = serde_json::Map::new();
    for (k, group) in groups.iter().enumerate() {
        let path = dir.join(name(k));
        write_file(&path, group, width, std, &mut rng)?;
        for (t, _) in group {
            weight_map.insert(t.clone(), name(k).into());
        }
        written.push(path);
    }
    if n > 1 {
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let path = dir.join(INDEX_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(&index)?)
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// One safetensors file: the header, then each tensor's bytes in header order.
fn write_file(
    path: &Path,
    tensors: &[&(String, Vec<usize>)],
    width: usize,
    std: f32,
    rng: &mut impl Rng,
) -> Result<()> {
    let tag = if width == 2 { "BF16" } else { "F32" };
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * width;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": tag, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut head = serde_json::to_vec(&header)?;
    while head.len() % 8 != 0 {
        head.push(b' ');
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut f = std::io::BufWriter::with_capacity(1 << 22, file);
    f.write_all(&(head.len() as u64).to_le_bytes())?;
    f.write_all(&head)?;
    let mut buf = Vec::with_capacity(1 << 22);
    for (name, shape) in tensors {
        let constant = if name.ends_with("norm.weight") {
            Some(1.0f32)
        } else if name.ends_with(".bias") {
            Some(0.0)
        } else {
            None
        };
        let mut left: usize = shape.iter().product();
        while left > 0 {
            let m = left.min(1 << 20);
            buf.clear();
            for _ in 0..m {
                let x = constant.unwrap_or_else(|| normal(rng) * std);
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
    f.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut impl Rng) -> f32 {
    let u1: f32 = rng.random_range(f32::EPSILON..1.0);
    let u2: f32 = rng.random::<f32>();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// A model download's files in `dir`, as `hf download` of a Qwen3 repository gives them:
/// `config.json` (`config` with `torch_dtype` set to the weights' dtype), `generation_config.json`,
/// the tokenizer's files (`tokenizer` is a `tokenizer.json` or a folder holding it and
/// `tokenizer_config.json`; for a BPE also `vocab.json` and `merges.txt`), and random weights in
/// `shards` files unless `weights` is false. No `decision.json`: a download has none.
pub fn write_download(
    dir: &Path,
    config: &serde_json::Value,
    tokenizer: &Path,
    width: usize,
    shards: usize,
    weights: bool,
) -> Result<Qwen3Config> {
    let mut config = config.clone();
    config["torch_dtype"] = if width == 2 { "bfloat16" } else { "float32" }.into();
    let cfg = Qwen3Config::from_json(&config)?;
    let std = config["initializer_range"].as_f64().unwrap_or(0.02) as f32;
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    let (tokenizer_json, tokenizer_config) = if tokenizer.is_dir() {
        let c = tokenizer.join("tokenizer_config.json");
        (tokenizer.join("tokenizer.json"), c.is_file().then_some(c))
    } else {
        (tokenizer.to_path_buf(), None)
    };
    std::fs::copy(&tokenizer_json, dir.join("tokenizer.json"))
        .with_context(|| format!("copying {}", tokenizer_json.display()))?;
    if let Some(c) = &tokenizer_config {
        std::fs::copy(c, dir.join("tokenizer_config.json"))?;
    }
    write_bpe_tables(&tokenizer_json, dir)?;
    let tok = decision_prompt::tokenizer::load(&tokenizer_json)?;
    let generation = serde_json::json!({
        "bos_token_id": config["bos_token_id"], "eos_token_id": [config["eos_token_id"]],
        "pad_token_id": decision_prompt::tokenizer::pad_id(&tok), "do_sample": true,
        "temperature": 0.6, "top_k": 20, "top_p": 0.95,
    });
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::to_string_pretty(&generation)?,
    )?;
    if weights {
        write_weights(dir, &cfg, width, std, shards)?;
    }
    Ok(cfg)
}

/// The files of Qwen's tokenizer download besides `tokenizer.json`: `vocab.json` and `merges.txt`
/// (the byte-level BPE's two tables, as the slow tokenizer reads them), derived from
/// `tokenizer.json`. Nothing for a tokenizer that is not BPE.
fn write_bpe_tables(tokenizer_json: &Path, dir: &Path) -> Result<()> {
    let text = std::fs::read_to_string(tokenizer_json)
        .with_context(|| format!("reading {}", tokenizer_json.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", tokenizer_json.display()))?;
    let model = &doc["model"];
    if model["type"] != "BPE" {
        return Ok(());
    }
    std::fs::write(
        dir.join("vocab.json"),
        serde_json::to_string(&model["vocab"])?,
    )?;
    let mut merges = String::from("#version: 0.2\n");
    for m in model["merges"].as_array().into_iter().flatten() {
        match m {
            serde_json::Value::String(s) => merges.push_str(s),
            serde_json::Value::Array(pair) => {
                let part = |i: usize| pair.get(i).and_then(|p| p.as_str()).unwrap_or_default();
                merges.push_str(&format!("{} {}", part(0), part(1)));
            }
            _ => bail!(
                "{}: a merge that is neither a string nor a pair",
                tokenizer_json.display()
            ),
        }
        merges.push('\n');
    }
    std::fs::write(dir.join("merges.txt"), merges)?;
    Ok(())
}

/// Move the files of `folder` into a Hugging Face hub cache as `hf download REPO` leaves them:
/// `CACHE/models--OWNER--NAME/blobs/SHA256` holds each file, `snapshots/REVISION/FILE` links to
/// it (`../../blobs/SHA256`), and `refs/main` names `revision`. `folder` is left empty. Returns
/// the snapshot folder.
pub fn into_hub_cache(folder: &Path, cache: &Path, repo: &str, revision: &str) -> Result<PathBuf> {
    let Some((owner, name)) = repo.split_once('/') else {
        bail!("{repo:?}: a hub id is OWNER/NAME");
    };
    let repo_dir = cache.join(format!("models--{owner}--{name}"));
    let snapshot = repo_dir.join("snapshots").join(revision);
    std::fs::create_dir_all(repo_dir.join("blobs"))?;
    std::fs::create_dir_all(repo_dir.join("refs"))?;
    std::fs::create_dir_all(&snapshot)?;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(folder)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for path in entries {
        if !path.is_file() {
            continue;
        }
        let mut hasher = Sha256::new();
        std::io::copy(&mut std::fs::File::open(&path)?, &mut hasher)?;
        let blob = hex::encode(hasher.finalize());
        std::fs::rename(&path, repo_dir.join("blobs").join(&blob))?;
        let file_name = path.file_name().expect("a file");
        let link = snapshot.join(file_name);
        #[cfg(unix)]
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), &link)
            .with_context(|| format!("linking {}", link.display()))?;
        #[cfg(not(unix))]
        std::fs::copy(repo_dir.join("blobs").join(&blob), &link)?;
    }
    std::fs::write(repo_dir.join("refs").join("main"), revision)?;
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_tensors_and_the_index_lists_each_once() {
        let json = serde_json::json!({
            "model_type": "qwen3", "vocab_size": 96, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 8, "tie_word_embeddings": true, "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        });
        let cfg = Qwen3Config::from_json(&json).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = write_weights(dir.path(), &cfg, 2, 0.02, 3).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors",
                INDEX_FILE
            ]
        );
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&files[3]).unwrap()).unwrap();
        let map = index["weight_map"].as_object().unwrap();
        let want = expected_tensors(&cfg);
        assert_eq!(map.len(), want.len());
        for (name, shape) in &want {
            let shard = map[name].as_str().unwrap();
            let bytes = std::fs::read(dir.path().join(shard)).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(st.tensor(name).unwrap().shape(), shape.as_slice(), "{name}");
        }
        let cache = tempfile::tempdir().unwrap();
        let snap = into_hub_cache(dir.path(), cache.path(), "Qwen/Tiny", "abc123").unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let link = snap.join(INDEX_FILE);
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(
            std::fs::read(&link).unwrap(),
            serde_json::to_vec_pretty(&index).unwrap()
        );
        let refs = cache.path().join("models--Qwen--Tiny/refs/main");
        assert_eq!(std::fs::read_to_string(refs).unwrap(), "abc123");
    }
}
