#!/usr/bin/env bash
# The 4B LoRA step on an NVIDIA GPU, ours against PyTorch, in one command (issue 30, item 6).
#
# For a Linux x86-64 machine with an NVIDIA GPU and its driver, python3 with PyTorch (CUDA),
# transformers and peft, and no network. It builds nothing; `make gpu-check-prepare` (on the build
# machine) writes bench-out/gpu-check/, 38 MB (46 with AUTOTUNE=1), which must be carried to it:
#   decision.xz         the `decision` binary (dev profile: every dependency and decision-train at
#                       opt-level 3), stripped and xz-compressed; its matmuls are Burn's untuned
#                       defaults
#   decision-autotune.xz  with AUTOTUNE=1, in place of wgpu-tests.xz: the same built with
#                       `--features gpu-autotune` (Burn's kernel autotuning); BUILD=autotune runs it
#   glibc-needed        the newest GLIBC_x.y symbol version that binary links against
#   skeleton/model-2048 the Qwen3-4B shape's config.json (configs/shapes/qwen3-4b.json), the tiny
#                       word-level tokenizer, decision.json and 10 states of about 2048 tokens;
#                       no weights (`random_qwen3 --no-weights`)
#   *.deb               the Vulkan loader and GLVND (libvulkan1, libglvnd0, libglx0, libegl1, libgl1,
#                       libopengl0, libgles2), for machines without them
#   wgpu-tests.xz       the test binary of train/tests/wgpu.rs, stripped and compressed, with
#   source-dir          the checkout it was built in (its fixtures are read from there: on the GPU
#                       machine that path is linked to this checkout when it is free)
# First it checks, and stops with a message saying what is missing: the GPU (nvidia-smi), the
# glibc the binary needs, NVIDIA's Vulkan driver (its ICD manifest, or libGLX_nvidia.so.0 to write
# one for; a container has it only when started with the `graphics` driver capability), and that
# Vulkan sees the GPU through it. Then transformers makes random bf16 weights for the skeleton's
# config on the GPU (8 GB, into $WORK), and scripts/bench_scale.py runs, on the same checkpoint
# and token ids, one micro-batch of 2 x 2048 tokens per step:
#   ours  `decision train` with --backend wgpu: Vulkan, kernels compiled to SPIR-V, matmuls on
#         cooperative matrices (tensor cores) where the driver offers them (the adapter lines on
#         stderr say which), `[train] dtype = "auto"` (bf16 if the device computes it, else f16
#         with loss scaling), LoRA r16 on all seven projections, layer recomputation
#   peer  PyTorch + transformers + peft on CUDA: bf16, SDPA, gradient checkpointing
# and prints tokens/s, seconds per step and peak GPU memory (nvidia-smi, both sides alike) with
# their ratios. The peer goes first, so its figure comes back even when ours fails; ours is killed
# at the benchmark's deadline and still counts if it logged two steps (the first is not timed).
# Then the wgpu tests run on the GPU (train/tests/wgpu.rs: the tiny base's LoRA run with recompute
# in f32 and f16 against the CPU's, the f16 run killed and resumed; the compiler and `auto` dtype;
# scoring), with DECISION_REQUIRE_CHECKERS=vulkan,gpu so that none passes by not running.
# After the benchmark, ours runs once more for 2 steps with each kernel launch timed
# (kernel-times.txt: the GPU's time by kernel kind, per step), then the tests get what is left.
# Results go to $OUT (gpu-check.log, plan.txt, bench-scale.json, ours-metrics.jsonl, timeline.txt,
# ours-compile.log, kernel-times.txt, profile.log.xz, profile-train.log, fusion.log, wgpu-tests.log); the
# checkpoint to $WORK.
#   scripts/gpu-check.sh            # ends within SECONDS_ALLOWED (default 520) of its start
# Environment: GPU_CHECK (default bench-out/gpu-check), OUT (default $GPU_CHECK/result),
# WORK (default /tmp/gpu-check-work), STEPS (default 3: the first is not timed), SECONDS_ALLOWED,
# BENCH_SHARE_PCT (default 65: the percentage of the time left after the checks the benchmark may
# use), PROFILE (default 1; 0 leaves the profiled run out), PROFILE_SHARE_PCT (default 50: its
# share of the time left after the benchmark); the wgpu tests get the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
G=${GPU_CHECK:-bench-out/gpu-check}
OUT=${OUT:-$G/result}
WORK=${WORK:-/tmp/gpu-check-work}
STEPS=${STEPS:-3}
START=$(date +%s)
END=$((START + ${SECONDS_ALLOWED:-520}))
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/gpu-check.log") 2>&1
say() { echo "gpu-check: $*"; }
# the `train` lines in a run's metrics.jsonl (0 before it exists)
steps_in() { local n; n=$(grep -c '"train"' "$1/metrics.jsonl" 2>/dev/null || true); echo "${n:-0}"; }
# the kernels cubecl's compile log names
compiled_in() { grep -c '^\[Compiling kernel\]' "$1" || true; }
# The busiest thread of process $1 since the last call for it, 10 s earlier (the timeline's
# interval), as "NAME PCT% of a core" (the threads' CPU ticks kept in $2.PID): a step bound by the
# host's work per launch shows one thread near 100 % while the GPU idles (docs/results.md, "Host
# work per launch, and what it bounds").
busiest_thread() {
    local pid=$1 prev="$2.$1" now="$2.now" hz
    hz=$(getconf CLK_TCK)
    [ -n "$pid" ] && [ -d "/proc/$pid/task" ] || { echo "none"; return; }
    for t in /proc/"$pid"/task/*; do
        # utime and stime are the 12th and 13th fields after the name's closing parenthesis
        echo "${t##*/} $(tr ' ' _ < "$t/comm") $(sed 's/.*) //' "$t/stat" | awk '{print $12 + $13}')"
    done 2>/dev/null > "$now"
    [ -s "$prev" ] || { mv "$now" "$prev"; echo "(first sample)"; return; }
    awk -v hz="$hz" -v dt=10 'NR == FNR { seen[$1] = $3; next }
        { d = $3 - seen[$1]; if (d > best) { best = d; name = $2 } }
        END { if (name == "") print "idle"; else printf "%s %.0f%% of a core\n", name, 100 * best / hz / dt }' \
        "$prev" "$now" 2>/dev/null || echo "none"
    mv "$now" "$prev"
}

