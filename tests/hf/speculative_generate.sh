#!/usr/bin/env bash
# `myriad generate --speculative ngram|mtp|auto` (drafts verified in one
# forward): greedy output identical to --speculative off for several draft
# lengths, on imported Llama-, Qwen3-MoE- and DeepSeek-V3-shaped (MLA) tiny
# models, with n-gram drafts accepted (the --stats line); MTP and auto drafts
# on the DeepSeek-V3 model, whose MTP layer is imported; mtp refused with a
# clear message on a model without MTP modules; sampling runs too.
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
  modes="ngram"
  if [ "$family" = deepseek_v3 ]; then modes="ngram mtp auto"
  else
    out="$("$MYRIAD" generate --hf "$WORK/$family" -p "$P" -n 4 --speculative mtp 2>&1)" && rc=0 || rc=$?
    if [ "$rc" = 2 ] && grep -q 'needs a model with MTP modules' <<<"$out"; then echo "ok: $family: --speculative mtp refused: $out"
    else echo "FAIL: $family: --speculative mtp without MTP modules: rc $rc: $out"; FAILS=$((FAILS + 1)); fi
  fi
  for mode in $modes; do
    for k in 1 4 8; do
      got="$("$MYRIAD" generate --hf "$WORK/$family" -p "$P" -n 48 -t 0 --speculative "$mode" --draft-tokens "$k" --stats 2>"$WORK/stats")"
      line="$(grep -o "speculative $mode: .*" "$WORK/stats" || true)"
      if [ "$got" = "$want" ] && grep -q 'generated 48 tokens' "$WORK/stats"; then echo "ok: $family $mode k=$k: identical to plain greedy; $line"
      else echo "FAIL: $family $mode k=$k: speculative output differs from plain greedy"; FAILS=$((FAILS + 1)); fi
      # (Random MTP weights rarely agree with the model: acceptance is checked for n-gram drafts.)
      if [ "$mode" = ngram ] && ! grep -qE 'acceptance by position 0?\.[0-9]*[1-9]|acceptance by position 1' "$WORK/stats"; then
        echo "FAIL: $family k=$k: no draft was accepted: $line"; FAILS=$((FAILS + 1))
      fi
    done
  done
  for mode in $modes; do
    n="$("$MYRIAD" generate --hf "$WORK/$family" -p "$P" -n 24 -t 0.8 --seed 3 --speculative "$mode" --stats 2>&1 >/dev/null |
         grep -oE 'generated [0-9]+ tokens' || true)"
    [ -n "$n" ] && echo "ok: $family sampling with $mode drafts: $n" || { echo "FAIL: $family sampling with $mode drafts"; FAILS=$((FAILS + 1)); }
  done
done
[ "$FAILS" -eq 0 ] || { echo "$FAILS failed"; exit 1; }
echo "all passed"
