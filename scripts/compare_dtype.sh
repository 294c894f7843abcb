#!/usr/bin/env bash
# The demo's LoRA retrain with a bf16 base against an f32 one (issue 15): the demo's data and v1
# model, then configs/tiny-lora-v2.toml at each seed in each dtype, each run evaluated on the v2
# test split. Prints accuracy per run and per dtype the mean and the spread over seeds.
#   BIN=target/debug/decision OUT=bench-out/dtype SEEDS="1 2 3" scripts/compare_dtype.sh
# A recipe variant: DTYPES="bf16" TAG=long SETS="--set train.max_steps=1800" (runs and reports
# are named lora-DTYPE-TAG-SEED; the v1 model and data are shared). Another base for the LoRA runs:
# BASE=DIR (default OUT/tiny-v1/final), e.g. one from scripts/perturb_weights.py, with a TAG.
# About 10 minutes per LoRA run on 2 cores (3 seeds: an hour). Needs python3 (standard library) for the summary.
set -euo pipefail
BIN=${BIN:-target/debug/decision}
OUT=${OUT:-bench-out/dtype}
SEEDS=${SEEDS:-"1 2 3"}
DTYPES=${DTYPES:-"f32 bf16"}
TAG=${TAG:+$TAG-}
SETS=${SETS:-}
BASE=${BASE:-$OUT/tiny-v1/final}
mkdir -p "$OUT"
for rules in v1 v2; do
  [ -f "$OUT/$rules.parquet" ] || "$BIN" gen states --rules $rules --tasks 2000 --seed 7 --out "$OUT/$rules.parquet"
done
[ -d "$OUT/tiny-v1/final" ] || "$BIN" train --config configs/tiny.toml --set data.train="$OUT/v1.parquet" \
  --set eval.permutations=0 --out "$OUT/tiny-v1"
for dtype in $DTYPES; do
  for seed in $SEEDS; do
    run="$OUT/lora-$dtype-$TAG$seed"
    # shellcheck disable=SC2086
    [ -d "$run/final" ] || "$BIN" train --config configs/tiny-lora-v2.toml --set model.source="$BASE" \
      --set data.train="$OUT/v2.parquet" --set train.seed=$seed --set train.dtype=$dtype \
      --set eval.permutations=0 $SETS --out "$run"
    [ -f "$OUT/eval-$dtype-$TAG$seed.json" ] || "$BIN" eval --run "$run" --data "$OUT/v2.parquet" --split test \
      --permutations 0 --report "$OUT/eval-$dtype-$TAG$seed.json"
  done
done
python3 - "$OUT" "$TAG" $SEEDS <<'PY'
import json, statistics, sys
out, tag, seeds = sys.argv[1], sys.argv[2], sys.argv[3:]
for dtype in ("f32", "bf16"):
    acc, found = [], []
    for s in seeds:
        try:
            r = json.load(open(f"{out}/eval-{dtype}-{tag}{s}.json"))
        except FileNotFoundError:
            continue
        acc.append(r["report"]["overall"]["accuracy"])
        found.append(s)
        print(f"{dtype:>5} seed {s}: accuracy {acc[-1]:.4f}")
    if not acc:
        continue
    print(f"{dtype:>5}: mean {statistics.mean(acc):.4f}, range {min(acc):.4f} .. {max(acc):.4f} over seeds {' '.join(found)}")
PY
