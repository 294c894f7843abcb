#!/usr/bin/env bash
# Type-checks the whole workspace, tests and examples included, for Apple Silicon
# (aarch64-apple-darwin): Burn's Metal path (burn/metal, MSL kernels) and the macOS side of
# train/src/model/backend.rs, which no Linux build compiles. `cargo check` emits no machine code and
# links nothing, so it needs no Apple SDK or linker, except for the workspace's one C library:
# zstd (parquet's zstd codec, through zstd-sys), whose build script compiles C for the target. Its
# build script is given a stand-in compiler and archiver that write empty objects and archives,
# which a check never links. What this does not show: that the Metal build links and runs (that
# needs a Mac).
#
#   scripts/check-macos.sh      # or: make check-macos
# Installs the target's standard library with rustup if it is missing (a download, once).
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-apple-darwin
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi
shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
cat > "$shim/cc" <<'SH'
#!/bin/sh
# stand-in C compiler: an empty file wherever `-o` points
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        -o) out="$2"; shift ;;
        -o*) out="${1#-o}" ;;
    esac
    shift
done
[ -z "$out" ] || : > "$out"
SH
cat > "$shim/ar" <<'SH'
#!/bin/sh
# stand-in archiver: an empty archive wherever one is named
for a in "$@"; do
    case "$a" in *.a) printf '!<arch>\n' > "$a" ;; esac
done
SH
chmod +x "$shim/cc" "$shim/ar"
export CC_aarch64_apple_darwin="$shim/cc" CXX_aarch64_apple_darwin="$shim/cc"
export AR_aarch64_apple_darwin="$shim/ar"
cargo check --target "$target" --workspace --all-targets
echo "check-macos: the workspace type-checks for $target (Metal path included; not linked, not run)"
