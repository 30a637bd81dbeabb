#!/usr/bin/env bash
# Imported DeepSeek-V3 folders (MLA, the sigmoid group-limited router, shared
# experts, the dense prefix, an MTP layer, yarn with mscale_all_dim,
# interleaved RoPE) against the independent PyTorch reference
# tests/hf/hf_reference.py: logits, loss, MTP logits and loss, every gradient,
# 32 greedy tokens and their logits, and the absorbed latent-cache path, each
# within 1e-4 relative in fp32 (tests/hf/model_parity_main.cc says how).
# Variants: the default tiny folder (q_lora_rank 32), q_lora_rank 0 (q_proj),
# bf16 weights in 3 shards, and rotate-half RoPE (rope_interleave false).
# Args: build dir, source dir (and the myriad binary, unused).
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
SRC="$2"
PARITY="$BUILD/hf/hf_model_parity"
PY=/usr/bin/python3
[ -x "$PARITY" ] || { echo "FAIL: $PARITY is not built (hint: ninja -C $BUILD hf_model_parity)"; exit 1; }
WORK="$(mktemp -d /tmp/myriad-hf-model.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
check() {  # name, make_tiny options...
  local name="$1"; shift
  local dir="$WORK/$name"
  "$PY" "$SRC/tests/hf/make_tiny.py" --family deepseek_v3 --out "$dir" "$@" >/dev/null
  "$PY" "$SRC/tests/hf/hf_reference.py" --model "$dir" --tokens 0 --greedy 32 --grads --out "$WORK/$name.ref.safetensors"
  "$PY" "$SRC/tests/hf/hf_reference.py" --model "$dir" --tokens 0 --greedy 32 --mla absorbed \
    --out "$WORK/$name.abs.safetensors"
  echo "== deepseek_v3 $name"
  "$PARITY" --model "$dir" --ref "$WORK/$name.ref.safetensors" --absorbed "$WORK/$name.abs.safetensors"
}
check default
check q_proj --q-lora-rank 0
check bf16_shards --dtype bf16 --shards 3
check rotate_half --no-rope-interleave
echo "PASS"
