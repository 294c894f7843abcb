//! Receipts and thresholds in object storage, for `decision fit`: `s3://`, `gs://`, `az://`
//! (and the other spellings object_store knows: `s3a://`, `abfs://`, `https://<account>.blob…`)
//! and plain `https://` URLs, through the `object_store` crate.
//!
//! * A URL names one object, or (ending in `/`, or without a file extension) a prefix: its
//!   shards are the objects directly under it that the caller keeps (name order), as a local
//!   folder's are.
//! * [`Store::fetch`] copies an object into a local file and checks its length: a connection
//!   that drops mid-object is retried (object_store resumes with ranges) and, if it keeps
//!   dropping, an error that names the URL; the partial file is removed.
//! * [`Store::put`] writes only if the object is still as [`Store::version`] saw it (absent, or
//!   the same ETag): a conditional put, so a concurrent writer is never overwritten silently.
//!
//! Credentials come from where each cloud's own tools look: the environment (`AWS_*`,
//! `GOOGLE_*`, `AZURE_*`), the AWS profile files (`~/.aws/credentials` and `~/.aws/config`,
//! `AWS_PROFILE`; read here, since object_store does not), the gcloud application-default file,
//! and instance metadata. None of them is ever printed: errors name URLs, not keys.

mod profile;

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode,
    PutOptions, PutPayload, RetryConfig, UpdateVersion,
};
use url::Url;

/// Whether `s` is a URL this crate reads (anything else is a local path).
pub fn is_url(s: &str) -> bool {
    const SCHEMES: [&str; 10] = [
        "s3://", "s3a://", "gs://", "az://", "adl://", "azure://", "abfs://", "abfss://",
        "http://", "https://",
    ];
    let lower = s.to_ascii_lowercase();
    SCHEMES.iter().any(|p| lower.starts_with(p))
}

/// One object found under a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub url: String,
    pub size: u64,
}

/// What an object was when a run started: absent, or this version. [`Store::put`] writes only
/// over the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(Option<UpdateVersion>);

impl Version {
    pub fn absent(&self) -> bool {
        self.0.is_none()
    }
}

/// Connections to the stores named so far (one per bucket / host) and the runtime their
/// requests run on.
pub struct Store {
    rt: tokio::runtime::Runtime,
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// S3 settings given in code, over the environment's (`aws_endpoint`, `aws_access_key_id`, …).
    s3: Vec<(String, String)>,
}

/// Retries: a handful, quickly (a dropped connection or a 5xx), then a clear error.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 4,
        retry_timeout: Duration::from_secs(120),
    }
}

impl Store {
    pub fn new() -> Result<Store> {
        Store::with_s3_config(&[])
    }

