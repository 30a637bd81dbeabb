#!/usr/bin/env bash
# myriad redact: a corpus written and read back, a small tagger trained,
# saved and evaluated from its directory, and one-line errors for a missing
# tagger directory and a malformed corpus line.
source "$(dirname "$0")/lib.sh" "$@"

if "$MYRIAD" redact corpus --out "$WORK/ho.jsonl" --count 30 --seed 5 --split held-out >/dev/null 2>&1 &&
   [ "$(wc -l <"$WORK/ho.jsonl")" -eq 30 ] && grep -q '"spans":\[{' "$WORK/ho.jsonl"; then
  pass "corpus: 30 documents with spans"
else
  fail "corpus: $(head -c 300 "$WORK/ho.jsonl" 2>&1)"
fi

out="$("$MYRIAD" redact train --out "$WORK/tagger" --threads 1 --docs 200 --plain 50 --steps 150 --d-model 64 --d-ff 128 \
        --window 96 --held-out 20 --json 2>"$WORK/train.err")" && rc=0 || rc=$?
if [ "$rc" -eq 0 ] && [ -f "$WORK/tagger/model.safetensors" ] && [ -f "$WORK/tagger/tagger.json" ] &&
   grep -q '"micro"' <<<"$out" && grep -q "tagger step 150/150 loss" "$WORK/train.err"; then
  pass "train: tagger saved, held-out figures printed, progress logged"
else
  fail "train (rc $rc): $out $(tail -3 "$WORK/train.err")"
fi

out="$("$MYRIAD" redact eval --tagger "$WORK/tagger" --docs "$WORK/ho.jsonl" --json 2>&1)" && rc=0 || rc=$?
if [ "$rc" -eq 0 ] && grep -q '"docs": 30' <<<"$out" && grep -q '"PERSON"' <<<"$out"; then
  pass "eval: figures for the 30 documents of the file"
else
  fail "eval (rc $rc): $out"
fi

expect_one_line_error "missing tagger" "nowhere: not a tagger directory" \
  "$MYRIAD" redact eval --tagger "$WORK/nowhere" --count 2
printf '{"text":"abc","spans":[{"start":0,"end":9,"type":"PERSON"}]}\n' >"$WORK/bad.jsonl"
expect_one_line_error "span outside the text" "bad.jsonl:1: span \[0, 9\) lies outside" \
  "$MYRIAD" redact eval --tagger "$WORK/tagger" --docs "$WORK/bad.jsonl"
expect_one_line_error "an input that is not there" "bogus: open failed" "$MYRIAD" redact bogus
finish
