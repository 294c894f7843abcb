#!/usr/bin/env bash
# Where a wgpu training run spends its time on the GPU machine (issue 30): the tiny base's LoRA run
# (4 steps, batch 2, recompute, all seven projections) on `--backend wgpu`, sampled every EVERY
# seconds (GPU utilisation and memory from nvidia-smi, the process's CPU % and RSS, steps logged),
# with every thread's stack taken at samples STACKS (cuda-gdb, else gdb) beside the binary's load
# address. The carried binary is stripped: symbolise the stacks here, with the unstripped one:
#   python3 scripts/symbolize_stacks.py OUT/stack-N.txt OUT/maps-N.txt target/debug/decision
# Needs `make gpu-check-prepare`'s bench-out/gpu-check. Writes $OUT (probe.log, train.log,
# stack-N.txt, maps-N.txt). Environment: DTYPE (f32), RECOMPUTE (true), SAMPLES (12), EVERY (10),
# STACKS ("3 9"), and any CUBECL_* setting to compare (CUBECL_AUTOTUNE_LEVEL defaults to minimal).
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
rm -rf "$WORK/run"
CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal} "$BIN" train --config "$WORK/run.toml" --out "$WORK/run" \
    > "$OUT/train.log" 2>&1 &
PID=$!
t0=$(date +%s)
DBG=$(command -v cuda-gdb || command -v gdb || true)
for i in $(seq 1 "${SAMPLES:-12}"); do
    sleep "${EVERY:-10}"
    kill -0 $PID 2>/dev/null || break
    gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi")
    say "$(( $(date +%s) - t0 )) s: GPU $gpu; process CPU % and RSS KiB $(ps -o %cpu=,rss= -p $PID); steps logged $(grep -c '"train"' "$WORK/run/metrics.jsonl" 2>/dev/null)"
    if [ -n "$DBG" ] && [[ " ${STACKS:-3 9} " == *" $i "* ]]; then
        grep -m1 " $BIN\$" /proc/$PID/maps > "$OUT/maps-$i.txt"
        timeout -s KILL 40 "$DBG" -p $PID -batch -ex "thread apply all bt 40" 2>/dev/null | grep -E '^#|^Thread' \
            | cut -c1-200 > "$OUT/stack-$i.txt"
        say "stacks: $OUT/stack-$i.txt ($(wc -l < "$OUT/stack-$i.txt") lines)"
    fi
done
if kill -0 $PID 2>/dev/null; then say "still running after $(( $(date +%s) - t0 )) s: stopped"; kill $PID; fi
wait $PID
say "train exit status $?; $(grep -c '"train"' "$WORK/run/metrics.jsonl" 2>/dev/null) steps logged"
tr '\r' '\n' < "$OUT/train.log" | grep -E '^steps|^error' || true
