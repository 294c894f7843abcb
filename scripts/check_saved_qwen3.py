#!/usr/bin/env python3
"""Does Hugging Face `transformers` load a model folder that `decision` saved?

Loads DIR with `AutoModelForCausalLM.from_pretrained` (f32), fails on any missing or unexpected
weight, then runs the prompts of one case of tests/fixtures/model/expected.json (the logits
transformers computed for the original fixture checkpoint) and fails if a last-position logit
differs by more than 1e-4. Run by train/tests/loading.rs when $DECISION_PYTHON (else python3)
imports torch and transformers; by hand:

  bench-out/venv-model/bin/python scripts/check_saved_qwen3.py SAVED_DIR --case tied

(`make bench-out/venv-model/.ok` makes that venv.)

Requirements: scripts/requirements-model.txt
"""

import argparse
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.normpath(os.path.join(HERE, "..", "tests", "fixtures", "model", "expected.json"))
TOL = 1e-4


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--case", required=True, help="a key of expected.json: tied or untied-gqa3")
    ap.add_argument("--expected", default=EXPECTED)
    args = ap.parse_args()

    case = json.load(open(args.expected))[args.case]
    model, info = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{args.model_dir}: transformers reports {problems}")
    worst = 0.0
    with torch.no_grad():
        for ids, want in zip(case["input_ids"], case["f32"]):
            x = torch.tensor([ids])
            got = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1]
            worst = max(worst, float((got - torch.tensor(want)).abs().max()))
    print(f"transformers loaded {args.model_dir} ({type(model).__name__}); "
          f"{len(case['input_ids'])} prompts, max |dlogit| vs expected.json[{args.case!r}] {worst:.2e} "
          f"(tolerance {TOL:.0e})")
    if worst > TOL:
        sys.exit("logits disagree beyond the tolerance")


if __name__ == "__main__":
    main()
