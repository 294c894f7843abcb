"""Training throughput: `decision train` (Burn, CPU) against PyTorch + transformers + peft (CPU),
same model config, batch size, data and loss, one run each, side by side.

Run by `make bench` (or by hand):
    python scripts/bench_train.py --decision target/debug/decision \
        --states bench-out/train-states.parquet --out bench-out/train --steps 30

Two workloads:
* tiny: configs/tiny.toml (full fine-tuning of the 4-layer tiny base, models/tiny-base);
* lora: LoRA r=8 on all seven projections (configs/tiny-lora-v2.toml's adapter settings) of a
  small Qwen3 base (hidden 256, 4 layers, 8 heads / 4 kv heads) made here with random weights.

Token ids: the Python side renders each state with the model's decision.json template and
tokenizes it with its tokenizer.json, as `decision` does, so both sides train on the same
sequences (Burn additionally shuffles candidate order, which does not change lengths). Tokens/s counts real (unpadded) prompt tokens,
median over the steps after the first 3; peak memory is the process's max RSS. Writes
OUT/bench-train.json and prints the table.
Requirements: scripts/requirements-train.txt.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

WARMUP = 3


def run_measured(cmd):
    """Run `cmd`, return (seconds, max RSS in MiB)."""
    t = time.time()
    p = subprocess.Popen(cmd)
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}")
    return time.time() - t, usage.ru_maxrss / 1024.0


def rust_tokens_per_s(run_dir):
    lines = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
    tps = [l["tokens_per_s"] for l in lines if l.get("kind") == "train"][WARMUP:]
    return statistics.median(tps)


def torch_worker(args):
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    import pyarrow.parquet as pq

    torch.manual_seed(0)
    table = pq.read_table(args.states).to_pylist() if args.states.endswith(".parquet") else [json.loads(l) for l in open(args.states)]
    data = encode_states(pathlib.Path(args.model), table)
    config = AutoConfig.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.05, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    wd = 0.0 if args.lora else 0.01
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    base = model.get_base_model() if args.lora else model
    head = base.lm_head.weight
    rng = np.random.default_rng(1)
    order = list(rng.permutation(len(data)))
    # the same length bucketing as `decision train` (pools of 16 batches sorted by length)
    pool = 16 * args.batch
    order = [i for k in range(0, len(order), pool) for i in sorted(order[k:k + pool], key=lambda i: len(data[i][0]))]
    batches = [order[k:k + args.batch] for k in range(0, len(order), args.batch)]
    rng.shuffle(batches)
    order = [i for b in batches for i in b]
    pos = 0
    tps = []
    for step in range(args.steps):
        idx = [order[(pos + i) % len(order)] for i in range(args.batch)]
        pos += args.batch
        batch = [data[i] for i in idx]
        L = max(len(b[0]) for b in batch)
        ids = torch.zeros(len(batch), L, dtype=torch.long)
        mask = torch.zeros(len(batch), L, dtype=torch.long)
        for i, (toks, _, _) in enumerate(batch):
            ids[i, L - len(toks):] = torch.tensor(toks)
            mask[i, L - len(toks):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kmax = max(len(b[1]) for b in batch)
        labels = torch.tensor(batch[0][1] if len(batch[0][1]) == kmax else next(b[1] for b in batch if len(b[1]) == kmax))
        absent = torch.zeros(len(batch), kmax)
        onehot = torch.zeros(len(batch), kmax)
        for i, (_, opts, ans) in enumerate(batch):
            absent[i, len(opts):] = -1e9
            onehot[i, ans] = 1.0
        t = time.time()
        hidden = base.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state[:, -1]
        logits = hidden @ head[labels].T + absent
        logp = torch.log_softmax(logits, -1)
        p = logp.exp()
        loss = (-(onehot * logp).sum(-1) + 0.5 * ((p - onehot) ** 2).sum(-1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tps.append(int(mask.sum()) / (time.time() - t))
    json.dump({"tokens_per_s": statistics.median(tps[WARMUP:]), "threads": torch.get_num_threads()}, open(args.result, "w"))


def encode_states(model_dir, states):
    """Token ids of each state as `decision` renders them (decision.json's template, the
    model's tokenizer.json), in the original candidate order: (input_ids, option ids, answer)."""
    from tokenizers import Tokenizer
    spec = json.load(open(model_dir / "decision.json"))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    t = spec["template"]
    out = []
    for s in states:
        opts = t["option_separator"].join(
            t["option"].replace("{label}", spec["labels"][i]).replace("{text}", c["label"])
            for i, c in enumerate(s["candidates"]))
        text = t["text"].replace("{point}", s["point"]).replace("{context}", s["context"]).replace("{options}", opts)
        ids = tok.encode(text).ids
        k = len(s["candidates"])
        answer = [c["id"] for c in s["candidates"]].index(s["answer"])
        out.append((ids, spec["label_token_ids"][:k], answer))
    return out


def make_small_base(tiny_final, out):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    vocab = json.load(open(tiny_final / "config.json"))["vocab_size"]
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=1024,
                      tie_word_embeddings=True, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    for f in ["tokenizer.json", "decision.json"]:
        shutil.copy(tiny_final / f, out / f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decision", default="target/debug/decision")
    ap.add_argument("--states", required=True)
    ap.add_argument("--out", default="bench-out/train")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--torch-worker", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--result")
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    out = pathlib.Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    common = ["--set", f"data.train={args.states}", "--set", f"train.max_steps={args.steps}",
              "--set", f"train.batch_size={args.batch}", "--set", "train.eval_every=0",
              "--set", "train.checkpoint_every=0", "--set", "eval.permutations=0", "--set", "train.log_every=1",
              "--set", "eval.max_states=64"]
    results = {}
    # tiny, full
    _, rss = run_measured([args.decision, "train", "--config", "configs/tiny.toml", *common, "--out", str(out / "tiny-rust")])
    tiny_final = out / "tiny-rust" / "final"
    results["tiny"] = {"burn_tokens_per_s": rust_tokens_per_s(out / "tiny-rust"), "burn_peak_rss_mib": rss}
    _, rss = run_measured([sys.executable, __file__, "--torch-worker", "--model", str(tiny_final), "--states", args.states, "--steps", str(args.steps),
                           "--batch", str(args.batch), "--result", str(out / "tiny-torch.json")])
    t = json.load(open(out / "tiny-torch.json"))
    results["tiny"].update(torch_tokens_per_s=t["tokens_per_s"], torch_peak_rss_mib=rss, torch_threads=t["threads"])
    # small Qwen3, LoRA
    make_small_base(tiny_final, out / "small-base")
    _, rss = run_measured([args.decision, "train", "--config", "configs/tiny-lora-v2.toml", *common,
                           "--set", f"model.source={out / 'small-base'}", "--out", str(out / "lora-rust")])
    results["lora"] = {"burn_tokens_per_s": rust_tokens_per_s(out / "lora-rust"), "burn_peak_rss_mib": rss}
    _, rss = run_measured([sys.executable, __file__, "--torch-worker", "--lora", "--model", str(out / "small-base"),
                           "--states", args.states, "--steps", str(args.steps),
                           "--batch", str(args.batch), "--result", str(out / "lora-torch.json")])
    t = json.load(open(out / "lora-torch.json"))
    results["lora"].update(torch_tokens_per_s=t["tokens_per_s"], torch_peak_rss_mib=rss, torch_threads=t["threads"])
    print(f"{'workload':<8} {'burn tok/s':>11} {'torch tok/s':>12} {'ratio':>7} {'burn MiB':>9} {'torch MiB':>10}")
    for k, r in results.items():
        r["ratio_burn_over_torch"] = r["burn_tokens_per_s"] / r["torch_tokens_per_s"]
        print(f"{k:<8} {r['burn_tokens_per_s']:>11.0f} {r['torch_tokens_per_s']:>12.0f} {r['ratio_burn_over_torch']:>7.2f} "
              f"{r['burn_peak_rss_mib']:>9.0f} {r['torch_peak_rss_mib']:>10.0f}")
    json.dump(results, open(out / "bench-train.json", "w"), indent=1)


if __name__ == "__main__":
    main()
