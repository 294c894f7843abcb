#!/usr/bin/env bash
# Type-checks the whole workspace, tests and examples included, for the other platforms users
# build on, which no Linux build compiles:
#   aarch64-apple-darwin    Apple Silicon: Burn's Metal path (burn/metal, MSL kernels) and the
#                           macOS side of train/src/model/backend.rs;
#   x86_64-pc-windows-msvc  Windows: the Vulkan path as on Linux, without Unix's file APIs.
# `cargo check` emits no machine code and links nothing, so it needs neither SDK nor linker,
# except for the workspace's one C library: zstd (parquet's zstd codec, through zstd-sys), whose
# build script compiles C for the target. It is given a stand-in compiler and archiver that write
# empty objects and archives, which a check never links. What this does not show: that those
# builds link and run (that needs a Mac, or Windows).
#
#   scripts/check-targets.sh                         # or: make check-targets
#   scripts/check-targets.sh aarch64-apple-darwin    # one of them
# Adds a target's standard library with rustup where it is missing (a download, once).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(aarch64-apple-darwin x86_64-pc-windows-msvc)
shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
cat > "$shim/cc" <<'SH'
#!/bin/sh
# stand-in C compiler: an empty file where the output is named (`-o F`, `-oF`, MSVC's `/FoF`)
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        -o) out="$2"; shift ;;
        -o*) out="${1#-o}" ;;
        /Fo* | -Fo*) out="${1#?Fo}" ;;
    esac
    shift
done
[ -z "$out" ] || : > "$out"
SH
cat > "$shim/ar" <<'SH'
#!/bin/sh
# stand-in archiver: an empty archive where one is named (`x.a`, `x.lib`, MSVC's `/OUT:x.lib`)
for a in "$@"; do
    case "$a" in
        /OUT:* | -out:*) printf '!<arch>\n' > "${a#*:}" ;;
        *.a | *.lib) printf '!<arch>\n' > "$a" ;;
    esac
done
SH
chmod +x "$shim/cc" "$shim/ar"
for target in "${targets[@]}"; do
    if ! rustup target list --installed | grep -qx "$target"; then
        rustup target add "$target"
    fi
    t="${target//-/_}"
    export "CC_$t=$shim/cc" "CXX_$t=$shim/cc" "AR_$t=$shim/ar"
    cargo check --target "$target" --workspace --all-targets
    echo "check-targets: the workspace type-checks for $target (not linked, not run)"
done
