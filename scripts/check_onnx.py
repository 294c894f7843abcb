#!/usr/bin/env python3
"""Check an export bundle with the reference tools (run by hand and in `make bench`, not in CI).

  1. onnx.checker.check_model(model.onnx, full_check=True) (external data included);
  2. onnxruntime runs model.onnx on a left-padded batch and must agree with transformers on the
     same weights (max |dp| <= 1e-4 for f32 weights, <= 2e-3 for f16, same picks);
  3. when the bundle has adapter/, peft loads it onto the base checkpoint, and that model is the
     transformers reference of step 2 (so the PEFT layout is checked too).

Usage:
  scripts/check_onnx.py BUNDLE --base BASE_MODEL_DIR [--model MODEL_DIR]

--base is the checkpoint the adapter applies to (manifest model.base). Without an adapter the
reference is --model (default: --base), a folder holding the bundle's weights.
Requirements: scripts/requirements-export.txt
"""

import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
from transformers import AutoModelForCausalLM


def batch(vocab, label_ids, temperature, seed=0):
    rng = np.random.default_rng(seed)
    lengths = [9, 4, 13, 1]
    width = max(lengths)
    k = min(4, len(label_ids))
    ids, mask, opts = [], [], []
    for n in lengths:
        row = rng.integers(0, vocab, size=n).tolist()
        ids.append([0] * (width - n) + row)
        mask.append([0] * (width - n) + [1] * n)
        opts.append([label_ids[i] for i in rng.permutation(k)])
    return {"input_ids": np.array(ids, dtype=np.int64), "attention_mask": np.array(mask, dtype=np.int64),
            "option_token_ids": np.array(opts, dtype=np.int64), "temperature": temperature}


def reference_scores(model, b):
    ids = torch.tensor(b["input_ids"])
    mask = torch.tensor(b["attention_mask"])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1, :].float()
    scaled = torch.gather(logits, 1, torch.tensor(b["option_token_ids"])) / b["temperature"]
    return scaled.numpy(), torch.softmax(scaled, dim=-1).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--base", required=True, help="the base checkpoint folder (HF layout)")
    ap.add_argument("--model", help="the checkpoint whose weights the bundle holds (default: --base)")
    args = ap.parse_args()

    manifest = json.load(open(os.path.join(args.bundle, "manifest.json")))
    spec = json.load(open(os.path.join(args.bundle, "decision.json")))
    onnx_facts = manifest["formats"].get("onnx")
    if not onnx_facts:
        sys.exit("the bundle has no model.onnx")
    path = os.path.join(args.bundle, onnx_facts["file"])
    failures = []

    onnx.checker.check_model(path, full_check=True)
    print(f"onnx.checker (full_check): ok, opset {onnx_facts['opset']}, "
          f"{'external data' if onnx_facts.get('external_data') else 'inline weights'}")

    base = AutoModelForCausalLM.from_pretrained(args.base, attn_implementation="eager", dtype=torch.float32).eval()
    peft_dir = manifest["formats"].get("peft")
    if peft_dir:
        from peft import PeftModel
        reference = PeftModel.from_pretrained(base, os.path.join(args.bundle, peft_dir)).eval()
        what = f"transformers + peft ({peft_dir}/ on {args.base})"
    elif args.model:
        reference = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager",
                                                         dtype=torch.float32).eval()
        what = f"transformers ({args.model})"
    else:
        reference = base
        what = f"transformers ({args.base})"

    b = batch(manifest["model"]["config"]["vocab_size"], spec["label_token_ids"], manifest["model"]["temperature"])
    want_logits, want_probs = reference_scores(reference, b)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got_logits, got_probs = session.run(["option_logits", "option_probs"],
                                        {k: b[k] for k in ("input_ids", "attention_mask", "option_token_ids")})
    tol = 2e-3 if manifest["model"]["dtype"] == "f16" else 1e-4
    dp = float(np.abs(got_probs - want_probs).max())
    dl = float(np.abs(got_logits - want_logits).max())
    picks = int((got_probs.argmax(-1) != want_probs.argmax(-1)).sum())
    print(f"onnxruntime {ort.__version__} vs {what}: {len(got_probs)} rows, max |dp| {dp:.2e} "
          f"(tolerance {tol:.0e}), max |dlogit| {dl:.2e}, {picks} pick(s) differ")
    if dp > tol or picks:
        failures.append("onnxruntime disagrees with the reference")
    if failures:
        print("FAILED: " + "; ".join(failures), file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
