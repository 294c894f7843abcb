//! `decision eval`: metrics of a model on states, overall and per group, the option-order flip
//! rate, shadow receipts for `decision fit`, and the side-by-side comparison with a baseline.
//!
//! Probabilities use the model's own temperatures (`decision.json`). The groups are the
//! decision point, `after_error`, `rules`, and — for states made by `decision gen states` —
//! whether the rule change between v1 and v2 touches the state.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use decision_data::{Split, SplitRatios, State};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::data_order::{mix_seed, permuted};
use crate::decision_model::{DecisionModel, LoadOptions};
use crate::loss::{LossWeights, state_loss};
use crate::metrics::{Metrics, Report, ScoredState, flips, metrics, share};

/// `decision eval`
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  decision eval --run runs/tiny-v1 --data demo-out/v1.parquet --split test\n  \
decision eval --run runs/tiny-v2 --data v2.parquet --split test --baseline runs/tiny-v1 --permutations 2\n  \
decision eval --model Qwen/Qwen3-0.6B --data states.jsonl --receipts receipts.jsonl"
)]
pub struct EvalArgs {
    /// A run folder of ours (its final/ model; its validation states when --data is absent).
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    pub run: Option<PathBuf>,
    /// A model folder or Hub id (`owner/name[@revision]`).
    #[arg(long)]
    pub model: Option<String>,
    /// States to evaluate (Parquet/JSON Lines file or folder); required with --model.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Which split of --data to evaluate: all, train, valid or test.
    #[arg(long, default_value = "all")]
    pub split: String,
    /// Write one shadow receipt per state here (contracts section 3), for `decision fit`.
    #[arg(long)]
    pub receipts: Option<PathBuf>,
    /// Evaluate this run folder or model on the same states and show both side by side.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Extra random candidate orders per state for the flip rate (0 = skip).
    #[arg(long, default_value_t = 0)]
    pub permutations: usize,
    /// Seed of the candidate orders for the flip rate.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Write the metrics as JSON here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Name for the receipts' `model` field (default: the run's name, or the model source).
    #[arg(long)]
    pub name: Option<String>,
}

/// The JSON `--report` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    pub schema: String,
    pub model: String,
    pub data: String,
    pub split: String,
    pub report: Report,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Box<EvalReport>>,
}

/// A model to evaluate: a run folder (its `final/`) or a model source.
pub struct Loaded {
    pub dm: DecisionModel,
    pub name: String,
    /// For runs: the run config.
    pub run: Option<crate::run_config::RunConfig>,
}

