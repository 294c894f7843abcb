//! A run folder (`decision train --out RUN_DIR`, laid out in [`crate::trainer`]) as the other
//! jobs read it: eval, export and sim take "a run folder or a model" ([`load`]), check that
//! nothing they write lands on what that reads ([`inputs`]), and read the run's config and its
//! validation states ([`config`], [`validation_states`]).

use std::path::Path;

use anyhow::{Context, Result, bail};
use decision_data::State;
use decision_data::paths::IoCheck;

use crate::model::backend::Backend;
use crate::model::decision_model::{DecisionModel, LoadOptions};
use crate::run_config::RunConfig;

/// What reading `src` (a run folder of ours, a model folder, or a Hub id) reads, as inputs of
/// `io` given as `flag`: for a run folder its `run.toml`, its `final/` model and the states its
/// config names (not the whole folder: receipts or a bundle may be written beside them); for a
/// model folder the folder. A Hub id reads nothing local.
pub fn inputs(io: &mut IoCheck, flag: &str, src: &Path) {
    let run_toml = src.join("run.toml");
    if run_toml.is_file() {
        io.input(flag, &run_toml).input(flag, src.join("final"));
        if let Ok(cfg) = RunConfig::load(&run_toml, &[]) {
            io.input(&format!("{flag}'s data.train"), &cfg.data.train);
            if let Some(v) = &cfg.data.valid {
                io.input(&format!("{flag}'s data.valid"), v);
            }
        }
    } else if src.exists() {
        io.input(flag, src);
    }
}

/// A model to evaluate or export: a run folder (its `final/`) or a model source.
pub struct Loaded {
    pub dm: DecisionModel,
    pub name: String,
    /// For runs: the run config.
    pub run: Option<RunConfig>,
}

/// Load `src`: a run folder of ours (has `run.toml` and `final/`) or a model folder / Hub id.
/// `flag` is what the user gave it as (`--run`, `--model`, `--baseline`), for messages.
pub fn load(flag: &str, src: &str, backend: Backend) -> Result<Loaded> {
    let p = Path::new(src);
    let label = format!("{flag} {src}");
    let opts = LoadOptions {
        backend,
        ..Default::default()
    };
    if p.join("run.toml").is_file() {
        let cfg = config(p)?;
        let fin = p.join("final");
        if !fin.is_dir() {
            bail!(
                "{}: the run has no final/ model yet (still training, or stopped: `decision train --resume`)",
                p.display()
            );
        }
        let dm =
            DecisionModel::load_as(&format!("{label}: final/"), &fin.to_string_lossy(), &opts)?;
        return Ok(Loaded {
            dm,
            name: cfg.name.clone(),
            run: Some(cfg),
        });
    }
    if flag == "--run" && !p.is_dir() {
        bail!("{label}: no such folder (a run folder written by `decision train --out`)");
    }
    let dm = DecisionModel::load_as(&label, src, &opts)?;
    Ok(Loaded {
        dm,
        name: src.to_string(),
        run: None,
    })
}

/// The run's config (`RUN_DIR/run.toml`).
pub fn config(run: &Path) -> Result<RunConfig> {
    let run_toml = run.join("run.toml");
    RunConfig::load(&run_toml, &[])
        .with_context(|| format!("{}: the run's config", run_toml.display()))
}

/// The run's validation states, as training read them; bad rows (under `[data] skip_bad`) are
/// quarantined in `scratch`, never in the run folder.
pub fn validation_states(cfg: &RunConfig, scratch: &Path) -> Result<Vec<State>> {
    Ok(crate::data_order::load_run_states(cfg, scratch)?.1)
}
