#!/usr/bin/env python3
"""Forward throughput of `decision score` (Burn, CPU backend) against Hugging Face `transformers`
on the CPU: same Qwen3 config, same weights, same prompts (the token ids `decision score
--emit-tokens` wrote), same batch size and left padding, in one run. Prints tokens/s for both and
their ratio, and checks that both give the same probabilities.

Run by `make bench` (not in CI):  python scripts/bench_score.py [--decision target/debug/decision]
Requirements: scripts/requirements-model.txt
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "model", "tied", "tokenizer.json")

WORDS = (
    "user asks to cancel order ord_117 after lookup_order failed the agent called search_docs and "
    "got 3 results refund policy says route to a human when the amount is over the limit"
).split()


def make_states(n, seed=0):
    import random

    rng = random.Random(seed)
    tools = ["lookup_order", "cancel_order", "refund_order", "ask_user", "search_docs", "stop"]
    states = []
    for i in range(n):
        k = rng.randint(2, 5)
        opts = rng.sample(tools, k)
        context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160)))
        states.append(
            {
                "id": f"s{i}",
                "task_id": f"t{i}",
                "point": "tool",
                "context": context,
                "candidates": [{"id": o, "label": o} for o in opts],
            }
        )
    return states


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decision", default=os.path.join(ROOT, "target", "debug", "decision"))
    ap.add_argument("--states", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        cfg = Qwen3Config(
            vocab_size=2048,
            hidden_size=args.hidden,
            intermediate_size=3 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=args.hidden // 8,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            tie_word_embeddings=True,
            max_position_embeddings=2048,
            attn_implementation="sdpa",
        )
        model = Qwen3ForCausalLM(cfg).eval()
        model.save_pretrained(model_dir, safe_serialization=True)
        with open(TOKENIZER) as f:
            tok = f.read()
        with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
            f.write(tok)
        states_path = os.path.join(tmp, "states.jsonl")
        with open(states_path, "w") as f:
            for s in make_states(args.states):
                f.write(json.dumps(s) + "\n")
        scores_path = os.path.join(tmp, "scores.jsonl")
        cmd = [args.decision, "score", "--model", model_dir, "--data", states_path, "--out", scores_path,
               "--batch-size", str(args.batch_size), "--emit-tokens"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"decision score failed:\n{run.stderr}")
        m = re.search(r"scored (\d+) states \((\d+) prompt tokens\) in ([0-9.]+)s", run.stderr)
        if not m:
            sys.exit(f"no timing line in decision score output:\n{run.stderr}")
        burn_tokens, burn_secs = int(m.group(2)), float(m.group(3))
        rows = [json.loads(line) for line in open(scores_path)]

        # transformers: same ids, same batches (sorted by length as decision score does), left padding.
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["input_ids"]), i))
        probs = [None] * len(rows)
        tokens = sum(len(r["input_ids"]) for r in rows)
        with torch.inference_mode():
            # Warm-up on one batch, not timed (Burn's time excludes loading too).
            warm = [rows[i] for i in order[: args.batch_size]]
            t0 = None
            for rep in range(2):
                if rep == 1:
                    t0 = time.perf_counter()
                for b in range(0, len(order), args.batch_size) if rep == 1 else [0]:
                    idx = order[b : b + args.batch_size]
                    batch = [rows[i] for i in idx] if rep == 1 else warm
                    seq = max(len(r["input_ids"]) for r in batch)
                    ids = torch.zeros(len(batch), seq, dtype=torch.long)
                    mask = torch.zeros(len(batch), seq, dtype=torch.long)
                    for j, r in enumerate(batch):
                        n = len(r["input_ids"])
                        ids[j, seq - n :] = torch.tensor(r["input_ids"])
                        mask[j, seq - n :] = 1
                    pos = (mask.cumsum(-1) - 1).clamp(min=0)
                    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state[:, -1]
                    if rep == 1:
                        for j, i in enumerate(idx):
                            w = model.lm_head.weight[torch.tensor(rows[i]["option_token_ids"])]
                            probs[i] = torch.softmax(hidden[j] @ w.T, -1).tolist()
            hf_secs = time.perf_counter() - t0
        assert tokens == burn_tokens, (tokens, burn_tokens)
        max_dp = max(abs(a - b) for r, p in zip(rows, probs) for a, b in zip(r["probs"], p))

    burn_tps, hf_tps = tokens / burn_secs, tokens / hf_secs
    print(f"config: hidden {args.hidden}, {args.layers} layers, 8 heads / 4 kv, vocab 2048; "
          f"{args.states} states, {tokens} prompt tokens, batch {args.batch_size}; torch threads {torch.get_num_threads()}")
    print(f"decision score (burn flex, f32): {burn_tps:10.0f} tokens/s ({burn_secs:.2f}s)")
    print(f"transformers (torch, f32):       {hf_tps:10.0f} tokens/s ({hf_secs:.2f}s)")
    print(f"ratio burn / transformers: {burn_tps / hf_tps:.2f}   max |Δp| {max_dp:.1e}")
    if max_dp > 1e-3:
        sys.exit("probabilities disagree beyond 1e-3")


if __name__ == "__main__":
    main()