    /// A store whose S3 connections take these settings (object_store's `AmazonS3ConfigKey`
    /// names, e.g. `aws_endpoint`, `aws_access_key_id`, `aws_allow_http`) over the environment's.
    pub fn with_s3_config(settings: &[(&str, &str)]) -> Result<Store> {
        // rustls on ring (see the workspace Cargo.toml); a second call finds it installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime for object storage")?;
        Ok(Store {
            rt,
            stores: Mutex::new(HashMap::new()),
            s3: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    /// The store behind `url` and the object key (or prefix) it names.
    fn open(&self, url: &str) -> Result<(Arc<dyn ObjectStore>, Key)> {
        let parsed = Url::parse(url).with_context(|| format!("{url}: not a URL"))?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed)
            .map_err(|e| anyhow!("{url}: not an object-store URL ({e})"))?;
        let key = Key::parse(path).map_err(|e| anyhow!("{url}: bad object key ({e})"))?;
        let base = format!("{}://{}", parsed.scheme(), parsed.authority());
        let mut stores = self.stores.lock().expect("no panics while held");
        if let Some(s) = stores.get(&base) {
            return Ok((s.clone(), key));
        }
        let http = ClientOptions::new().with_allow_http(parsed.scheme() == "http");
        let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
            ObjectStoreScheme::AmazonS3 => {
                let mut b = profile::aws(AmazonS3Builder::from_env()).with_url(url);
                for (k, v) in &self.s3 {
                    let key = k.parse().map_err(|e| anyhow!("S3 setting {k}: {e}"))?;
                    b = b.with_config(key, v);
                }
                b.with_retry(retry()).build().map(|s| Arc::new(s) as _)
            }
            ObjectStoreScheme::GoogleCloudStorage => GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry())
                .build()
                .map(|s| Arc::new(s) as _),
            ObjectStoreScheme::MicrosoftAzure => MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry())
                .build()
                .map(|s| Arc::new(s) as _),
            ObjectStoreScheme::Http => HttpBuilder::new()
                .with_url(base.clone())
                .with_client_options(http)
                .with_retry(retry())
                .build()
                .map(|s| Arc::new(s) as _),
            other => bail!("{url}: {other:?} is not an object store this reads"),
        };
        let store = built.map_err(|e| anyhow!("{url}: cannot connect: {e}"))?;
        stores.insert(base, store.clone());
        Ok((store, key))
    }

    /// The objects `url` names: itself, or, for a prefix (ending in `/` or with no extension
    /// in its last segment), the objects directly under it whose names `keep` accepts, in name
    /// order (names starting with `.` are skipped, as hidden files are in a folder).
    pub fn list(&self, url: &str, keep: &dyn Fn(&str) -> bool) -> Result<Vec<Object>> {
        let (store, key) = self.open(url)?;
        let last = url.rsplit('/').next().unwrap_or_default();
        if !url.ends_with('/') && last.contains('.') {
            let meta = self
                .rt
                .block_on(store.head(&key))
                .map_err(|e| explain(url, "reading", e))?;
            return Ok(vec![Object {
                url: url.to_string(),
                size: meta.size,
            }]);
        }
        let listing = self
            .rt
            .block_on(store.list_with_delimiter(Some(&key)))
            .map_err(|e| explain(url, "listing", e))?;
        let root = url.trim_end_matches('/');
        let mut found: Vec<Object> = listing
            .objects
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?.to_string();
                (!name.starts_with('.') && keep(&name)).then(|| Object {
                    url: format!("{root}/{name}"),
                    size: m.size,
                })
            })
            .collect();
        found.sort_by(|a, b| a.url.cmp(&b.url));
        if found.is_empty() {
            bail!("{url}: no shard directly under this prefix");
        }
        Ok(found)
    }

    /// Copy the object at `url` into a new file `dest`; returns its bytes. On any error `dest`
    /// is removed.
    pub fn fetch(&self, url: &str, dest: &Path) -> Result<u64> {
        let (store, key) = self.open(url)?;
        self.rt.block_on(fetch_one(store, key, url, dest))
    }

    /// [`Store::fetch`] of every `(url, dest)`, `parallel` at a time (one stream per object
    /// is far below what a bucket serves); `done` is told each object's bytes as it lands. The
    /// first error stops the rest; every file already written stays for the caller to remove.
    pub fn fetch_all(
        &self,
        objects: &[(String, std::path::PathBuf)],
        parallel: usize,
        done: &dyn Fn(u64),
    ) -> Result<()> {
        let mut jobs = Vec::with_capacity(objects.len());
        for (url, dest) in objects {
            let (store, key) = self.open(url)?;
            jobs.push(fetch_one(store, key, url, dest));
        }
        self.rt.block_on(async {
            let mut results = futures::stream::iter(jobs).buffered(parallel.max(1));
            while let Some(r) = results.next().await {
                done(r?);
            }
            Ok(())
        })
    }

    /// The object's version now: absent, or its ETag (and version id where the store has one).
    pub fn version(&self, url: &str) -> Result<Version> {
        let (store, key) = self.open(url)?;
        match self.rt.block_on(store.head(&key)) {
            Ok(m) => Ok(Version(Some(UpdateVersion {
                e_tag: m.e_tag,
                version: m.version,
            }))),
            Err(object_store::Error::NotFound { .. }) => Ok(Version(None)),
            Err(e) => Err(explain(url, "reading", e)),
        }
    }

    /// Write `bytes` at `url` if the object is still what `expected` says (absent, or that
    /// version); otherwise an error, and the object is left as the other writer left it.
    pub fn put(&self, url: &str, bytes: Vec<u8>, expected: &Version) -> Result<()> {
        let (store, key) = self.open(url)?;
        let mode = match &expected.0 {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v.clone()),
        };
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        match self
            .rt
            .block_on(store.put_opts(&key, PutPayload::from(bytes), opts))
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => bail!(
                "{url}: another writer changed it while this run was going (it was {} when the \
                 run started); not overwritten",
                if expected.absent() { "absent" } else { "there" }
            ),
            Err(e) => Err(explain(url, "writing", e)),
        }
    }
}

/// One object into a new file `dest`, its length checked; `dest` removed on any error.
async fn fetch_one(store: Arc<dyn ObjectStore>, key: Key, url: &str, dest: &Path) -> Result<u64> {
    let result: Result<u64> = async {
        let got = store
            .get(&key)
            .await
            .map_err(|e| explain(url, "reading", e))?;
        let expected = got.meta.size;
        let mut out =
            File::create_new(dest).with_context(|| format!("creating {}", dest.display()))?;
        let mut stream = got.into_stream();
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                anyhow!("{url}: the connection failed after {n} of {expected} bytes: {e}")
            })?;
            out.write_all(&chunk)
                .with_context(|| format!("writing {}", dest.display()))?;
            n += chunk.len() as u64;
        }
        if n != expected {
            bail!("{url}: the object ended after {n} of its {expected} bytes");
        }
        out.sync_all()
            .with_context(|| format!("writing {}", dest.display()))?;
        Ok(n)
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    result
}

/// An object_store error as one line that names the URL and what to check.
fn explain(url: &str, doing: &str, e: object_store::Error) -> anyhow::Error {
    let hint = match &e {
        object_store::Error::NotFound { .. } => " (no such object)",
        object_store::Error::Unauthenticated { .. } => {
            " (the credentials were refused: check AWS_* / GOOGLE_* / AZURE_* or the profile)"
        }
        object_store::Error::PermissionDenied { .. } => " (permission denied)",
        _ => "",
    };
    anyhow!("{doing} {url}{hint}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        for u in [
            "s3://b/receipts/2026-11/",
            "S3://b/k.parquet",
            "gs://b/x.jsonl",
            "az://c/x.jsonl",
            "https://example.org/r.jsonl",
        ] {
            assert!(is_url(u), "{u}");
        }
        for p in [
            "receipts/2026-11",
            "/tmp/s3:/x",
            "s3.parquet",
            "./https/x.jsonl",
        ] {
            assert!(!is_url(p), "{p}");
        }
    }

    #[test]
    fn a_url_that_is_no_store_is_refused_by_name() {
        let s = Store::new().unwrap();
        let e = s.list("file:///tmp/x/", &|_| true).unwrap_err().to_string();
        assert!(e.contains("file:///tmp/x/"), "{e}");
    }
}