[ -d "$G/skeleton/model-2048" ] && [ -f "$G/decision.xz" ] || {
    say "no $G/skeleton/model-2048 or $G/decision.xz: run \`make gpu-check-prepare\` on the build machine and carry $G"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { say "nvidia-smi failed: no NVIDIA GPU here?"; exit 2; }
python3 -c "import torch, transformers, peft; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print('gpu-check: torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"

# The binary's glibc: it runs only where the C library is at least as new as what it links.
need=$(cat "$G/glibc-needed" 2>/dev/null || echo "")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    say "this machine's glibc is $have; the carried binary needs $need: build it on an older distribution"
    exit 4
fi
say "glibc $have (the binary needs ${need:-an unrecorded version})"

# The carried binary, the Vulkan loader and NVIDIA's Vulkan driver.
. scripts/gpu-env.sh

# Vulkan must see the GPU through that driver: `decision train --plan --backend wgpu` brings the
# adapter up and names it, its compiler, dtypes and memory (no weights needed).
PLAN_CFG=$WORK/plan.toml
sed -e "s|^source = .*|source = \"$(realpath "$G/skeleton/model-2048")\"|" configs/qwen3-4b-lora.toml > "$PLAN_CFG"
if ! "$BIN" train --config "$PLAN_CFG" --plan --backend wgpu 2>&1 | tee "$OUT/plan.txt"; then
    say "the GPU's Vulkan adapter did not come up (see above)"; exit 3
fi
grep -q 'SPIR-V compiler' "$OUT/plan.txt" || say "warning: the adapter is not on the SPIR-V compiler (see the wgpu kernels line)"
grep -q 'llvmpipe' "$OUT/plan.txt" && { say "Vulkan chose lavapipe, not the GPU: the NVIDIA ICD did not load"; exit 3; }

# What the benchmark leaves comes back even when it fails or is killed.
keep() {
    cp "$WORK/scale/bench-scale.json" "$OUT/" 2>/dev/null || true
    cp "$WORK/scale/ours-2x2048/metrics.jsonl" "$OUT/ours-metrics.jsonl" 2>/dev/null || true
}
trap keep EXIT

# The 4B step, side by side: the peer first, then ours until the benchmark's deadline. Ours starts
# here, so a cubecl.toml here has cubecl log each kernel it compiles (ours-compile.log); every 10 s
# a line of timeline.txt says how many, the GPU's utilisation and memory, the steps logged and ours'
# busiest thread, so a run killed at the deadline still says whether it was loading, compiling or
# stepping, and a stepping run whether the host (one thread near 100 %, the GPU idling) bounds it.
left=$((END - $(date +%s)))
bench_s=$((left * ${BENCH_SHARE_PCT:-65} / 100))
say "benchmark: ${bench_s} s of the ${left} s left"
mkdir -p "$WORK/scale"
: > "$OUT/ours-compile.log"
# A cubecl.toml already here is the user's: it stays as it is, and the compile log stays empty.
OURS_TOML=""
if [ -e cubecl.toml ]; then
    say "a cubecl.toml is already in $PWD: left as it is, so no compile log"
else
    printf '[compilation.logger]\nlevel = "basic"\nfile = "%s"\nappend = true\n' "$OUT/ours-compile.log" > cubecl.toml
    OURS_TOML=cubecl.toml
fi
(
    t0=$(date +%s)
    while sleep 10; do
        ours=$(pgrep -n -f -- "${BIN##*/} train" || true)
        echo "$(( $(date +%s) - t0 )) s: kernels compiled $(compiled_in "$OUT/ours-compile.log");" \
            "GPU $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | head -1);" \
            "steps logged $(steps_in "$WORK/scale/ours-2x2048");" \
            "ours' busiest thread $(busiest_thread "$ours" "$WORK/threads")"
    done > "$OUT/timeline.txt"
) &
WATCH=$!
rc=0
timeout "$((bench_s + 20))" python3 scripts/bench_scale.py --decision "$BIN" --skeleton "$G/skeleton" --out "$WORK/scale" \
    --backend wgpu --ours-dtype auto --peer-device cuda --torch-dtype bf16 \
    --workloads 2x2048 --steps "$STEPS" --no-forward --deadline "$(( $(date +%s) + bench_s ))" || rc=$?
kill $WATCH 2>/dev/null || true
[ -z "$OURS_TOML" ] || rm -f "$OURS_TOML"
keep
say "benchmark exit status $rc; ours compiled $(compiled_in "$OUT/ours-compile.log") kernels; timeline (since the peer started):"
cat "$OUT/timeline.txt"

# Where ours' GPU time goes: the same run again, each kernel launch timed on its own by cubecl's
# profiling logger (so this run's tokens/s is not the benchmark's), stopped once it has logged 2
# steps (its merge and the 8 GB save would add nothing), the launches summed by kernel kind
# (scripts/kernel_times.py). It gets PROFILE_SHARE_PCT of the time left, when that is at least
# 60 s; PROFILE=0 leaves it out.
left=$((END - $(date +%s)))
prof_s=$((left * ${PROFILE_SHARE_PCT:-50} / 100))
if [ "${PROFILE:-1}" != 0 ] && [ -f "$WORK/scale/run-2x2048.toml" ] && [ "$prof_s" -ge 60 ]; then
    say "profiled run of ours: ${prof_s} s of the ${left} s left"
    rm -rf "$WORK/prof" && mkdir -p "$WORK/prof"
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\nappend = true\n' "$WORK/prof/profile.log" > "$WORK/prof/cubecl.toml"
    # Burn's fusion planner's account (a few KB): the stretches it ran one launch per operation
    # (docs/results.md, "Burn's fusion and the norm's order")
    printf '[fusion.logger]\nlevel = "medium"\nfile = "%s"\nappend = true\n' "$OUT/fusion.log" > "$WORK/prof/burn.toml"
    (cd "$WORK/prof" && exec timeout "$prof_s" "$BIN" train --config "$WORK/scale/run-2x2048.toml" \
        --out "$WORK/prof/run" --set train.max_steps=3) > "$OUT/profile-train.log" 2>&1 &
    PROF=$!
    # stopped within a second of its second step's line: the table holds the load, 2 steps and at
    # most that second of the third
    while kill -0 $PROF 2>/dev/null; do
        sleep 1
        if [ "$(steps_in "$WORK/prof/run")" -ge 2 ]; then
            kill $PROF 2>/dev/null && say "profiled run stopped after its second step"
            break
        fi
    done
    wait $PROF 2>/dev/null || true
    tail -4 "$OUT/profile-train.log"
    say "fusion plans run unfused: $(grep -ac 'falling back to unfused' "$OUT/fusion.log" 2>/dev/null) (fusion.log)"
    if python3 scripts/kernel_times.py "$WORK/prof/profile.log" --steps 2 > "$OUT/kernel-times.txt"; then
        cat "$OUT/kernel-times.txt"
    fi
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb'))" \
        "$WORK/prof/profile.log" "$OUT/profile.log.xz" || true
fi

# The wgpu tests on the GPU. Their fixtures are read from the checkout the binary was built in.
if [ -f "$G/wgpu-tests.xz" ]; then
    src=$(cat "$G/source-dir")
    if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
    T=$WORK/wgpu-tests
    [ -x "$T" ] || { xz -dc "$G/wgpu-tests.xz" > "$T" 2>/dev/null || python3 -c "import lzma, shutil, sys; \
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$G/wgpu-tests.xz" "$T"; chmod +x "$T"; }
    left=$((END - $(date +%s) - 5))
    say "wgpu tests: ${left} s left (fixtures from $src -> $(realpath "$src"))"
    if [ "$left" -gt 20 ]; then
        (cd "$WORK" && DECISION_REQUIRE_CHECKERS=vulkan,gpu timeout "$left" "$T" --test-threads 1 --nocapture) \
            > "$OUT/wgpu-tests.log" 2>&1 && say "wgpu tests passed" || say "wgpu tests failed, status $? (wgpu-tests.log)"
        tail -30 "$OUT/wgpu-tests.log"
    fi
fi
say "done in $(( $(date +%s) - START )) s: $OUT"
