#!/usr/bin/env bash
# myriad serve --weights fp32|fp16|int8 end to end: for each format, greedy
# completions from the server (one request alone, then four at once, so the
# decode steps run batched) equal `myriad generate --weights` on the same
# prompt, and a format that does not exist is refused with a hint.
source "$(dirname "$0")/lib.sh" "$@"
command -v curl >/dev/null || { echo "FAIL: curl is required (apt-get install curl)"; exit 1; }
source "$(dirname "$0")/serve_lib.bash"
train_tiny_model

expect_error "serve --weights fp8" "--weights fp8 is not known .*fp32, fp16 or int8" \
  "$MYRIAD" serve --ckpt "$WORK/run" --port 0 --weights fp8

# A prompt on which the tiny model's fp32 and int8 greedy outputs differ.
PROMPT='The engine'
N=16
REQ='{"model":"tiny","prompt":"'"$PROMPT"'","max_tokens":'$N',"temperature":0}'
# text FILE: the completion's text of a response body, JSON-quoted.
text() { python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['choices'][0]['text']))" "$1"; }

for fmt in fp32 fp16 int8; do
  "$MYRIAD" generate --ckpt "$WORK/run" --prompt "$PROMPT" -n $N -t 0 --weights $fmt >"$WORK/gen.txt" 2>"$WORK/gen.log" \
    || { fail "generate --weights $fmt: $(tail -2 "$WORK/gen.log")"; continue; }
  # generate prints the prompt, the text and one newline.
  want=$(python3 -c "import json,sys; p, g = sys.argv[1], open(sys.argv[2]).read(); assert g.startswith(p) and g.endswith('\n'); print(json.dumps(g[len(p):-1]))" \
    "$PROMPT" "$WORK/gen.txt") || { fail "generate --weights $fmt does not echo the prompt: $(cat "$WORK/gen.txt")"; continue; }
  eval "want_$fmt=\$want"
  start_server --weights $fmt --no-prefix-cache
  grep -q "weights $fmt" "$WORK/serve.log" && pass "serve logs weights $fmt" || fail "no 'weights $fmt' in the log"
  code=$(curl -s -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' -d "$REQ" "$URL/v1/completions")
  [ "$code" = 200 ] || fail "$fmt: completion -> $code: $(cat "$WORK/body")"
  got=$(text "$WORK/body")
  [ "$got" = "$want" ] && pass "$fmt: serve equals generate ($got)" || fail "$fmt: serve $got, generate $want"
  for i in 1 2 3 4; do
    curl -s -o "$WORK/body$i" -H 'Content-Type: application/json' -d "$REQ" "$URL/v1/completions" &
  done
  wait $(jobs -p | grep -v "^$SERVER_PID$") 2>/dev/null || true
  same=0
  for i in 1 2 3 4; do [ "$(text "$WORK/body$i" 2>/dev/null)" = "$want" ] && same=$((same + 1)); done
  [ "$same" = 4 ] && pass "$fmt: four at once, each equals generate" || fail "$fmt: $same of 4 concurrent replies equal generate"
  stop_server || fail "$fmt: server did not stop cleanly"
done
[ "$want_fp32" != "$want_int8" ] && pass "int8 and fp32 differ on this prompt ($want_fp32 vs $want_int8): the format takes effect" \
  || fail "int8 and fp32 give the same text ($want_int8): the prompt no longer tells the formats apart"
finish
