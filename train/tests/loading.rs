//! Loading and saving model folders: what a bad checkpoint is told, the Hub cache layout,
//! and that what we save loads back to the same model.

use std::path::{Path, PathBuf};

use decision_train::model::hub::HubEnv;
use decision_train::model::qwen3::Batch;
use decision_train::model::weights::{self, HfTensor, SaveDtype, WeightSource};
use decision_train::{DecisionModel, LoadOptions};

#[path = "../../tests/support/checkers.rs"]
mod checkers;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/model")
        .join(name)
}

fn load(src: &str) -> anyhow::Result<DecisionModel> {
    DecisionModel::load(src, &LoadOptions::default())
}

fn err(src: &Path) -> String {
    match load(src.to_str().unwrap()) {
        Ok(_) => panic!("{} loaded but should not", src.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// A copy of the tied fixture whose weights are `edit`ed before being written.
fn tied_with(edit: impl FnOnce(&mut Vec<HfTensor>)) -> tempfile::TempDir {
    let src = fixture("tied");
    let m = load(src.to_str().unwrap()).unwrap();
    let mut tensors: Vec<HfTensor> = m.hf_tensors().collect();
    edit(&mut tensors);
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let shapes: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    weights::write_safetensors(
        &dir.path().join("model.safetensors"),
        &shapes,
        tensors.into_iter(),
        SaveDtype::F32,
    )
    .unwrap();
    dir
}

fn last_logits(m: &DecisionModel, text: &str) -> Vec<f32> {
    let ids = m.tokenizer().encode(text, true).unwrap().get_ids().to_vec();
    let vocab: Vec<u32> = (0..m.config.vocab_size as u32).collect();
    m.model
        .answer_logits(&Batch::left_padded(&[ids.as_slice()], m.pad_id), &vocab)
        .into_data()
        .try_into_vec()
        .unwrap()
}

#[test]
fn bad_checkpoints_name_what_is_wrong() {
    let missing = tied_with(|t| t.retain(|x| x.name != "model.layers.1.mlp.up_proj.weight"));
    let e = err(missing.path());
    assert!(
        e.contains("missing (1): model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );

    let extra = tied_with(|t| {
        t.push(HfTensor {
            name: "model.layers.2.mlp.up_proj.weight".into(),
            shape: vec![2],
            data: vec![0.0; 2],
        })
    });
    let e = err(extra.path());
    assert!(
        e.contains("unexpected (1): model.layers.2.mlp.up_proj.weight"),
        "{e}"
    );

    let misshaped = tied_with(|t| {
        let q = t
            .iter_mut()
            .find(|x| x.name == "model.layers.0.self_attn.k_proj.weight")
            .unwrap();
        q.shape = vec![q.shape[1], q.shape[0]];
    });
    let e = err(misshaped.path());
    assert!(e.contains("mis-shaped (1): model.layers.0.self_attn.k_proj.weight: expected [16, 32], found [32, 16]"), "{e}");

    // A non-finite weight is refused at load, naming the tensor (it scored with null confidence).
    let nan = tied_with(|t| {
        let w = t
            .iter_mut()
            .find(|x| x.name == "model.layers.1.self_attn.o_proj.weight")
            .unwrap();
        w.data[3] = f32::NAN;
        w.data[5] = f32::INFINITY;
    });
    let e = err(nan.path());
    assert!(
        e.contains("\"model.layers.1.self_attn.o_proj.weight\" holds 2 non-finite value(s)"),
        "{e}"
    );

    // A pickle checkpoint is refused with why and how.
    let pickle = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(fixture("tied").join(f), pickle.path().join(f)).unwrap();
    }
    std::fs::write(pickle.path().join("pytorch_model.bin"), b"not really").unwrap();
    let e = err(pickle.path());
    assert!(
        e.contains("pytorch_model.bin")
            && e.contains("arbitrary code")
            && e.contains("safe_serialization"),
        "{e}"
    );

    // Another architecture is refused by name.
    let llama = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "model.safetensors"] {
        std::fs::copy(fixture("tied").join(f), llama.path().join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(fixture("tied").join("config.json"))
        .unwrap()
        .replace("\"qwen3\"", "\"llama\"");
    std::fs::write(llama.path().join("config.json"), cfg).unwrap();
    let e = err(llama.path());
    assert!(e.contains("config.json") && e.contains("\"llama\""), "{e}");

    // A shard named in the index but absent.
    let sharded = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("untied-gqa3")).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name != "model-00002-of-00004.safetensors" && name != "model.f16.safetensors" {
            std::fs::copy(&p, sharded.path().join(&name)).unwrap();
        }
    }
    let e = err(sharded.path());
    assert!(e.contains("model-00002-of-00004.safetensors"), "{e}");

    let e = err(Path::new("/nonexistent/model/dir"));
    assert!(e.contains("no such folder"), "{e}");
}

#[test]
fn saved_model_reloads_identically_in_hf_layout() {
    for name in ["tied", "untied-gqa3"] {
        let m = load(fixture(name).to_str().unwrap()).unwrap();
        let out = tempfile::tempdir().unwrap();
        m.save(out.path()).unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "decision.json",
        ] {
            assert!(out.path().join(f).is_file(), "{name}: {f} not written");
        }
        let back = load(out.path().to_str().unwrap()).unwrap();
        assert_eq!(back.config, m.config);
        assert_eq!(back.spec, m.spec);
        let a: Vec<HfTensor> = m.hf_tensors().collect();
        let b: Vec<HfTensor> = back.hf_tensors().collect();
        assert_eq!(a, b, "{name}: weights changed in a save/load round trip");
        // Same names and shapes as the checkpoint transformers wrote.
        let orig = weights::weight_files(&fixture(name)).unwrap();
        let ckpt = weights::SafetensorsDir::open_files(&orig).unwrap();
        for t in &a {
            assert_eq!(
                ckpt.shape(&t.name).as_ref(),
                Some(&t.shape),
                "{name}: {}",
                t.name
            );
        }
        let text = "Decision: tool";
        assert_eq!(last_logits(&m, text), last_logits(&back, text));

        // bf16 on disk: loads, and the logits stay close.
        let half = tempfile::tempdir().unwrap();
        m.save_as(half.path(), SaveDtype::BF16).unwrap();
        let hb = load(half.path().to_str().unwrap()).unwrap();
        let (full, bf16) = (last_logits(&m, text), last_logits(&hb, text));
        assert_eq!(full.len(), bf16.len());
        let d = full
            .iter()
            .zip(bf16)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(d < 0.2, "{name}: bf16 copy differs by {d}");
    }
}

/// Lay out a Hugging Face cache entry for `repo` at `commit` holding the tied fixture.
fn hub_cache(root: &Path, repo: &str, commit: &str, branch: &str) {
    let base = root.join(format!("models--{}", repo.replace('/', "--")));
    let snap = base.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(base.join("blobs")).unwrap();
    std::fs::create_dir_all(base.join("refs")).unwrap();
    std::fs::write(base.join("refs").join(branch), commit).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        // As the cache does: the content lives in blobs/, the snapshot entry links to it.
        let blob = base.join("blobs").join(format!("blob-{f}"));
        std::fs::copy(fixture("tied").join(f), &blob).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(format!("blob-{f}")),
            snap.join(f),
        )
        .unwrap();
        // Where links are not to be had (Windows without developer mode) the cache holds a copy
        #[cfg(not(unix))]
        std::fs::copy(&blob, snap.join(f)).unwrap();
    }
}

