#!/usr/bin/env bash
# Where a wgpu training run spends its time on the GPU machine (issue 30): the tiny base's LoRA run
# (4 steps, batch 2, recompute, all seven projections) on `--backend wgpu`, sampled every EVERY
# seconds (GPU utilisation and memory from nvidia-smi, the process's CPU % and RSS, steps logged),
# with every thread's stack taken at samples STACKS (cuda-gdb, else gdb) beside the binary's load
# address. The carried binary is stripped: symbolise the stacks here, with the unstripped one:
#   python3 scripts/symbolize_stacks.py OUT/stack-N.txt OUT/maps-N.txt target/debug/decision
# Each run is made twice by default (RUNS): the second shows what the driver's shader cache keeps
# (cubecl keeps its autotune results and SPIR-V across runs only when built with Burn's
# `persistence` feature, which this build leaves off: docs/results.md, "What a second run can keep"). Needs
# `make gpu-check-prepare`'s bench-out/gpu-check. Writes $OUT (probe.log, train.log, compile.log,
# autotune.log (cubecl's own: kernels compiled, autotune candidates and their times),
# stack-N.txt, maps-N.txt). Environment: DTYPE (f32), RECOMPUTE (true), SAMPLES (12), EVERY (10),
# STACKS ("3"), BUILD (unset: the default build, whose matmuls are Burn's untuned defaults;
# `autotune`: the build with Burn's kernel autotuning; give each its own OUT), and any CUBECL_*
# setting to compare (CUBECL_AUTOTUNE_LEVEL defaults to minimal).
set -uo pipefail
cd "$(dirname "$0")/.."
G=${GPU_CHECK:-bench-out/gpu-check}
WORK=${WORK:-/tmp/gpu-probe}
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
exec > >(tee "$OUT/probe.log") 2>&1
say() { echo "gpu-probe: $*"; }
. scripts/gpu-env.sh

"$BIN" gen states --rules v1 --tasks 4 --seed 11 --out "$WORK/states.jsonl" > /dev/null
cat > "$WORK/run.toml" <<TOML
name = "gpu-probe"
[model]
init = "pretrained"
source = "$PWD/models/tiny-base"
[data]
train = "$WORK/states.jsonl"
valid = "$WORK/states.jsonl"
max_options = 16
max_tokens = 512
[lora]
rank = 4
alpha = 8.0
dropout = 0.0
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[optim]
lr = 5e-3
warmup_steps = 1
[train]
mode = "lora"
max_steps = 4
batch_size = 2
seed = 3
checkpoint_every = 0
log_every = 1
eval_every = 0
backend = "wgpu"
dtype = "${DTYPE:-f32}"
recompute = ${RECOMPUTE:-true}
[eval]
batch_size = 8
permutations = 0
max_states = 8
TOML
# cubecl's own account, through a cubecl.toml where the run starts: a line per kernel compiled
# (`[Compiling kernel] NAME`) and autotune's candidates with their compile-and-bench times.
cat > "$WORK/cubecl.toml" <<TOML
[compilation.logger]
level = "basic"
file = "$OUT/compile.log"
append = true

[autotune.logger]
level = "minimal"
file = "$OUT/autotune.log"
append = true
TOML
DBG=$(command -v cuda-gdb || command -v gdb || true)
for run in $(seq 1 "${RUNS:-2}"); do
    # the same run again: what cubecl's persistent caches and the driver's shader cache keep
    echo "[run $run]" | tee -a "$OUT/compile.log" "$OUT/autotune.log" >> "$OUT/train.log"
    rm -rf "$WORK/run"
    compiled_before=$(grep -c '^\[Compiling kernel\]' "$OUT/compile.log")
    (cd "$WORK" && exec env CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}" "$BIN" train \
        --config "$WORK/run.toml" --out "$WORK/run") >> "$OUT/train.log" 2>&1 &
    PID=$!
    t0=$(date +%s)
    for i in $(seq 1 "${SAMPLES:-12}"); do
        sleep "${EVERY:-10}"
        kill -0 $PID 2>/dev/null || break
        gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi")
        say "run $run, $(( $(date +%s) - t0 )) s: GPU $gpu; process CPU % and RSS KiB $(ps -o %cpu=,rss= -p $PID); kernels compiled $(( $(grep -c '^\[Compiling kernel\]' "$OUT/compile.log") - compiled_before )); steps logged $(grep -c '"train"' "$WORK/run/metrics.jsonl" 2>/dev/null)"
        if [ "$run" = 1 ] && [ -n "$DBG" ] && [[ " ${STACKS:-3} " == *" $i "* ]]; then
            grep -m1 " $BIN\$" /proc/$PID/maps > "$OUT/maps-$i.txt"
            timeout -s KILL 40 "$DBG" -p $PID -batch -ex "thread apply all bt 40" 2>/dev/null | grep -E '^#|^Thread' \
                | cut -c1-200 > "$OUT/stack-$i.txt"
            say "stacks: $OUT/stack-$i.txt ($(wc -l < "$OUT/stack-$i.txt") lines)"
        fi
    done
    if kill -0 $PID 2>/dev/null; then say "run $run still going after $(( $(date +%s) - t0 )) s: stopped"; kill $PID; fi
    wait $PID
    status=$?
    compiled=$(( $(grep -c '^\[Compiling kernel\]' "$OUT/compile.log") - compiled_before ))
    say "run $run: exit status $status after $(( $(date +%s) - t0 )) s; $compiled kernels compiled; $(grep -c '"train"' "$WORK/run/metrics.jsonl" 2>/dev/null) steps logged"
    tr '\r' '\n' < "$OUT/train.log" | grep -E '^steps|^error' | tail -1 || true
done
say "kernels compiled, most often first:"
grep '^\[Compiling kernel\]' "$OUT/compile.log" | sort | uniq -c | sort -rn | head -15
say "autotune candidates, slowest compile-and-bench first:"
grep -o 'Tuning: .*(compilation & bench: [^)]*)' "$OUT/autotune.log" \
    | awk '{ t = $NF; sub(/\)$/, "", t); v = t + 0; u = t; sub(/^[0-9.]+/, "", u);
             ms = (u == "s") ? v * 1000 : (u == "ms") ? v : (u == "ns") ? v / 1e6 : v / 1000;
             printf "%10.1f ms  %s\n", ms, $2 }' | sort -rn | head -10
say "autotune: $(grep -c 'compilation & bench' "$OUT/autotune.log") candidates timed, \
$(grep -o 'compilation & bench: [^)]*' "$OUT/autotune.log" | awk '{ t = $NF; v = t + 0; u = t; sub(/^[0-9.]+/, "", u);
    s += (u == "s") ? v : (u == "ms") ? v / 1000 : (u == "ns") ? v / 1e9 : v / 1e6 } END { printf "%.1f", s }') s in all"
