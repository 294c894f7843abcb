"""Does the tiny decision model learn, and how fast? The reference side of that question.

Trains a transformers Qwen3ForCausalLM (same architecture as configs/tiny-base.toml) with
PyTorch on the very micro-batches `decision train` would feed it (token ids, option label ids,
answers, teacher vectors, dumped by train/examples/dump_batches.rs), with the contract's loss
(soft-target cross-entropy over the option labels + brier_weight x Brier) and optionally the
auxiliary next-token term of `[loss] lm_weight`. Prints the training accuracy every 100 steps.

    cargo run -p decision-train --example dump_batches -- configs/tiny-base.toml 2000 /tmp/b.jsonl
    python scripts/check_learnability.py /tmp/b.jsonl --steps 2000 --lm-weight 0
    python scripts/check_learnability.py /tmp/b.jsonl --steps 2000 --lm-weight 1

What it showed (2 cores, seed 1, the dump of configs/tiny-base.toml): with the contract's loss
alone the train accuracy was 0.16 / 0.22 / 0.26 after 200 / 500 / 800 steps (the slow,
seed-dependent take-off that our own Burn runs showed too: 0.29 valid after 1000 steps); with
lm_weight = 1 it was 0.17 / 0.50 after 200 / 500 steps. Hence configs/tiny-base.toml's lm_weight.
Run by hand; not part of CI.
"""
import argparse
import json
import math
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("batches")
ap.add_argument("--steps", type=int, default=2000)
ap.add_argument("--lm-weight", type=float, default=0.0)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--vocab", type=int, default=270, help="tokenizer size of the dumped run")
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--warmup", type=int, default=100)
a = ap.parse_args()

torch.manual_seed(a.seed)
torch.set_num_threads(int(__import__("os").environ.get("THREADS", "2")))
cfg = Qwen3Config(
    vocab_size=a.vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
    rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=1024,
    initializer_range=0.02, attn_implementation="eager",
)
m = Qwen3ForCausalLM(cfg)
decay = [p for p in m.parameters() if p.dim() >= 2]
no_decay = [p for p in m.parameters() if p.dim() < 2]
opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
    lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
)


def multiplier(step):
    if step < a.warmup:
        return (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t))


sched = torch.optim.lr_scheduler.LambdaLR(opt, multiplier)
hits = seen = 0
t0 = time.time()
for step, line in enumerate(open(a.batches)):
    if step >= a.steps:
        break
    b = json.loads(line)
    rows = b["rows"]
    width = max(map(len, rows))
    pad = b["pad_id"]
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    am = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    pos = (am.cumsum(1) - 1).clamp(min=0)
    hidden = m.model(input_ids=ids, attention_mask=am, position_ids=pos).last_hidden_state
    logits = hidden[:, -1] @ m.lm_head.weight[torch.tensor(b["label_ids"])].T
    k = torch.tensor(b["options"])
    absent = torch.arange(logits.shape[1])[None, :] >= k[:, None]
    logits = logits.masked_fill(absent, -1e9)
    p, logp = logits.softmax(-1), logits.log_softmax(-1)
    answer = torch.tensor(b["answer"])
    onehot = torch.nn.functional.one_hot(answer, logits.shape[1]).to(p.dtype)
    q = onehot.clone()
    for i, t in enumerate(b["teacher"]):
        if t is not None and t[b["answer"][i]] >= max(t):
            tt = torch.zeros(p.shape[1])
            tt[: len(t)] = torch.tensor(t)
            q[i] = 0.7 * onehot[i] + 0.3 * tt
    loss = (-(q * logp.masked_fill(absent, 0)).sum(-1) + 0.5 * ((p - onehot) ** 2).sum(-1)).mean()
    total = loss
    if a.lm_weight > 0:
        lm_logits = hidden[:, :-1] @ m.lm_head.weight.T
        mask = (am[:, :-1] * am[:, 1:]).float()
        ce = torch.nn.functional.cross_entropy(
            lm_logits.reshape(-1, lm_logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        ).reshape(mask.shape)
        total = loss + a.lm_weight * (ce * mask).sum() / mask.sum()
    opt.zero_grad()
    total.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    sched.step()
    hits += (p.argmax(-1) == answer).sum().item()
    seen += len(answer)
    if (step + 1) % 100 == 0:
        print(f"step {step + 1}  loss {loss.item():.3f}  train accuracy (last 100 steps) "
              f"{hits / seen:.3f}  {time.time() - t0:.0f} s", flush=True)
        hits = seen = 0
