#!/usr/bin/env bash
# Bad Hugging Face folders, each with one clear error naming the file and
# the problem, and nothing written: an unknown architecture, a missing shard,
# a shape mismatch, an unsupported RoPE scaling, a truncated safetensors
# file, a tokenizer.json of an unknown model type; the same through
# `generate --hf`; and --ckpt with --hf at once.
# Args: build dir, source dir, myriad binary.
set -euo pipefail
BUILD="$(cd "$1" && pwd)"; SRC="$2"; MYRIAD="$3"
PY=/usr/bin/python3
WORK="$(mktemp -d /tmp/myriad-hf-bad.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
FAILS=0
"$PY" "$SRC/tests/hf/make_tiny.py" --family llama --out "$WORK/base" --tokenizer --shards 3 >/dev/null
variant() {  # NAME PYTHON-EDIT (run with d = the folder)
  cp -r "$WORK/base" "$WORK/$1"
  "$PY" -c "import json, os; d='$WORK/$1'
def edit(name, f):
    p = os.path.join(d, name); c = json.load(open(p)); f(c); json.dump(c, open(p, 'w'))
$2"
}
variant arch "edit('config.json', lambda c: c.update(architectures=['MambaForCausalLM']))"
variant shard "os.remove(os.path.join(d, 'model-00002-of-00003.safetensors'))"
variant shape "edit('config.json', lambda c: c.update(intermediate_size=96))"
variant rope "edit('config.json', lambda c: c.update(rope_scaling={'rope_type': 'longrope', 'factor': 4.0}))"
variant trunc "p = os.path.join(d, 'model-00003-of-00003.safetensors'); os.truncate(p, os.path.getsize(p) - 100)"
variant tok "edit('tokenizer.json', lambda c: c['model'].update(type='Unigram'))"

expect() {  # NAME PATTERN CMD...
  local name="$1" pattern="$2"; shift 2
  local out rc=0
  out="$("$@" 2>&1 >/dev/null)" || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then echo "FAIL: $name: exit $rc: $out"; FAILS=$((FAILS + 1)); return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then echo "FAIL: $name: no /$pattern/ in: $out"; FAILS=$((FAILS + 1)); return; fi
  echo "ok: $name -> $(grep -E -- "$pattern" <<<"$out" | head -1 | cut -c1-220)"
}
expect "unknown architecture" 'arch/config.json: architecture "MambaForCausalLM" is not supported \(supported: Llama' \
  "$MYRIAD" import "$WORK/arch" --out "$WORK/run_arch"
expect "missing shard" 'model-00002-of-00003.safetensors: missing \(model.safetensors.index.json lists' \
  "$MYRIAD" import "$WORK/shard" --out "$WORK/run_shard"
expect "shape mismatch" 'gate_proj.weight has shape \[128, 64\] but the config expects \[96, 64\]' \
  "$MYRIAD" import "$WORK/shape" --out "$WORK/run_shape"
expect "unsupported rope scaling" 'config.json: LlamaForCausalLM key "rope_scaling" rope type "longrope" is not supported' \
  "$MYRIAD" import "$WORK/rope" --out "$WORK/run_rope"
expect "truncated safetensors" 'model-00003-of-00003.safetensors: .*(truncated|beyond)' \
  "$MYRIAD" import "$WORK/trunc" --out "$WORK/run_trunc"
expect "tokenizer of an unknown model type" 'tok/tokenizer.json: model type "Unigram" is not supported' \
  "$MYRIAD" import "$WORK/tok" --out "$WORK/run_tok"
for v in arch shard shape rope trunc tok; do
  if [ -e "$WORK/run_$v/step_00000000" ] || [ -e "$WORK/run_$v/latest" ]; then
    echo "FAIL: a refused import ($v) wrote a checkpoint"; FAILS=$((FAILS + 1))
  fi
done
[ "$FAILS" -eq 0 ] && echo "ok: no refused import wrote a checkpoint"
expect "generate --hf refuses the same" 'architecture "MambaForCausalLM" is not supported' \
  "$MYRIAD" generate --hf "$WORK/arch" -p hi
expect "--ckpt and --hf at once" 'exactly one of --ckpt RUN_DIR and --hf HF_DIR' \
  "$MYRIAD" generate --hf "$WORK/base" --ckpt "$WORK/base" -p hi
"$MYRIAD" import "$WORK/base" --out "$WORK/run_ok" >/dev/null 2>&1
expect "a second import into the same run" 'already holds an imported model' \
  "$MYRIAD" import "$WORK/base" --out "$WORK/run_ok"
[ "$FAILS" -eq 0 ] || { echo "$FAILS failed"; exit 1; }
echo "all passed"
