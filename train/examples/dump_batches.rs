//! Dump the exact training micro-batches `decision train` feeds the model, as JSON Lines, so a
//! reference implementation (scripts/check_learnability.py) can train on the very same
//! token ids, option labels and targets step by step.
//!
//!   cargo run -p decision-train --example dump_batches -- CONFIG STEPS OUT.jsonl [--set k=v ...]
//!
//! One line per micro-batch: {"step", "micro", "rows": [[ids...]...], "label_ids": [...],
//! "options": [k...], "answer": [i...], "teacher": [[...]|null...]}. The stream is the trainer's
//! own (bucketed epoch order, per-example candidate shuffles, seeded by [train] seed).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use decision_train::data_order::{Stream, load_run_states};
use decision_train::run_config::RunConfig;
use decision_train::trainer::initial_model;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let config = PathBuf::from(&args[1]);
    let steps: u64 = args[2].parse()?;
    let out = PathBuf::from(&args[3]);
    let sets: Vec<String> = args[4..]
        .chunks(2)
        .filter(|c| c[0] == "--set")
        .map(|c| c[1].clone())
        .collect();
    let cfg = RunConfig::load(&config, &sets)?;
    let tmp = tempfile_dir()?;
    let (train, _valid) = load_run_states(&cfg, &tmp)?;
    let device = decision_train::model::backend::device(cfg.train.backend)?;
    let dm = initial_model(&cfg, &train, &device)?;
    let bs = cfg.train.batch_size;
    let mut stream = Stream::new(&train, bs, cfg.train.seed, cfg.data.shuffle_options, 0, 0);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&out)?);
    for step in 0..steps {
        for micro in 0..cfg.optim.grad_accum {
            let mut rows = Vec::new();
            let (mut options, mut answer, mut teacher) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..bs {
                let p = stream.next_state();
                rows.push(dm.prompter.encode(&p)?.input_ids);
                options.push(p.candidates.len());
                answer.push(p.answer_index().expect("labelled"));
                teacher.push(p.teacher.clone());
            }
            let kmax = *options.iter().max().unwrap();
            let line = serde_json::json!({
                "step": step, "micro": micro, "rows": rows,
                "label_ids": dm.prompter.label_token_ids[..kmax].to_vec(),
                "options": options, "answer": answer, "teacher": teacher, "pad_id": dm.pad_id,
            });
            writeln!(f, "{line}")?;
        }
    }
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("dump_batches_{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
