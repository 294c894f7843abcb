//! Where a model comes from: a local folder, or a Hugging Face Hub id with an optional
//! `@revision`, resolved through `hf-hub` and the standard cache (`HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `~/.cache/huggingface/hub`). With `HF_HUB_OFFLINE=1` only the cache is
//! read. Files already in the cache for the revision are used as they are (as `hf-hub` does).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::model::weights::{INDEX_FILE, SINGLE_FILE, read_index, refuse_pickle};

/// The Hub settings taken from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct HubEnv {
    pub cache_dir: PathBuf,
    pub offline: bool,
    pub endpoint: Option<String>,
    pub token: Option<String>,
}

impl HubEnv {
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`HubEnv::from_env`], reading variables through `var`.
    pub(crate) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Self {
        let set = |k: &str| var(k).filter(|v| !v.is_empty());
        let cache_dir =
            if let Some(c) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
                PathBuf::from(c)
            } else if let Some(home) = set("HF_HOME") {
                PathBuf::from(home).join("hub")
            } else {
                let home = set("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("."));
                let base = set("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| home.join(".cache"));
                base.join("huggingface").join("hub")
            };
        let truthy = |k: &str| {
            set(k).is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
            })
        };
        Self {
            cache_dir,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            endpoint: set("HF_ENDPOINT"),
            token: set("HF_TOKEN"),
        }
    }
}

/// A model folder on disk, wherever it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDir {
    pub dir: PathBuf,
    /// What the user named (`path` or `owner/name@revision`), for messages.
    pub origin: String,
}

/// A Hub reference `owner/name[@revision]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HubId {
    pub repo: String,
    pub revision: String,
}

impl HubId {
    pub fn parse(src: &str) -> Option<HubId> {
        let (repo, revision) = match src.split_once('@') {
            Some((r, rev)) if !rev.is_empty() => (r, rev.to_string()),
            Some(_) => return None,
            None => (src, "main".to_string()),
        };
        let ok_part = |p: &str| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        match repo.split_once('/') {
            Some((owner, name)) if ok_part(owner) && ok_part(name) => Some(HubId {
                repo: repo.to_string(),
                revision,
            }),
            _ => None,
        }
    }

