//! `decision fit` with URLs (decision-store): `--receipts` objects and prefixes and a
//! `--previous` object are fetched into a temporary folder first (memory stays flat; the disk
//! holds one month's shards while the fit runs), and read under their URLs: thresholds.json's
//! `source.files`, the quarantine's errors and every message name the URL. A `--out` URL is
//! fitted into the temporary folder, then put beside the URL, quarantine first and
//! thresholds.json last, each only if nobody else wrote it since the run started (a conditional
//! put): a concurrent refit is refused, never overwritten.
//!
//! [`Remote::fetch`] turns URL arguments into local ones (the fit itself never sees a URL);
//! [`Remote::publish`] puts what the fit wrote.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use decision_data::receipts_io::{Input, receipt_files};
use decision_data::states_io::Format;
use decision_store::{Store, Version, is_url};

use crate::cli::FitArgs;
use crate::outputs::quarantine_path;

/// Objects fetched at once.
const FETCH_PARALLEL: usize = 8;

fn url_of(p: &Path) -> Option<&str> {
    p.to_str().filter(|s| is_url(s))
}

/// Whether any of `decision fit`'s locations is a URL.
pub(crate) fn any_url(args: &FitArgs) -> bool {
    args.receipts.iter().any(|p| url_of(p).is_some())
        || url_of(&args.out).is_some()
        || args.previous.as_deref().and_then(url_of).is_some()
}

/// `dir/name` of a URL: the object beside it called `name`.
fn beside(url: &str, name: &str) -> String {
    match url.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{name}"),
        None => name.to_string(),
    }
}

fn file_name(url: &str) -> &str {
    url.rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("object")
}

/// URL arguments fetched into a temporary folder, and where the outputs go back to.
pub(crate) struct Remote {
    /// The arguments with every URL replaced by its local copy.
    pub local: FitArgs,
    /// The receipt files, each read under its URL.
    pub inputs: Vec<Input>,
    store: Store,
    /// (URL, local file, version seen before the run), quarantine first, thresholds.json last.
    uploads: Vec<(String, PathBuf, Version)>,
    _tmp: tempfile::TempDir,
}

impl Remote {
    /// Check the outputs' URLs, then fetch `--receipts` and `--previous` objects.
    pub fn fetch(args: &FitArgs) -> Result<Remote> {
        if let Some(r) = &args.report
            && url_of(r).is_some()
        {
            bail!(
                "--report {}: the report is written to a local folder",
                r.display()
            );
        }
        let store = Store::new()?;
        let tmp = tempfile::Builder::new()
            .prefix("decision-fit-")
            .tempdir()
            .context("creating a temporary folder for the fetched objects (TMPDIR)")?;

        // Where the outputs go, and what is there now (checked before anything is read).
        let out_url = url_of(&args.out).map(str::to_string);
        let uploads: Vec<(String, PathBuf, Version)> = match &out_url {
            None => Vec::new(),
            Some(url) => {
                if url.ends_with('/') {
                    bail!("--out {url}: name the thresholds object, e.g. {url}thresholds.json");
                }
                let local = tmp.path().join("out").join(file_name(url));
                let q = quarantine_path(&local);
                let e = decision_data::quarantine::errors_path(&q);
                let mut v = Vec::new();
                for l in [q, e, local] {
                    let u = beside(url, &l.file_name().expect("named").to_string_lossy());
                    let version = store.version(&u)?;
                    v.push((u, l, version));
                }
                v
            }
        };

        // The inputs, in the order given; objects fetched under their URLs, several at a time.
        let mut inputs = Vec::new();
        let mut wanted: Vec<(String, PathBuf)> = Vec::new();
        let mut total = 0u64;
        for p in &args.receipts {
            match url_of(p) {
                Some(url) => {
                    if out_url.as_deref() == Some(url) || uploads.iter().any(|(u, _, _)| u == url) {
                        bail!("--out would overwrite --receipts {url}");
                    }
                    let keep = |name: &str| Format::from_path(Path::new(name)).is_ok();
                    for o in store.list(url, &keep)? {
                        if Format::from_path(Path::new(file_name(&o.url))).is_err() {
                            bail!("{}: not a receipts file (.parquet, .jsonl or .json)", o.url);
                        }
                        let dest = tmp.path().join(format!(
                            "{:06}-{}",
                            wanted.len() + 1,
                            file_name(&o.url)
                        ));
                        total += o.size;
                        inputs.push(Input {
                            path: dest.clone(),
                            name: PathBuf::from(&o.url),
                        });
                        wanted.push((o.url, dest));
                    }
                }
                None => inputs.extend(
                    receipt_files(std::slice::from_ref(p))?
                        .into_iter()
                        .map(Input::local),
                ),
            }
        }
        let pb = decision_data::progress::bar(Some(total), "bytes fetched");
        store.fetch_all(&wanted, FETCH_PARALLEL, &|n| pb.inc(n))?;
        pb.finish_and_clear();
        let previous = match args.previous.as_deref().and_then(url_of) {
            None => args.previous.clone(),
            Some(url) => {
                let dest = tmp.path().join(format!("previous-{}", file_name(url)));
                store.fetch(url, &dest)?;
                Some(dest)
            }
        };

        let local = FitArgs {
            receipts: inputs.iter().map(|i| i.path.clone()).collect(),
            config: args.config.clone(),
            out: uploads
                .last()
                .map(|(_, l, _)| l.clone())
                .unwrap_or_else(|| args.out.clone()),
            previous,
            report: args.report.clone(),
        };
        Ok(Remote {
            local,
            inputs,
            store,
            uploads,
            _tmp: tmp,
        })
    }

    /// Put the fit's outputs to their URLs (each only if unchanged since [`Remote::fetch`]);
    /// the quarantine's URL when the outputs went to a URL.
    pub fn publish(&self) -> Result<Option<PathBuf>> {
        for (url, path, version) in &self.uploads {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            self.store.put(url, bytes, version)?;
        }
        Ok(self.uploads.first().map(|(url, _, _)| PathBuf::from(url)))
    }
}
