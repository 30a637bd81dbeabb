#!/usr/bin/env bash
# `myriad generate --speculative ngram` (prompt-lookup drafts verified in one
# forward): greedy output identical to --speculative off for several draft
# lengths, on imported Llama-, Qwen3-MoE- and DeepSeek-V3-shaped (MLA) tiny
# models, with drafts accepted (the --stats line); sampling runs too.
# Args: build dir, source dir, myriad binary.
set -euo pipefail
SRC="$2"; MYRIAD="$3"
PY=/usr/bin/python3
WORK="$(mktemp -d /tmp/myriad-hf-spec.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
FAILS=0
P=$'def add(x): return x + 1\ndef sub(x): return x - 1\ndef add(x): return x + 1\ndef sub(x): return x - 1\ndef '
# Seeds whose random weights do not write an eos within 48 tokens of this prompt.
for spec in "llama 2" "qwen3_moe 0" "deepseek_v3 0"; do
  family=${spec% *}; seed=${spec#* }
  "$PY" "$SRC/tests/hf/make_tiny.py" --family "$family" --seed "$seed" --out "$WORK/$family" --tokenizer >/dev/null
  want="$("$MYRIAD" generate --hf "$WORK/$family" -p "$P" -n 48 -t 0 2>/dev/null)"
  for k in 1 4 8; do
    got="$("$MYRIAD" generate --hf "$WORK/$family" -p "$P" -n 48 -t 0 --speculative ngram --draft-tokens "$k" --stats 2>"$WORK/stats")"
    line="$(grep -o 'speculative ngram: .*' "$WORK/stats" || true)"
    if [ "$got" = "$want" ] && grep -q 'generated 48 tokens' "$WORK/stats"; then echo "ok: $family k=$k: identical to plain greedy; $line"
    else echo "FAIL: $family k=$k: speculative output differs from plain greedy"; FAILS=$((FAILS + 1)); fi
    if ! grep -qE 'acceptance by position 0?\.[0-9]*[1-9]|acceptance by position 1' "$WORK/stats"; then
      echo "FAIL: $family k=$k: no draft was accepted: $line"; FAILS=$((FAILS + 1))
    fi
  done
  n="$("$MYRIAD" generate --hf "$WORK/$family" -p "$P" -n 24 -t 0.8 --seed 3 --speculative ngram --stats 2>&1 >/dev/null |
       grep -oE 'generated [0-9]+ tokens' || true)"
  [ -n "$n" ] && echo "ok: $family sampling with drafts: $n" || { echo "FAIL: $family sampling with drafts"; FAILS=$((FAILS + 1)); }
done
[ "$FAILS" -eq 0 ] || { echo "$FAILS failed"; exit 1; }
echo "all passed"