/// Load `src`: a run folder of ours (has `run.toml` and `final/`) or a model folder / Hub id.
/// `flag` is what the user gave it as (`--run`, `--model`, `--baseline`), for messages.
pub fn load_model_or_run(flag: &str, src: &str, backend: Backend) -> Result<Loaded> {
    let p = Path::new(src);
    let label = format!("{flag} {src}");
    let opts = LoadOptions {
        backend,
        ..Default::default()
    };
    if p.join("run.toml").is_file() {
        let text = std::fs::read_to_string(p.join("run.toml"))?;
        let cfg = crate::run_config::RunConfig::parse(&text, &[])
            .with_context(|| format!("{}/run.toml", p.display()))?;
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

/// Raw option logits of every state (temperature 1), in input order; refused, naming the
/// state, when a state's logits are not finite (they would make receipts `fit` rejects).
pub fn score_states(
    dm: &DecisionModel,
    states: &[State],
    batch_size: usize,
) -> Result<Vec<ScoredState>> {
    let encoded = states
        .iter()
        .map(|s| dm.encode(s))
        .collect::<Result<Vec<_>>>()?;
    let logits =
        crate::score::logits_in_batches(&dm.model, &encoded, dm.pad_id, batch_size, &mut |_| {});
    crate::score::check_finite(&logits, &|i| format!("state {:?}", states[i].id))
        .with_context(|| dm.origin.clone())?;
    Ok(states
        .iter()
        .zip(logits)
        .map(|(s, l)| ScoredState {
            id: s.id.clone(),
            point: s.point.clone(),
            after_error: s.after_error,
            rules: s.rules.clone(),
            logits: l.into_iter().map(|x| x as f32).collect(),
            answer: s.answer_index().unwrap_or(usize::MAX),
        })
        .collect())
}

/// Mean training loss (contract section 2) of labelled states at temperature 1.
pub fn mean_loss(scored: &[ScoredState], states: &[State], w: LossWeights) -> f64 {
    let mut sum = 0.0;
    let mut n = 0usize;
    for (sc, st) in scored.iter().zip(states) {
        if sc.answer == usize::MAX {
            continue;
        }
        let teacher: Option<Vec<f32>> = st
            .teacher
            .as_ref()
            .map(|t| t.iter().map(|&x| x as f32).collect());
        sum += state_loss(&sc.logits, sc.answer, teacher.as_deref(), w);
        n += 1;
    }
    sum / n.max(1) as f64
}

/// Share of states whose pick changes under `k` other random candidate orders.
pub fn flip_rate(
    dm: &DecisionModel,
    states: &[State],
    k: usize,
    seed: u64,
    batch_size: usize,
) -> Result<f64> {
    Ok(share(&flipped(dm, states, k, seed, batch_size)?))
}

/// For each state, whether its pick changes under `k` other random candidate orders.
pub fn flipped(
    dm: &DecisionModel,
    states: &[State],
    k: usize,
    seed: u64,
    batch_size: usize,
) -> Result<Vec<bool>> {
    if states.is_empty() || k == 0 {
        return Ok(vec![false; states.len()]);
    }
    let pick = |s: &ScoredState| decision_data::stats::first_max(&s.probs(1.0));
    let original: Vec<usize> = score_states(dm, states, batch_size)?
        .iter()
        .map(pick)
        .collect();
    let mut permuted_picks: Vec<Vec<usize>> = vec![Vec::with_capacity(k); states.len()];
    for round in 0..k {
        let orders: Vec<Vec<usize>> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut o: Vec<usize> = (0..s.candidates.len()).collect();
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(
                    seed,
                    0xf11b + round as u64,
                    i as u64,
                ));
                o.shuffle(&mut rng);
                o
            })
            .collect();
        let shown: Vec<State> = states
            .iter()
            .zip(&orders)
            .map(|(s, o)| permuted(s, o))
            .collect();
        let scored = score_states(dm, &shown, batch_size)?;
        for (i, sc) in scored.iter().enumerate() {
            permuted_picks[i].push(orders[i][pick(sc)]);
        }
    }
    Ok(flips(&original, &permuted_picks))
}

/// The states of `path` in `split` (`all` = every row). A row's split is its own `split`
/// field, or the hash of its task id.
pub fn states_of_split(path: &Path, split: &str) -> Result<Vec<State>> {
    let states = crate::data_order::load_states(path, 64, None)?;
    if split == "all" {
        return Ok(states);
    }
    let want = Split::parse(split)
        .with_context(|| format!("--split {split}: expected all, train, valid or test"))?;
    let ratios = SplitRatios::default();
    Ok(states
        .into_iter()
        .filter(|s| ratios.split_of(s) == want)
        .collect())
}

