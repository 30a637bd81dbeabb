#!/usr/bin/env bash
# Open models against the independent PyTorch reference (tests/hf/hf_reference.py):
# tiny random folders of each family (tests/hf/make_tiny.py: dtypes, shards,
# tied heads, every RoPE scaling, q/k/v biases, q/k norms, MoE layer
# patterns), loaded directly (hf::LoadHfModel) and through `myriad import`.
# For each: training-forward logits and loss, KV-cached decode logits at
# every position (<= 1e-4 relative, fp32 compute), and 32 greedy tokens
# identical (tests/hf/hf_parity_main.cc). Then `myriad generate --hf` and
# `--ckpt` of the imported run give the same text.
# Args: build dir, source dir, myriad binary.
set -euo pipefail
BUILD="$(cd "$1" && pwd)"; SRC="$2"; MYRIAD="$3"
PY=/usr/bin/python3
PARITY="$BUILD/hf/hf_hf_parity"
[ -x "$PARITY" ] || { echo "FAIL: $PARITY is not built"; exit 1; }
WORK="$(mktemp -d /tmp/myriad-hf-import.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
FAILS=0
check() {  # NAME FAMILY MAKE_TINY_ARGS...
  local name="$1" family="$2"; shift 2
  local dir="$WORK/$name"
  "$PY" "$SRC/tests/hf/make_tiny.py" --family "$family" --out "$dir" --tokenizer "$@" >"$WORK/$name.log" 2>&1 \
    || { echo "FAIL: $name: make_tiny: $(tail -3 "$WORK/$name.log")"; FAILS=$((FAILS + 1)); return; }
  "$PY" "$SRC/tests/hf/hf_reference.py" --model "$dir" --tokens 7 --greedy 32 --out "$WORK/$name.ref.safetensors" \
    >>"$WORK/$name.log" 2>&1 || { echo "FAIL: $name: reference: $(tail -3 "$WORK/$name.log")"; FAILS=$((FAILS + 1)); return; }
  local out
  if out="$("$PARITY" --hf "$dir" --ref "$WORK/$name.ref.safetensors" 2>&1)"; then
    echo "ok: $name (--hf): $(grep -v '^\[' <<<"$out" | tr -s ' ' | awk '{printf "%s; ", $0}')"
  else
    echo "FAIL: $name (--hf):"; echo "$out"; FAILS=$((FAILS + 1)); return
  fi
  if "$MYRIAD" import "$dir" --out "$WORK/$name.run" >"$WORK/$name.import.log" 2>&1 &&
     out="$("$PARITY" --ckpt "$WORK/$name.run" --ref "$WORK/$name.ref.safetensors" 2>&1)"; then
    echo "ok: $name (myriad import): $(grep -c ' ok$' <<<"$out") checks"
  else
    echo "FAIL: $name (myriad import):"; cat "$WORK/$name.import.log"; echo "${out:-}"; FAILS=$((FAILS + 1))
  fi
}
check llama            llama
check llama_tied_fp16  llama --tie --dtype fp16
check llama_linear     llama --rope-scaling linear --rope-factor 2
check llama3_scaling   llama --rope-scaling llama3 --rope-factor 8 --dtype bf16 --shards 3
check llama_yarn       llama --rope-scaling yarn --rope-factor 4
check qwen2            qwen2
check qwen2_untied     qwen2 --no-tie --dtype bf16 --shards 2
check qwen3            qwen3
check qwen3_yarn       qwen3 --rope-scaling yarn --rope-factor 4 --yarn-attention-factor 1.2
check qwen3_moe        qwen3_moe
check qwen3_moe_allmoe qwen3_moe --mlp-only-layers "" --dtype bf16 --shards 2
check qwen3_moe_step2  qwen3_moe --mlp-only-layers "" --decoder-sparse-step 2 --layers 4
check qwen3_moe_nonorm qwen3_moe --norm-topk-prob 0 --mlp-only-layers 0

# The CLI on a folder and on its import: the same text.
a="$("$MYRIAD" generate --hf "$WORK/qwen3_moe" -p "The report" -n 16 2>/dev/null)"
b="$("$MYRIAD" generate --ckpt "$WORK/qwen3_moe.run" -p "The report" -n 16 2>/dev/null)"
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok: generate --hf and --ckpt of the import agree (${#a} bytes)"
else echo "FAIL: generate --hf gave '$a', --ckpt of the import '$b'"; FAILS=$((FAILS + 1)); fi

[ "$FAILS" -eq 0 ] || { echo "$FAILS failed"; exit 1; }
echo "all passed"
