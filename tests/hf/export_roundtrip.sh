#!/usr/bin/env bash
# `myriad export --hf` round trips (docs/open-models.md, "Export"):
#  (a) every make_tiny.py family and variant (tests/hf/export_check.py:
#      rope scalings, tied heads, F32/BF16/F16, shards in and out) exported
#      and read back by LoadHfModel: the same architecture, ModelConfig and
#      bit-identical parameters, and byte-identical tensors where the dtype
#      is kept (hf_check same);
#  (b) the independent PyTorch reference (hf_reference.py, our "would
#      transformers load it" oracle) gives the same logits and loss, bit for
#      bit, on the exported folder as on the original;
#  (c) a model exported from a demo run: configs/tiny.toml (the demo's
#      architecture: shared experts, sigmoid scores with a trained selection
#      bias, a dense prefix, MTP) with MLA turned on, trained by `myriad train`,
#      exports as DeepseekV3ForCausalLM, loads back with LoadHfModel and
#      greedy-decodes the same 32 tokens as its checkpoint; the reference on
#      the exported folder gives them too (where its top1-top2 margin is not
#      within 1e-4 of a tie). A Qwen3-MoE-shaped and a dense (Llama-shaped)
#      run do the same.
#  And the verb's errors: a non-empty output, the demo config with GQA (it
#  needs MLA), MTP without DeepSeek-V3.
# Args: build dir, source dir, myriad binary.
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
SRC="$2"
MYRIAD="$3"
CHECK="$BUILD/hf/hf_check"
[ -x "$CHECK" ] || { echo "FAIL: $CHECK is not built (hint: ninja -C $BUILD hf_check)"; exit 1; }
source "$SRC/tests/e2e/lib.sh" "$MYRIAD" "$SRC"
PY=/usr/bin/python3
export OMP_NUM_THREADS=2

# (a) and (b)
"$PY" "$SRC/tests/hf/export_check.py" make "$WORK/src" >"$WORK/variants" 2>"$WORK/make.log" ||
  { echo "FAIL: make_tiny: $(tail -3 "$WORK/make.log")"; exit 1; }
names=()
while read -r name args; do
  # shellcheck disable=SC2086
  if ! "$MYRIAD" export "$WORK/src/$name" --hf "$WORK/out/$name" $args 2>"$WORK/export_$name.log"; then
    fail "export $name: $(tail -1 "$WORK/export_$name.log")"
    continue
  fi
  if out=$("$CHECK" same "$WORK/src/$name" "$WORK/out/$name" 2>&1); then pass "$name ($args): $out"
  else fail "$name: $out"; fi
  names+=("$name")
done <"$WORK/variants"
[ "${#names[@]}" -ge 14 ] || fail "only ${#names[@]} variants exported"
[ -f "$WORK/out/qwen2/model.safetensors.index.json" ] && [ ! -f "$WORK/out/qwen2/model.safetensors" ] &&
  pass "qwen2 exported in shards (--max-shard-size 60KB)" || fail "qwen2: no shards"
while read -r line; do
  case "$line" in ok:*) pass "${line#ok: }" ;; *) fail "${line#FAIL: }" ;; esac
done < <("$PY" "$SRC/tests/hf/export_check.py" compare "$WORK/src" "$WORK/out" "${names[@]}" 2>&1)

# (c) trained runs (100 steps: enough for greedy output that is not one token repeated)
make_tiny_data
train_run() {  # NAME SETTINGS...: configs/tiny.toml with SETTINGS for 100 steps into $WORK/NAME
  local name="$1"; shift
  local s=()
  for kv in "$@"; do s+=(--set "$kv"); done
  "$MYRIAD" train --config "$SRC/configs/tiny.toml" --set data.dir="$WORK/data" --set train.steps=100 \
    --set train.ckpt_every=0 --set train.eval_every=0 --set train.precision=fp32 --set train.out_dir="$WORK/$name" \
    "${s[@]}" -q 2>"$WORK/$name.log" || { fail "training $name: $(tail -3 "$WORK/$name.log")"; return 1; }
}
PROMPT=2,40,41,42,43
roundtrip_run() {  # NAME ARCH
  local name="$1" arch="$2"
  "$MYRIAD" export "$WORK/$name" --hf "$WORK/$name-hf" 2>"$WORK/$name-export.log" ||
    { fail "export $name: $(tail -1 "$WORK/$name-export.log")"; return; }
  grep -q "\"$arch\"" "$WORK/$name-hf/config.json" && pass "$name exports as $arch" || fail "$name: not $arch"
  [ -f "$WORK/$name-hf/tokenizer.model" ] && pass "$name: the run's tokenizer copied" || fail "$name: no tokenizer"
  local ck hf ref margin diff
  ck=$("$CHECK" greedy "$WORK/$name" "$PROMPT" 32)
  hf=$("$CHECK" greedy "$WORK/$name-hf" "$PROMPT" 32 "$WORK/$name.logits")
  [ "$ck" = "$hf" ] && pass "$name: 32 greedy tokens of the export (LoadHfModel) == the checkpoint's: $ck" ||
    fail "$name: greedy differs: checkpoint $ck, export $hf"
  [ "$(tr , '\n' <<<"$ck" | sort -u | wc -l)" -ge 3 ] && pass "$name: the greedy tokens are not one or two repeated" ||
    fail "$name: too little training: the greedy tokens are $ck"
  read -r ref margin diff < <("$PY" "$SRC/tests/hf/export_check.py" greedy "$WORK/$name-hf" "$PROMPT" 32 "$WORK/$name.logits")
  if [ "$ref" = "$ck" ]; then
    if "$PY" -c "import sys; sys.exit(0 if float('$diff') <= 1e-4 else 1)"; then
      pass "$name: the reference on the export decodes the same tokens (min margin $margin), logits within $diff relative"
    else fail "$name: the reference's logits on the export differ by $diff relative"; fi
  elif "$PY" -c "import sys; sys.exit(0 if float('$margin') < 1e-4 else 1)"; then
    echo "note: $name: the reference differs at a near-tie (margin $margin): $ref"
  else fail "$name: the reference on the export decodes $ref, the checkpoint $ck (min margin $margin)"; fi
}
MLA=(model.score_func=sigmoid model.mtp_after_final_norm=true model.kv_lora_rank=16 model.q_lora_rank=16
     model.qk_nope_head_dim=8 model.qk_rope_head_dim=4 model.v_head_dim=8)
