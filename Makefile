# `make demo` and `make test` do everything on a fresh machine (after .ci/run's installs).
# The demo uses the dev build (deps optimised, see Cargo.toml) so it shares target/ with tests.

CARGO ?= cargo
BIN   := target/debug/decision
OUT   := demo-out

.PHONY: all build demo test bench lint

all: test

build:
	$(CARGO) build -p decision

## demo: generate v1 and v2 decision states, validate them, print their stats
demo: build
	$(BIN) gen states --rules v1 --tasks 2000 --seed 7 --out $(OUT)/v1.parquet
	$(BIN) gen states --rules v2 --tasks 2000 --seed 7 --out $(OUT)/v2.parquet
	$(BIN) data validate $(OUT)/v1.parquet
	$(BIN) data validate $(OUT)/v2.parquet
	$(BIN) data stats $(OUT)/v1.parquet
	$(BIN) data stats $(OUT)/v2.parquet

## test: the whole workspace test suite (offline, CPU)
test:
	$(CARGO) test --workspace

## bench: speed figures, side by side with the reference implementations
bench: build
	@echo "bench: no component benchmark yet; each component adds its target here"

## lint: formatting and clippy with warnings denied
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