/// The full report of a model on labelled states: groups, rule-change group, flip rate.
pub fn evaluate(
    dm: &DecisionModel,
    states: &[State],
    permutations: usize,
    seed: u64,
    batch_size: usize,
) -> Result<(Report, Vec<ScoredState>)> {
    let scored = score_states(dm, states, batch_size)?;
    let temp = |s: &ScoredState| dm.temperature(&s.point) as f32;
    let labelled: Vec<ScoredState> = scored
        .iter()
        .filter(|s| s.answer != usize::MAX)
        .cloned()
        .collect();
    let mut report = Report::new(&labelled, &temp);
    let groups: Vec<Option<&str>> = states
        .iter()
        .map(decision_data::r#gen::rule_change_group)
        .collect();
    if groups.iter().any(Option::is_some) {
        for name in ["touched", "untouched", "diverged"] {
            let group: Vec<&ScoredState> = scored
                .iter()
                .zip(&groups)
                .filter(|(s, g)| s.answer != usize::MAX && **g == Some(name))
                .map(|(s, _)| s)
                .collect();
            if !group.is_empty() {
                report
                    .by_rule_change
                    .insert(name.to_string(), metrics(group, &temp));
            }
        }
    }
    if permutations > 0 {
        let labelled_states: Vec<State> = states
            .iter()
            .filter(|s| s.answer.is_some())
            .cloned()
            .collect();
        let flags = flipped(dm, &labelled_states, permutations, seed, batch_size)?;
        report.flip_rate = Some(share(&flags));
        let mut by_point: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
        for (s, f) in labelled_states.iter().zip(&flags) {
            by_point.entry(s.point.as_str()).or_default().push(*f);
        }
        report.flip_rate_by_point = by_point
            .into_iter()
            .map(|(p, f)| (p.to_string(), share(&f)))
            .collect();
    }
    Ok((report, scored))
}

fn rows(r: &Report) -> Vec<(String, Metrics)> {
    let mut out = vec![("overall".to_string(), r.overall)];
    out.extend(r.by_point.iter().map(|(k, m)| (format!("point={k}"), *m)));
    out.extend(
        r.by_after_error
            .iter()
            .map(|(k, m)| (format!("after_error={k}"), *m)),
    );
    out.extend(r.by_rules.iter().map(|(k, m)| (format!("rules={k}"), *m)));
    out.extend(
        r.by_rule_change
            .iter()
            .map(|(k, m)| (format!("rule_change={k}"), *m)),
    );
    out
}

/// The metrics table as text.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "{:<24} {:>6} {:>9} {:>8} {:>8} {:>8}\n",
        "group", "n", "accuracy", "nll", "brier", "ece"
    );
    for (name, m) in rows(r) {
        s += &format!(
            "{name:<24} {:>6} {:>9.4} {:>8.4} {:>8.4} {:>8.4}\n",
            m.n, m.accuracy, m.nll, m.brier, m.ece
        );
    }
    if let Some(f) = r.flip_rate {
        let points: Vec<String> = r
            .flip_rate_by_point
            .iter()
            .map(|(p, x)| format!("{p} {x:.4}"))
            .collect();
        s += &format!(
            "flip rate (option order)  {f:.4}  ({})\n",
            points.join(", ")
        );
    }
    s
}

/// New against baseline: accuracy and ECE of both and the differences.
pub fn comparison(new: &Report, base: &Report) -> String {
    let mut s = format!(
        "{:<24} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}\n",
        "group", "n", "acc new", "acc base", "Δacc", "ece new", "ece base", "Δece"
    );
    let base_rows: BTreeMap<String, Metrics> = rows(base).into_iter().collect();
    for (name, m) in rows(new) {
        let Some(b) = base_rows.get(&name) else {
            continue;
        };
        s += &format!(
            "{name:<24} {:>6} {:>9.4} {:>9.4} {:>+8.4} {:>8.4} {:>8.4} {:>+8.4}\n",
            m.n,
            m.accuracy,
            b.accuracy,
            m.accuracy - b.accuracy,
            m.ece,
            b.ece,
            m.ece - b.ece
        );
    }
    if let (Some(a), Some(b)) = (new.flip_rate, base.flip_rate) {
        s += &format!("flip rate  new {a:.4}  base {b:.4}  Δ {:+.4}\n", a - b);
    }
    s
}