if train_run demo_mla "${MLA[@]}" train.lr=6e-3; then
  roundtrip_run demo_mla DeepseekV3ForCausalLM
  read -r b n < <("$PY" "$SRC/tests/hf/export_check.py" bias "$WORK/demo_mla-hf")
  "$PY" -c "import sys; sys.exit(0 if float('$b') > 0 and int('$n') == 2 else 1)" &&
    pass "demo_mla: the trained selection biases exported as e_score_correction_bias ($n tensors, max |b| $b)" ||
    fail "demo_mla: e_score_correction_bias: $n tensors, max |b| $b"
fi
MOE=(model.n_shared_experts=0 model.qk_norm=true model.bias_update_rate=0 model.mtp_depth=0)
train_run qwen3moe "${MOE[@]}" && roundtrip_run qwen3moe Qwen3MoeForCausalLM
train_run dense model.n_routed_experts=0 model.n_dense_layers=2 model.mtp_depth=0 &&
  roundtrip_run dense LlamaForCausalLM

# Errors (after the progress lines, one line saying why).
mkdir -p "$WORK/busy" && echo x >"$WORK/busy/file"
expect_error "a non-empty output is refused" "busy: exists and is not empty \(hint: --force replaces it\)" \
  "$MYRIAD" export "$WORK/qwen3moe" --hf "$WORK/busy"
[ "$(cat "$WORK/busy/file")" = x ] && pass "and left as it was" || fail "the non-empty output was changed"
"$MYRIAD" export "$WORK/qwen3moe" --hf "$WORK/busy" --force 2>/dev/null && [ ! -e "$WORK/busy/file" ] &&
  [ -f "$WORK/busy/config.json" ] && pass "--force replaces it" || fail "--force did not replace it"
train_run demo_shaped train.steps=5 || true
expect_error "the tiny config with GQA (shared experts, MTP) is refused: DeepSeek-V3 needs MLA" \
  "shared experts \(model.n_shared_experts=1\) have no Qwen3MoeForCausalLM equivalent, and DeepseekV3ForCausalLM, which has them, needs MLA: set model.kv_lora_rank" \
  "$MYRIAD" export "$WORK/demo_shaped" --hf "$WORK/demo_shaped-hf"
[ ! -e "$WORK/demo_shaped-hf" ] && pass "and nothing is written" || fail "a refused export left a folder"
train_run mtp "${MOE[@]}" model.mtp_depth=1 train.steps=20 || true
expect_error "MTP modules are refused without --drop-mtp" \
  "multi-token prediction modules \(model.mtp_depth=1\) have no Qwen3MoeForCausalLM equivalent \(hint: --drop-mtp" \
  "$MYRIAD" export "$WORK/mtp" --hf "$WORK/mtp-hf"
if "$MYRIAD" export "$WORK/mtp" --hf "$WORK/mtp-hf" --drop-mtp 2>/dev/null; then
  ck=$("$CHECK" greedy "$WORK/mtp" "$PROMPT" 16)
  hf=$("$CHECK" greedy "$WORK/mtp-hf" "$PROMPT" 16)
  [ "$ck" = "$hf" ] && pass "--drop-mtp: the main model's greedy tokens unchanged" || fail "--drop-mtp: $ck vs $hf"
else fail "--drop-mtp export failed"; fi
expect_error "bf16 of fp32-trained weights is refused" "is not exactly representable in BF16" \
  "$MYRIAD" export "$WORK/qwen3moe" --hf "$WORK/bf16" --dtype bf16
finish