    fn cache_folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

/// Files a model folder must have (weights are handled separately).
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Files a model folder may have.
const OPTIONAL: [&str; 2] = [decision_prompt::spec::FILE, "generation_config.json"];

/// Resolve `--model`: an existing folder, else a Hub id. Messages name the source as given; see
/// [`resolve_as`] to name the flag or key it came from.
pub fn resolve(src: &str, env: &HubEnv) -> Result<ModelDir> {
    resolve_as(src, src, env)
}

/// Does `src` name a local path rather than a Hub id? `./x`, `../x`, `/x`, `~/x`, `.`, `..`, a
/// Windows path, a trailing `/`, or `a/b` where the folder `a` exists here.
pub(crate) fn looks_like_path(src: &str) -> bool {
    let path = Path::new(src);
    src.starts_with(['.', '/', '~', '\\'])
        || src.contains('\\')
        || src.ends_with('/')
        || path.is_absolute()
        || (src.len() > 1 && src.as_bytes()[0].is_ascii_alphabetic() && src.as_bytes()[1] == b':')
        || path
            .parent()
            .is_some_and(|p| !p.as_os_str().is_empty() && p.is_dir())
}

/// As [`resolve`], with `label` (`--model X`, `--run X`, `model.source X`) leading every message.
pub fn resolve_as(label: &str, src: &str, env: &HubEnv) -> Result<ModelDir> {
    let path = Path::new(src);
    if path.is_dir() {
        return Ok(ModelDir {
            dir: path.to_path_buf(),
            origin: src.to_string(),
        });
    }
    if path.exists() {
        bail!(
            "{label}: is a file; give the model's folder (config.json, model.safetensors, tokenizer.json)"
        );
    }
    if looks_like_path(src) {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let why = match parent {
            Some(p) if !p.is_dir() => format!(" (nor does its parent folder {})", p.display()),
            _ => String::new(),
        };
        bail!(
            "{label}: no such folder: {src} does not exist{why}. A model is a local folder \
             (config.json, model.safetensors, tokenizer.json) or a Hub id owner/name[@revision]"
        );
    }
    let Some(id) = HubId::parse(src) else {
        bail!("{label}: no such folder, and not a Hub id of the form owner/name[@revision]");
    };
    if env.offline {
        resolve_cached(&id, env).with_context(|| {
            format!(
                "{label}: no local folder {src}, and as a Hub id: HF_HUB_OFFLINE is set and the \
                 model is not complete in the cache {}",
                env.cache_dir.display()
            )
        })
    } else {
        match resolve_cached(&id, env) {
            Ok(dir) => Ok(dir),
            Err(cached) => download(&id, env).with_context(|| {
                format!(
                    "{label}: no local folder {src}; as a Hub id it is not in the cache {} \
                     ({cached:#}) and fetching it from the Hub failed (offline? set \
                     HF_HUB_OFFLINE=1 to use only the cache)",
                    env.cache_dir.display()
                )
            }),
        }
    }
}

/// The snapshot folder of a revision in the cache: a branch or tag through `refs/`, or a commit.
fn snapshot_dir(id: &HubId, env: &HubEnv) -> Result<PathBuf> {
    let repo_dir = env.cache_dir.join(id.cache_folder());
    if !repo_dir.is_dir() {
        bail!(
            "{} is not in the cache ({} missing)",
            id.repo,
            repo_dir.display()
        );
    }
    let ref_file = repo_dir.join("refs").join(&id.revision);
    let commit = if ref_file.is_file() {
        std::fs::read_to_string(&ref_file)
            .with_context(|| format!("reading {}", ref_file.display()))?
            .trim()
            .to_string()
    } else {
        id.revision.clone()
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    if !snap.is_dir() {
        bail!(
            "revision {:?} of {} is not in the cache ({} missing)",
            id.revision,
            id.repo,
            snap.display()
        );
    }
    Ok(snap)
}

fn resolve_cached(id: &HubId, env: &HubEnv) -> Result<ModelDir> {
    let snap = snapshot_dir(id, env)?;
    for f in REQUIRED {
        if !snap.join(f).is_file() {
            bail!("{} has no {f}", snap.display());
        }
    }
    if snap.join(INDEX_FILE).is_file() {
        for shard in read_index(&snap.join(INDEX_FILE))? {
            if !snap.join(&shard).is_file() {
                bail!(
                    "{} lists shard {shard}, which is not in the cache",
                    INDEX_FILE
                );
            }
        }
    } else if !snap.join(SINGLE_FILE).is_file() {
        refuse_pickle(&snap)?;
        bail!("{} has no safetensors weights", snap.display());
    }
    Ok(ModelDir {
        dir: snap,
        origin: format!("{}@{}", id.repo, id.revision),
    })
}

fn download(id: &HubId, env: &HubEnv) -> Result<ModelDir> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};
    use std::io::IsTerminal;

