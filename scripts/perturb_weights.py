#!/usr/bin/env python3
"""Copy a model folder with noise the size of bf16 rounding added to its f32 weights.

An experiment for issue 15's bf16 criterion: the demo's LoRA retrain from a bf16-rounded base
takes off in about half the seeds where the f32 base took off in every seed tried. Rounding to
bf16 moves each weight by at most half a bf16 ulp. This script moves each weight by a random
amount of the same distribution (uniform in [-ulp/2, ulp/2], ulp the bf16 spacing at the weight)
but keeps f32, so the result is generally not bf16-representable: if an f32 retrain from such a
base also stalls, the take-off is fragile to any perturbation of that size, not to bf16.

    python scripts/perturb_weights.py SRC_DIR DST_DIR --seed 1

Needs numpy only (safetensors is read and written by hand: an 8-byte little-endian header
length, a JSON header, then the raw tensors). DST_DIR must not exist; SRC_DIR is only read.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np


def bf16_ulp(w: np.ndarray) -> np.ndarray:
    # w = m * 2**e with 0.5 <= |m| < 1; bf16 keeps 8 significant bits, so its spacing is 2**(e-8).
    _, e = np.frexp(w)
    return np.ldexp(np.ones_like(w), e - 8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.path.exists(args.dst):
        print(f"{args.dst} exists: refusing to overwrite it", file=sys.stderr)
        return 2
    src = os.path.join(args.src, "model.safetensors")
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
        header = json.loads(raw)
        data = f.read()
    rng = np.random.default_rng(args.seed)
    out = bytearray(data)
    moved, total = 0.0, 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            print(f"{src}: tensor {name} is {t['dtype']}, not F32", file=sys.stderr)
            return 2
        a, b = t["data_offsets"]
        w = np.frombuffer(data[a:b], dtype="<f4")
        noise = (rng.random(w.shape, dtype=np.float32) - 0.5) * bf16_ulp(w)
        p = (w + noise).astype("<f4")
        moved += float(np.abs(p - w).sum())
        total += w.size
        out[a:b] = p.tobytes()
    tmp = args.dst + ".partial"
    shutil.copytree(args.src, tmp)
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", n))
        f.write(raw)
        f.write(out)
    os.rename(tmp, args.dst)
    print(f"{args.dst}: {total} weights, mean |noise| {moved / total:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
