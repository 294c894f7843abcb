#!/usr/bin/env python3
"""Benchmark: onnxruntime latency of our model.onnx against Hugging Face's own ONNX export of the
same weights (run by `make bench`, never in CI).

  scripts/bench_onnx.py make-model OUT_DIR     a small random Qwen3 checkpoint (HF layout + the
                                               word-level tokenizer of the export fixtures)
  scripts/bench_onnx.py compare BUNDLE MODEL_DIR [--runs N]

`compare` exports MODEL_DIR with torch.onnx.export (transformers' Qwen3ForCausalLM, eager
attention, only the last position's logits: `logits_to_keep=1`), then times both files in
onnxruntime on the CPU, batch 1, the same prompts (token ids from the bundle's tokenizer),
alternating call by call in this one process: p50 and p95 per call, and the ratio ours / theirs.
Our file returns the label logits and probabilities; the HF file returns the last position's
logits over the whole vocabulary (the label gather and softmax happen outside it).
Requirements: scripts/requirements-export.txt
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE_TOKENIZER = os.path.join(HERE, "..", "tests", "fixtures", "export", "tiny", "tokenizer.json")
PROMPTS = [
    "Decision : tool Context : user asks to cancel order Options : A . lookup_order B . cancel_order "
    "C . refund_order D . ask_user Answer :",
    "Decision : stop Context : the agent called search_docs and got results Options : A . stop B . "
    "ask_user Answer :",
    "Decision : route Context : " + "user asks for a refund for the order " * 12 + "Options : A . refund_order "
    "B . ask_user C . escalate Answer :",
]


def make_model(out):
    """A small Qwen3 (about 30M parameters): big enough that kernels, not overhead, dominate."""
    cfg = Qwen3Config(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}, max_position_embeddings=2048,
                      attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(FIXTURE_TOKENIZER, os.path.join(out, "tokenizer.json"))
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)")


class LastLogits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1).logits


def timed(sessions, feeds, runs):
    """p50 and p95 (ms) per session. Calls alternate between the sessions, prompt by prompt, so
    a change in machine load hits both alike."""
    for session, fs in zip(sessions, feeds):  # warm-up
        for f in fs:
            session.run(None, f)
    times = [[] for _ in sessions]
    for _ in range(runs):
        for i in range(len(feeds[0])):
            for k, session in enumerate(sessions):
                t = time.perf_counter()
                session.run(None, feeds[k][i])
                times[k].append((time.perf_counter() - t) * 1e3)
    return [(np.percentile(t, 50), np.percentile(t, 95)) for t in times]


def compare(bundle, model_dir, runs, workdir):
    spec = json.load(open(os.path.join(bundle, "decision.json")))
    manifest = json.load(open(os.path.join(bundle, "manifest.json")))
    tok = Tokenizer.from_file(os.path.join(bundle, "tokenizer.json"))
    labels = spec["label_token_ids"]
    prompts = [tok.encode(p).ids for p in PROMPTS]

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    os.makedirs(workdir, exist_ok=True)
    hf_path = os.path.join(workdir, "hf-export.onnx")
    example = torch.tensor([prompts[0]])
    torch.onnx.export(LastLogits(model), (example, torch.ones_like(example)), hf_path, dynamo=False,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"], opset_version=18,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                    "logits": {0: "batch"}})

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    ours = ort.InferenceSession(os.path.join(bundle, manifest["formats"]["onnx"]["file"]), opts,
                                providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(hf_path, opts, providers=["CPUExecutionProvider"])
    our_feeds, their_feeds = [], []
    for ids in prompts:
        a = np.array([ids], dtype=np.int64)
        m = np.ones_like(a)
        our_feeds.append({"input_ids": a, "attention_mask": m, "option_token_ids": np.array([labels[:4]], dtype=np.int64)})
        their_feeds.append({"input_ids": a, "attention_mask": m})
    # Same answers first: our label probabilities against theirs through the label gather.
    worst = 0.0
    for of, tf in zip(our_feeds, their_feeds):
        ours_p = ours.run(["option_probs"], of)[0][0]
        logits = theirs.run(None, tf)[0][0, -1][labels[:4]] / manifest["model"]["temperature"]
        p = np.exp(logits - logits.max())
        worst = max(worst, float(np.abs(ours_p - p / p.sum()).max()))
    (o50, o95), (t50, t95) = timed([ours, theirs], [our_feeds, their_feeds], runs)
    params = manifest["model"]["parameters"]
    print(f"onnxruntime {ort.__version__}, CPU, {opts.intra_op_num_threads} threads, batch 1, "
          f"{len(prompts)} prompts of {[len(p) for p in prompts]} tokens, {runs} rounds, {params / 1e6:.1f}M parameters")
    print(f"  ours (decision-export, opset {manifest['formats']['onnx']['opset']}): p50 {o50:.2f} ms  p95 {o95:.2f} ms")
    print(f"  HF   (torch.onnx.export, logits_to_keep=1): p50 {t50:.2f} ms  p95 {t95:.2f} ms")
    print(f"  ratio ours/HF: p50 {o50 / t50:.2f}  p95 {o95 / t95:.2f}   (same answers: max |dp| {worst:.1e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-model")
    mk.add_argument("out")
    cp = sub.add_parser("compare")
    cp.add_argument("bundle")
    cp.add_argument("model_dir")
    cp.add_argument("--runs", type=int, default=20)
    cp.add_argument("--workdir", default="bench-out/export")
    args = ap.parse_args()
    if args.cmd == "make-model":
        make_model(args.out)
    else:
        compare(args.bundle, args.model_dir, args.runs, args.workdir)


if __name__ == "__main__":
    sys.exit(main())
