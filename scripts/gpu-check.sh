#!/usr/bin/env bash
# The 4B LoRA step on a GPU, ours against PyTorch, in one command (issue 15, item 7).
#
# For a Linux x86-64 machine with an NVIDIA GPU and its driver, python3 with PyTorch (CUDA),
# transformers and peft, and no network. Nothing large is carried to it: `make gpu-check-prepare`
# (on the build machine) writes bench-out/gpu-check/, 26 MB:
#   decision.xz         the `decision` binary (dev profile: every dependency and decision-train at
#                       opt-level 3), stripped and xz-compressed; built against glibc 2.36
#   skeleton/model-2048 the Qwen3-4B shape's config.json (configs/shapes/qwen3-4b.json), the tiny
#                       word-level tokenizer, decision.json and 10 states of about 2048 tokens;
#                       no weights (`random_qwen3 --no-weights`)
#   libvulkan1_*.deb    the Vulkan loader, for machines without libvulkan.so.1
# Here, transformers makes random bf16 weights for that config on the GPU (8 GB, into $WORK),
# then scripts/bench_scale.py runs, on the same checkpoint and token ids:
#   ours  `decision train` on wgpu / Vulkan (the NVIDIA ICD), LoRA r16 on all seven projections,
#         bf16 base if the adapter takes it, else f16, layer recomputation, 1 x 2048 tokens
#   peer  PyTorch + transformers + peft on CUDA: bf16, SDPA, gradient checkpointing
# and prints tokens/s, seconds per step and peak GPU memory (nvidia-smi, both sides alike) with
# their ratios. Results go to $OUT (bench-scale.json, gpu-check.log); the checkpoint to $WORK.
#   scripts/gpu-check.sh            # under 8 minutes by design (the benchmark has a 450 s timeout); not yet run on a GPU
# Environment: GPU_CHECK (default bench-out/gpu-check), OUT (default $GPU_CHECK/result),
# WORK (default /tmp/gpu-check-work), STEPS (default 3: the first is not timed).
set -euo pipefail
cd "$(dirname "$0")/.."
G=${GPU_CHECK:-bench-out/gpu-check}
OUT=${OUT:-$G/result}
WORK=${WORK:-/tmp/gpu-check-work}
STEPS=${STEPS:-3}
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/gpu-check.log") 2>&1
say() { echo "gpu-check: $*"; }

[ -d "$G/skeleton/model-2048" ] || { say "no $G/skeleton/model-2048: run \`make gpu-check-prepare\` first"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { say "nvidia-smi failed: no NVIDIA GPU here?"; exit 2; }
python3 -c "import torch, transformers, peft; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print('gpu-check: torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"

# The binary: carried compressed (xz, or Python's lzma where xz is missing).
BIN=$WORK/decision
if [ ! -x "$BIN" ]; then
    if command -v xz >/dev/null; then xz -dc "$G/decision.xz" > "$BIN"; else
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$G/decision.xz" "$BIN"
    fi
    chmod +x "$BIN"
fi
"$BIN" --version

# The Vulkan loader: the system's, else the carried .deb unpacked.
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
    deb=$(ls "$G"/libvulkan1_*.deb | head -1)
    mkdir -p "$WORK/vulkan"
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$deb" "$WORK/vulkan"; else
        (cd "$WORK/vulkan" && ar x "$(realpath "$deb")" && tar xf data.tar.*)
    fi
    lib=$(dirname "$(find "$WORK/vulkan" -name 'libvulkan.so.1*' | head -1)")
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "Vulkan loader from $deb"
fi

# The NVIDIA ICD: the driver's manifest if installed, else one written for libGLX_nvidia.so.0 (the
# driver's Vulkan implementation; a container has it only with NVIDIA_DRIVER_CAPABILITIES=graphics).
icd=""
for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    [ -f "$d/nvidia_icd.json" ] && icd="$d/nvidia_icd.json" && break
done
if [ -z "$icd" ]; then
    glx=$(ldconfig -p 2>/dev/null | awk '/libGLX_nvidia.so.0 / {print $NF; exit}')
    [ -n "$glx" ] || glx=$(find /usr/lib /usr/lib64 /usr/local -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1)
    if [ -n "$glx" ]; then
        icd="$WORK/nvidia_icd.json"
        printf '{"file_format_version": "1.0.1", "ICD": {"library_path": "%s", "api_version": "1.3"}}\n' "$glx" > "$icd"
    fi
fi
if [ -z "$icd" ]; then
    say "no NVIDIA Vulkan driver here (no nvidia_icd.json, no libGLX_nvidia.so.0): our side cannot run;"
    say "in a container, start it with NVIDIA_DRIVER_CAPABILITIES=all (or graphics,compute,utility)"
    exit 3
fi
export VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd"
say "Vulkan ICD $icd"

# No limit on our side's plan but the GPU's own memory (wgpu does not report it to Burn).
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
export DECISION_DEVICE_MEMORY=$(python3 -c "print(round($total_mib / 1024, 1))")

mkdir -p "$WORK/scale"
timeout 450 python3 scripts/bench_scale.py --decision "$BIN" --skeleton "$G/skeleton" --out "$WORK/scale" \
    --backend wgpu --ours-dtype bf16,f16 --peer-device cuda --torch-dtype bf16 \
    --workloads 1x2048 --steps "$STEPS"
cp "$WORK/scale/bench-scale.json" "$OUT/"
say "done: $OUT/bench-scale.json"
