#!/usr/bin/env bash
# Our tokenizer against Hugging Face's own (@huggingface/tokenizers, pinned in
# tests/hf/js/package-lock.json) on 10,000 lines in the styles of GPT-2,
# Llama 3, Qwen2 and DeepSeek-V3: ids identical, decode equal and
# round-tripping (tests/hf/js/tokenizer_parity.mjs says how).
# Args: build dir, source dir (and the myriad binary, unused).
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
SRC="$2"
IDS="$BUILD/hf/hf_tokenizer_ids"
[ -x "$IDS" ] || { echo "FAIL: $IDS is not built (hint: ninja -C $BUILD hf_tokenizer_ids)"; exit 1; }
CACHE="$(bash "$SRC/tests/hf/js/setup.sh")"
WORK="$(mktemp -d /tmp/myriad-hf-parity.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
(cd "$CACHE" && node tokenizer_parity.mjs --work "$WORK" --ids "$IDS")
