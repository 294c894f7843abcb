#!/usr/bin/env bash
# make bench (fit part): `decision fit` against the pandas/pyarrow reference of the same rule
# (scripts/fit_reference.py bench) on 10 million synthetic receipts, generated once into
# bench-out/ (git-ignored). Prints both wall times (process start to exit) and the ratio, and
# checks that both reached the same statuses and thresholds.
#   BIN=target/debug/decision PYTHON=python3 N=10000000 scripts/bench_fit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug/decision}
PYTHON=${PYTHON:-python3}
N=${N:-10000000}
OUT=${OUT:-bench-out}
data="$OUT/receipts-$N.parquet"
mkdir -p "$OUT"
if [ ! -f "$data" ]; then
    echo "bench-fit: generating $N receipts into $data (once)"
    "$BIN" gen receipts --n "$N" --seed 7 --bad 0.0001 --out "$data"
fi
cat "$data" > /dev/null   # warm the page cache for both

now() { date +%s.%N; }
t0=$(now)
"$BIN" fit --receipts "$data" --config configs/fit.toml --out "$OUT/thresholds.json" > "$OUT/fit-rust.txt"
t1=$(now)
"$PYTHON" scripts/fit_reference.py bench --receipts "$data" --config configs/fit.toml > "$OUT/fit-reference.json"
t2=$(now)

"$PYTHON" - "$OUT/thresholds.json" "$OUT/fit-reference.json" "$t0" "$t1" "$t2" "$N" <<'PY'
import json, sys
rust = json.load(open(sys.argv[1]))
ref = json.load(open(sys.argv[2]))
t0, t1, t2, n = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
same = all(rust["points"][k]["status"] == v["status"] and rust["points"][k]["threshold"] == v["threshold"]
           and rust["points"][k]["judged"] == v["judged"] for k, v in ref["points"].items())
assert rust["source"]["records"] == ref["records"] and rust["source"]["bad"] == ref["bad"], "record counts differ"
# the reference does not look for repeated ids; synthetic ids are unique, so the fit drops none
assert rust["source"]["duplicates"] == 0, "duplicates in synthetic receipts"
assert same and set(rust["points"]) == set(ref["points"]), "the two fits disagree"
r, p = t1 - t0, t2 - t1
print(f"bench-fit: {n} receipts: decision fit {r:.2f} s, pandas/pyarrow reference {p:.2f} s "
      f"(of which fitting {ref['seconds']:.2f} s after imports): reference/decision = {p / r:.2f}x; same thresholds")
PY