pub fn run(args: &EvalArgs) -> Result<std::process::ExitCode> {
    let (flag, src) = match (&args.run, &args.model) {
        (Some(r), _) => ("--run", r.to_string_lossy().into_owned()),
        (None, Some(m)) => ("--model", m.clone()),
        (None, None) => bail!("give --run RUN_DIR or --model SRC"),
    };
    // Nothing written may land on what is read (the states above all).
    let mut io = decision_data::paths::IoCheck::new();
    crate::cli::model_or_run_inputs(&mut io, flag, Path::new(&src));
    if let Some(b) = &args.baseline {
        crate::cli::model_or_run_inputs(&mut io, "--baseline", Path::new(b));
    }
    if let Some(d) = &args.data {
        io.input("--data", d);
    }
    if let Some(r) = &args.receipts {
        io.output_file("--receipts", r);
    }
    if let Some(r) = &args.report {
        io.output_file("--report", r);
    }
    io.check()?;
    if let Some(r) = &args.receipts
        && matches!(
            decision_data::Format::from_path(r),
            Ok(decision_data::Format::Parquet)
        )
    {
        bail!(
            "--receipts {}: eval writes shadow receipts as JSON Lines; name the file .jsonl \
             (decision fit reads both formats)",
            r.display()
        );
    }
    // Every output is opened now, so one that cannot be written stops eval before the model is
    // loaded; nothing lands unless the whole evaluation succeeds.
    let mut staged = decision_data::outputs::Staged::new();
    let receipts_file = match &args.receipts {
        Some(r) => Some(staged.file("--receipts", r)?),
        None => None,
    };
    let report_file = match &args.report {
        Some(r) => Some(staged.file("--report", r)?),
        None => None,
    };
    let loaded = load_model_or_run(flag, &src, args.backend)?;
    let (states, data_name) = match (&args.data, &loaded.run) {
        (Some(d), _) => (states_of_split(d, &args.split)?, d.display().to_string()),
        (None, Some(cfg)) => {
            let (_, valid) = crate::data_order::load_run_states(cfg, Path::new(&src))?;
            (valid, "the run's validation states".to_string())
        }
        (None, None) => bail!("{flag} {src} is not a run folder (no run.toml): give --data STATES"),
    };
    if states.is_empty() {
        bail!(
            "no states to evaluate in {data_name} (split {})",
            args.split
        );
    }
    let show = std::io::stderr().is_terminal();
    if show {
        eprintln!(
            "evaluating {} on {} states of {data_name}",
            loaded.name,
            states.len()
        );
    }
    let (report, scored) = evaluate(
        &loaded.dm,
        &states,
        args.permutations,
        args.seed,
        args.batch_size,
    )?;
    let name = args.name.clone().unwrap_or_else(|| loaded.name.clone());
    let mut out = EvalReport {
        schema: "decision-eval/1".into(),
        model: name.clone(),
        data: data_name.clone(),
        split: args.split.clone(),
        report: report.clone(),
        baseline: None,
    };
    println!("{name} on {data_name} (split {}):", args.split);
    print!("{}", table(&report));
    if let Some(b) = &args.baseline {
        let base = load_model_or_run("--baseline", b, args.backend)?;
        let (base_report, _) = evaluate(
            &base.dm,
            &states,
            args.permutations,
            args.seed,
            args.batch_size,
        )?;
        println!("\n{name} against baseline {}:", base.name);
        print!("{}", comparison(&report, &base_report));
        out.baseline = Some(Box::new(EvalReport {
            schema: "decision-eval/1".into(),
            model: base.name,
            data: data_name.clone(),
            split: args.split.clone(),
            report: base_report,
            baseline: None,
        }));
    }
    let mut wrote = None;
    if let (Some(path), Some(slot)) = (&args.receipts, receipts_file) {
        let at = crate::receipts::now_rfc3339();
        let receipts: Vec<_> = states
            .iter()
            .zip(&scored)
            .map(|(st, sc)| {
                crate::receipts::shadow_receipt(
                    st,
                    &sc.probs(loaded.dm.temperature(&st.point) as f32),
                    &name,
                    &at,
                )
            })
            .collect();
        crate::receipts::write_receipts_to(staged.get(slot), &receipts)?;
        wrote = Some((receipts.len(), path));
    }
    if let Some(slot) = report_file {
        let mut json = serde_json::to_vec_pretty(&out)?;
        json.push(b'\n');
        std::io::Write::write_all(staged.get(slot), &json)?;
    }
    staged.publish()?;
    if let Some((n, path)) = wrote {
        println!("wrote {n} shadow receipts to {}", path.display());
    }
    Ok(std::process::ExitCode::SUCCESS)
}