    let mut builder = ApiBuilder::from_cache(Cache::new(env.cache_dir.clone()))
        .with_progress(std::io::stderr().is_terminal());
    if let Some(e) = &env.endpoint {
        builder = builder.with_endpoint(e.clone());
    }
    if env.token.is_some() {
        builder = builder.with_token(env.token.clone());
    }
    let api = builder.build().context("setting up the Hub client")?;
    let repo = api.repo(Repo::with_revision(
        id.repo.clone(),
        RepoType::Model,
        id.revision.clone(),
    ));
    let info = repo
        .info()
        .with_context(|| format!("looking up {}@{}", id.repo, id.revision))?;
    let files: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
    let has = |f: &str| files.iter().any(|x| x == f);
    let mut wanted: Vec<String> = Vec::new();
    for f in REQUIRED {
        if !has(f) {
            bail!("{}@{} has no {f}", id.repo, id.revision);
        }
        wanted.push(f.to_string());
    }
    wanted.extend(OPTIONAL.iter().filter(|f| has(f)).map(|f| f.to_string()));
    if has(INDEX_FILE) {
        let index = repo.get(INDEX_FILE)?;
        wanted.push(INDEX_FILE.to_string());
        wanted.extend(read_index(&index)?);
    } else if has(SINGLE_FILE) {
        wanted.push(SINGLE_FILE.to_string());
    } else if has("pytorch_model.bin") || has("pytorch_model.bin.index.json") {
        bail!(
            "{}@{} has only pickle weights (pytorch_model.bin). They are refused: loading one can \
             run arbitrary code. Pick a revision with safetensors, or convert with transformers' \
             save_pretrained(out, safe_serialization=True)",
            id.repo,
            id.revision
        );
    } else {
        bail!("{}@{} has no safetensors weights", id.repo, id.revision);
    }
    let mut dir = None;
    for f in &wanted {
        let path = repo.get(f).with_context(|| format!("downloading {f}"))?;
        dir.get_or_insert_with(|| path.parent().map(Path::to_path_buf).unwrap_or_default());
    }
    let dir = dir.context("nothing downloaded")?;
    Ok(ModelDir {
        dir,
        origin: format!("{}@{}", id.repo, id.revision),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hub_ids() {
        assert_eq!(
            HubId::parse("Qwen/Qwen3-4B"),
            Some(HubId {
                repo: "Qwen/Qwen3-4B".into(),
                revision: "main".into()
            })
        );
        assert_eq!(
            HubId::parse("Qwen/Qwen3-4B@abc123").unwrap().revision,
            "abc123"
        );
        assert_eq!(HubId::parse("Qwen3-4B"), None);
        assert_eq!(HubId::parse("a/b/c"), None);
        assert_eq!(HubId::parse("Qwen/Qwen3@"), None);
        assert_eq!(HubId::parse("../x"), None);
    }

    fn offline_empty_cache(dir: &Path) -> HubEnv {
        HubEnv {
            cache_dir: dir.join("cache"),
            offline: false,
            // Nothing listens here: a lookup that is tried fails at once instead of at DNS.
            endpoint: Some("http://127.0.0.1:9".into()),
            token: None,
        }
    }

    #[test]
    fn a_missing_local_path_is_not_tried_on_the_hub() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("runs")).unwrap();
        let env = offline_empty_cache(dir.path());
        let under = dir.path().join("runs/nope");
        let under = under.to_str().unwrap();
        for src in ["./nope", "/x/y", "../m", under, "no-such-dir/"] {
            let e = format!("{:#}", resolve_as("--run X", src, &env).unwrap_err());
            assert!(e.starts_with("--run X: no such folder"), "{src}: {e}");
            assert!(
                !e.contains("Hub failed") && !e.contains("cache"),
                "{src}: {e}"
            );
        }
        // The parent folder exists, relative to the current folder: `src/nope` here.
        assert!(looks_like_path("src/nope"));
        assert!(!looks_like_path("Qwen/Qwen3-4B"));
        let e = format!("{:#}", resolve_as("--model m", "/x/y", &env).unwrap_err());
        assert!(e.contains("its parent folder /x"), "{e}");
    }

    #[test]
    fn a_hub_id_missing_from_the_cache_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = offline_empty_cache(dir.path());
        env.offline = true;
        let e = format!("{:#}", resolve("tiny-org/absent", &env).unwrap_err());
        assert!(
            e.contains("HF_HUB_OFFLINE is set") && e.contains("not in the cache"),
            "{e}"
        );
        env.offline = false;
        let e = format!(
            "{:#}",
            resolve_as("--model x", "tiny-org/absent", &env).unwrap_err()
        );
        assert!(
            e.starts_with("--model x: no local folder tiny-org/absent")
                && e.contains("not in the cache")
                && e.contains("fetching it from the Hub failed"),
            "{e}"
        );
    }

    #[test]
    fn env_cache_location_and_offline() {
        let env = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            HubEnv::from_lookup(move |k| pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()))
        };
        assert_eq!(
            env(&[("HOME", "/h")]).cache_dir,
            PathBuf::from("/h/.cache/huggingface/hub")
        );
        assert_eq!(
            env(&[("HOME", "/h"), ("HF_HOME", "/hf")]).cache_dir,
            PathBuf::from("/hf/hub")
        );
        let e = env(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/c"),
            ("HF_HUB_OFFLINE", "1"),
        ]);
        assert_eq!(e.cache_dir, PathBuf::from("/c"));
        assert!(e.offline);
        assert!(!env(&[("HF_HUB_OFFLINE", "0")]).offline);
    }
}