#[test]
fn hub_ids_resolve_through_the_standard_cache_offline() {
    let cache = tempfile::tempdir().unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    hub_cache(cache.path(), "tiny-org/tiny-qwen3", commit, "main");
    let env = HubEnv {
        cache_dir: cache.path().to_path_buf(),
        offline: true,
        endpoint: None,
        token: None,
    };
    let opts = LoadOptions {
        hub: Some(env),
        ..Default::default()
    };

    let by_branch = DecisionModel::load("tiny-org/tiny-qwen3", &opts).unwrap();
    assert_eq!(by_branch.origin, "tiny-org/tiny-qwen3@main");
    let by_commit = DecisionModel::load(&format!("tiny-org/tiny-qwen3@{commit}"), &opts).unwrap();
    let local = load(fixture("tied").to_str().unwrap()).unwrap();
    assert_eq!(
        last_logits(&by_branch, "Decision: tool"),
        last_logits(&local, "Decision: tool")
    );
    assert_eq!(
        last_logits(&by_commit, "Decision: tool"),
        last_logits(&local, "Decision: tool")
    );

    let e = format!(
        "{:#}",
        DecisionModel::load("tiny-org/tiny-qwen3@v2", &opts)
            .err()
            .unwrap()
    );
    assert!(e.contains("HF_HUB_OFFLINE") && e.contains("\"v2\""), "{e}");
    let e = format!(
        "{:#}",
        DecisionModel::load("tiny-org/absent", &opts).err().unwrap()
    );
    assert!(e.contains("not in the cache"), "{e}");
}

/// What we save is what transformers loads: scripts/check_saved_qwen3.py opens each saved copy
/// with `AutoModelForCausalLM.from_pretrained` (no missing or unexpected weights) and matches its
/// logits to the fixture's expected.json within 1e-4. Needs torch + transformers, which CI does
/// not install (NOT RUN there): `python3 -m venv ref && ref/bin/pip install -r
/// scripts/requirements-model.txt`, then `DECISION_PYTHON=ref/bin/python cargo test -p
/// decision-train --test loading`.
#[test]
fn transformers_loads_what_we_save() {
    let py = match checkers::transformers_python() {
        Ok(py) => py,
        Err(why) => {
            checkers::not_run(
                "transformers_loads_what_we_save",
                "transformers",
                &format!(
                    "{why}; set DECISION_PYTHON to a Python with scripts/requirements-model.txt"
                ),
            );
            return;
        }
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check_saved_qwen3.py");
    for name in ["tied", "untied-gqa3"] {
        let m = load(fixture(name).to_str().unwrap()).unwrap();
        let out = tempfile::tempdir().unwrap();
        m.save(out.path()).unwrap();
        let run = std::process::Command::new(&py)
            .arg(&script)
            .arg(out.path())
            .args(["--case", name])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        eprintln!("{name}: {}", text.trim());
        assert!(
            run.status.success(),
            "{name}: transformers refused our save: {text}"
        );
    }
}
