#!/usr/bin/env bash
# Imported open models against the independent PyTorch reference
# tests/hf/hf_reference.py: tiny random folders of every family
# (tests/hf/make_tiny.py: dtypes, shards, tied heads, every RoPE scaling,
# q/k/v biases, q/k norms, MoE layer patterns; DeepSeek-V3's MLA with
# q_b_proj and q_proj, the sigmoid group-limited router, shared experts, the
# dense prefix, an MTP layer, yarn with mscale_all_dim, interleaved and
# rotate-half RoPE), loaded directly (--hf: hf::LoadHfModel) and through
# `myriad import` (--ckpt: the run it writes). For each, `hf_check parity`
# (tests/hf/check_main.cc says how): training-forward logits and loss, MTP
# logits and loss, every gradient (the reference runs with --grads), 32
# greedy tokens identical and their logits, and the KV-cached decode at every
# position (DeepSeek-V3: the absorbed latent cache against the reference's
# --mla absorbed run), each within 1e-4 relative in fp32. Then `myriad
# generate --hf` and `--ckpt` of an imported run give the same text.
# Args: build dir, source dir, myriad binary.
set -euo pipefail
BUILD="$(cd "$1" && pwd)"; SRC="$2"; MYRIAD="$3"
PY=/usr/bin/python3
CHECK="$BUILD/hf/hf_check"
[ -x "$CHECK" ] || { echo "FAIL: $CHECK is not built (hint: ninja -C $BUILD hf_check)"; exit 1; }
WORK="$(mktemp -d /tmp/myriad-hf-parity.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=2
FAILS=0
summary() { grep -v '^\[' | tr -s ' ' | awk '{printf "%s; ", $0}'; }
check() {  # NAME FAMILY MAKE_TINY_ARGS...
  local name="$1" family="$2"; shift 2
  local dir="$WORK/$name" abs=() out
  "$PY" "$SRC/tests/hf/make_tiny.py" --family "$family" --out "$dir" --tokenizer "$@" >"$WORK/$name.log" 2>&1 \
    || { echo "FAIL: $name: make_tiny: $(tail -3 "$WORK/$name.log")"; FAILS=$((FAILS + 1)); return; }
  "$PY" "$SRC/tests/hf/hf_reference.py" --model "$dir" --tokens 7 --greedy 32 --grads \
    --out "$WORK/$name.ref.safetensors" >>"$WORK/$name.log" 2>&1 ||
    { echo "FAIL: $name: reference: $(tail -3 "$WORK/$name.log")"; FAILS=$((FAILS + 1)); return; }
  if [ "$family" = deepseek_v3 ]; then
    "$PY" "$SRC/tests/hf/hf_reference.py" --model "$dir" --tokens 7 --mla absorbed \
      --out "$WORK/$name.abs.safetensors" >>"$WORK/$name.log" 2>&1 ||
      { echo "FAIL: $name: absorbed reference: $(tail -3 "$WORK/$name.log")"; FAILS=$((FAILS + 1)); return; }
    abs=(--absorbed "$WORK/$name.abs.safetensors")
  fi
  if out="$("$CHECK" parity --hf "$dir" --ref "$WORK/$name.ref.safetensors" "${abs[@]}" 2>&1)"; then
    echo "ok: $name (--hf): $(summary <<<"$out")"
  else
    echo "FAIL: $name (--hf):"; echo "$out"; FAILS=$((FAILS + 1)); return
  fi
  if "$MYRIAD" import "$dir" --out "$WORK/$name.run" >"$WORK/$name.import.log" 2>&1 &&
     out="$("$CHECK" parity --ckpt "$WORK/$name.run" --ref "$WORK/$name.ref.safetensors" "${abs[@]}" 2>&1)"; then
    echo "ok: $name (myriad import, --ckpt): $(grep -c ' ok$' <<<"$out") checks"
  else
    echo "FAIL: $name (myriad import, --ckpt):"; cat "$WORK/$name.import.log"; echo "${out:-}"; FAILS=$((FAILS + 1))
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
check deepseek_v3             deepseek_v3  # q_lora_rank 32, MTP 1, yarn mscale, interleaved RoPE
check deepseek_v3_q_proj      deepseek_v3 --q-lora-rank 0
check deepseek_v3_bf16_shards deepseek_v3 --dtype bf16 --shards 3
check deepseek_v3_rotate_half deepseek_v3 --no-rope-interleave

# The CLI on a folder and on its import: the same text.
a="$("$MYRIAD" generate --hf "$WORK/qwen3_moe" -p "The report" -n 16 2>/dev/null)"
b="$("$MYRIAD" generate --ckpt "$WORK/qwen3_moe.run" -p "The report" -n 16 2>/dev/null)"
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok: generate --hf and --ckpt of the import agree (${#a} bytes)"
else echo "FAIL: generate --hf gave '$a', --ckpt of the import '$b'"; FAILS=$((FAILS + 1)); fi

[ "$FAILS" -eq 0 ] || { echo "$FAILS failed"; exit 1; }
echo "all passed"
