#!/usr/bin/env python3
"""Do `decision score`'s logits match transformers' on a model in a Hugging Face hub cache?

Reads the JSON Lines of `decision score --emit-tokens` (each state's input_ids, option_token_ids
and option_logits, the raw last-position logits of the option labels), loads the same model with
`AutoModelForCausalLM.from_pretrained(ID, revision=REV)` in f32 from the cache that
$HF_HUB_CACHE names (HF_HUB_OFFLINE=1: no download), runs each state's prompt and fails if a
label logit differs by more than --tol (default 1e-5; random weights give label logits of
about 0.1-0.3, so this is about 1e-4 of their size). Run by tests/real_vocab.rs when
$DECISION_PYTHON imports torch and transformers; by hand:

  HF_HUB_CACHE=... HF_HUB_OFFLINE=1 bench-out/venv-model/bin/python scripts/check_hub_logits.py \
      --model Qwen/Qwen3-4B --revision REV --scores scores.jsonl

Requirements: scripts/requirements-model.txt
"""

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a hub id (or a folder)")
    ap.add_argument("--revision", default=None)
    ap.add_argument("--scores", required=True, help="decision score --emit-tokens output")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--max-states", type=int, default=16)
    args = ap.parse_args()

    model, info = AutoModelForCausalLM.from_pretrained(
        args.model, revision=args.revision, dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True,
    )
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        sys.exit(f"{args.model}: loading info {bad}")
    model.eval()
    lines = [json.loads(l) for l in open(args.scores, encoding="utf-8") if l.strip()]
    worst, scale, n = 0.0, 0.0, 0
    for line in lines[: args.max_states]:
        ids = torch.tensor([line["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        want = logits[line["option_token_ids"]].tolist()
        got = line["option_logits"]
        d = max(abs(a - b) for a, b in zip(want, got))
        worst = max(worst, d)
        scale = max([scale] + [abs(x) for x in want])
        n += 1
        if d > args.tol:
            sys.exit(f"{line['id']}: label logits differ by {d:.3g} (> {args.tol}): ours {got}, transformers {want}")
    vocab = model.config.vocab_size
    print(f"{n} states, vocabulary {vocab}: max |d logit| {worst:.3g} (tolerance {args.tol}) "
          f"at label logits up to {scale:.3g}")


if __name__ == "__main__":
    main()
