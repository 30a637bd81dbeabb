#!/usr/bin/env bash
# myriad serve end to end: trains a tiny model, serves it on a free port and
# talks to it with curl — completions and chat, streamed and not, greedy
# determinism and the prefix cache, bad requests, 64 concurrent clients, a
# client killed mid-stream, the API key, /metrics, then SIGTERM and the
# shutdown summary.
source "$(dirname "$0")/lib.sh" "$@"
command -v curl >/dev/null || { echo "FAIL: curl is required (apt-get install curl)"; exit 1; }
source "$(dirname "$0")/serve_lib.bash"
train_tiny_model

expect_error "serve without a checkpoint" "serve: .*nowhere" "$MYRIAD" serve --ckpt "$WORK/nowhere" --port 0

KEY="sk-e2e-$$"
export MYRIAD_API_KEY="$KEY"  # the server takes its key from the environment
AUTH=(-H "Authorization: Bearer $KEY")
# post PATH JSON -> body in $WORK/body, status echoed
post() { curl -s -o "$WORK/body" -w '%{http_code}' "${AUTH[@]}" -H 'Content-Type: application/json' -d "$2" "$URL$1"; }
# jq-like: py EXPR reads $WORK/body as j and prints EXPR
py() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($1)" "$WORK/body"; }
check() {  # check NAME CONDITION-EXPR (python over j)
  if [ "$(py "bool($2)" 2>/dev/null)" = "True" ]; then pass "$1"; else fail "$1: $(head -c 400 "$WORK/body")"; fi
}

start_server --max-body-bytes 65536
grep -q "127.0.0.1" <<<"$URL" && pass "binds 127.0.0.1 by default ($URL)" || fail "bound to $URL"

code=$(curl -s -o "$WORK/body" -w '%{http_code}' "$URL/health")
[ "$code" = 200 ] && pass "GET /health" || fail "GET /health -> $code"
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "${AUTH[@]}" "$URL/v1/models")
[ "$code" = 200 ] && check "GET /v1/models lists tiny" "j['data'][0]['id'] == 'tiny'" || fail "GET /v1/models -> $code"

# A prompt of more than one 16-token KV block, so a repeat can hit the cache.
PROMPT='Status and Result<T>: how every function that meets the outside world reports failure.'
REQ='{"model":"tiny","prompt":"'"$PROMPT"'","max_tokens":8,"temperature":0}'
code=$(post /v1/completions "$REQ")
[ "$code" = 200 ] || fail "completion -> $code: $(cat "$WORK/body")"
check "completion: text_completion with usage" \
  "j['object'] == 'text_completion' and j['usage']['total_tokens'] == j['usage']['prompt_tokens'] + j['usage']['completion_tokens'] and j['choices'][0]['finish_reason'] in ('length', 'stop') and 'cached_tokens' in j['usage']['prompt_tokens_details']"
check "completion: cost field" "j['cost']['total'] > 0 and j['cost']['currency'] == 'USD'"
first=$(py "json.dumps(j['choices'][0]['text'])")
prompt_tokens=$(py "j['usage']['prompt_tokens']")
[ "$prompt_tokens" -gt 16 ] && pass "prompt spans a full KV block ($prompt_tokens tokens)" \
  || fail "prompt is only $prompt_tokens tokens"
code=$(post /v1/completions "$REQ")
second=$(py "json.dumps(j['choices'][0]['text'])")
[ "$first" = "$second" ] && pass "greedy: same request, same text ($first)" || fail "greedy differs: $first vs $second"
check "second request reports cached_tokens > 0" "j['usage']['prompt_tokens_details']['cached_tokens'] > 0"
# Sampling with a seed is reproducible too.
SEEDED='{"model":"tiny","prompt":"'"$PROMPT"'","max_tokens":8,"temperature":1.0,"top_k":50,"seed":7}'
post /v1/completions "$SEEDED" >/dev/null
s1=$(py "json.dumps(j['choices'][0]['text'])")
post /v1/completions "$SEEDED" >/dev/null
s2=$(py "json.dumps(j['choices'][0]['text'])")
[ "$s1" = "$s2" ] && pass "seeded sampling: same seed, same text ($s1)" || fail "seeded sampling differs: $s1 vs $s2"

CHAT='{"model":"tiny","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something."}],"max_tokens":6,"temperature":0}'
code=$(post /v1/chat/completions "$CHAT")
[ "$code" = 200 ] || fail "chat -> $code"
check "chat: assistant message and usage" \
  "j['object'] == 'chat.completion' and j['choices'][0]['message']['role'] == 'assistant' and j['usage']['completion_tokens'] >= 1"
chat_text=$(py "json.dumps(j['choices'][0]['message']['content'])")

# Streaming: SSE chunks that parse, role first, [DONE] last, usage when asked.
STREAM='{"model":"tiny","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something."}],"max_tokens":6,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
curl -s -N "${AUTH[@]}" -H 'Content-Type: application/json' -d "$STREAM" "$URL/v1/chat/completions" >"$WORK/sse"
python3 - "$WORK/sse" "$chat_text" >"$WORK/sse.check" 2>&1 <<'EOF' && pass "chat stream: $(cat "$WORK/sse.check")" || fail "chat stream: $(cat "$WORK/sse.check")"
import json, sys
body = open(sys.argv[1]).read()
events = [e for e in body.split("\n\n") if e and not e.startswith(":")]
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
assert finish and finish[-1] in ("length", "stop"), finish
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1, chunks[-1]
assert text == json.loads(sys.argv[2]), (text, sys.argv[2])
print(f"{len(chunks)} chunks, text equals the non-streamed reply, usage {chunks[-1]['usage']}")
EOF
curl -s -N "${AUTH[@]}" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"int main","max_tokens":5,"temperature":0,"stream":true}' "$URL/v1/completions" >"$WORK/sse2"
tail -c 14 "$WORK/sse2" | grep -q 'data: \[DONE\]' && grep -q '"object":"text_completion"' "$WORK/sse2" \
  && pass "completions stream ends with [DONE]" || fail "completions stream: $(head -c 300 "$WORK/sse2")"

# Bad requests: the right status and OpenAI's error shape; the server goes on.
bad() {  # bad NAME STATUS PATH BODY
  local code
  code=$(post "$3" "$4")
  if [ "$code" = "$2" ] && [ "$(py "'message' in j['error'] and 'type' in j['error']" 2>/dev/null)" = True ]; then
    pass "$1 -> $2: $(py "j['error']['message'][:120]")"
  else
    fail "$1: expected $2, got $code: $(head -c 300 "$WORK/body")"
  fi
}
bad "malformed JSON" 400 /v1/chat/completions '{"model": "tiny", "messages": ['
bad "wrong type" 400 /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
bad "missing messages" 400 /v1/chat/completions '{"model":"tiny"}'
bad "missing prompt" 400 /v1/completions '{"model":"tiny"}'
bad "unknown model" 404 /v1/chat/completions '{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}'
bad "prompt longer than the context" 400 /v1/completions "{\"model\":\"tiny\",\"prompt\":\"$(printf 'word %.0s' $(seq 1 200))\"}"
python3 -c "import json; print(json.dumps({'model':'tiny','prompt':'x'*100000}))" >"$WORK/big.json"
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "${AUTH[@]}" -H 'Content-Type: application/json' --data-binary @"$WORK/big.json" "$URL/v1/completions")
[ "$code" = 413 ] && pass "oversized body -> 413" || fail "oversized body -> $code"
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "${AUTH[@]}" "$URL/v1/chat/completions")
[ "$code" = 405 ] && pass "GET on a POST route -> 405" || fail "GET /v1/chat/completions -> $code"
code=$(curl -s -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' -d "$CHAT" "$URL/v1/chat/completions")
[ "$code" = 401 ] && check "no API key -> 401 (invalid_api_key)" "j['error']['code'] == 'invalid_api_key'" || fail "no key -> $code"
code=$(post /v1/chat/completions "$CHAT")
[ "$code" = 200 ] && pass "still serving after the bad requests" || fail "after bad requests -> $code"

# 64 concurrent clients, half streaming.
pids=()
for i in $(seq 1 64); do
  if [ $((i % 2)) -eq 0 ]; then
    body='{"model":"tiny","prompt":"client '$i' says","max_tokens":8,"stream":true,"seed":'$i'}'
  else
    body='{"model":"tiny","messages":[{"role":"user","content":"client '$i'"}],"max_tokens":8,"seed":'$i'}'
    fi
  path=$([ $((i % 2)) -eq 0 ] && echo /v1/completions || echo /v1/chat/completions)
  curl -s -N -o "$WORK/c$i.out" -w '%{http_code}' "${AUTH[@]}" -H 'Content-Type: application/json' -d "$body" \
    "$URL$path" >"$WORK/c$i.code" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
okc=0
for i in $(seq 1 64); do
  if [ "$(cat "$WORK/c$i.code")" = 200 ]; then
    if [ $((i % 2)) -eq 0 ]; then tail -c 14 "$WORK/c$i.out" | grep -q '\[DONE\]' && okc=$((okc + 1))
    else python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['choices'][0]['finish_reason']" "$WORK/c$i.out" 2>/dev/null && okc=$((okc + 1)); fi
  fi
done
[ "$okc" -eq 64 ] && pass "64 concurrent clients all finished" || fail "only $okc of 64 concurrent clients finished"

# A client killed mid-stream: the server cancels or finishes it and goes on.
curl -s -N "${AUTH[@]}" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"a long story:","max_tokens":40,"temperature":1.0,"stream":true}' \
  "$URL/v1/completions" >"$WORK/killed.out" &
kpid=$!
for _ in $(seq 1 100); do [ -s "$WORK/killed.out" ] && break; sleep 0.02; done
kill -9 "$kpid" 2>/dev/null || true
wait "$kpid" 2>/dev/null || true
sleep 0.5
code=$(post /v1/chat/completions "$CHAT")
[ "$code" = 200 ] && pass "still serving after a client was killed mid-stream" || fail "after killed client -> $code"

curl -s "${AUTH[@]}" "$URL/metrics" >"$WORK/metrics"
for m in myriad_requests_total myriad_prompt_tokens_total myriad_cached_tokens_total myriad_completion_tokens_total \
         'myriad_kv_hit_tokens_total{tier="device"}' myriad_prefix_cache_hit_rate myriad_requests_running \
         myriad_requests_waiting myriad_kv_blocks_total 'myriad_billed_cost_total{kind="total"'; do
  grep -qF "$m" "$WORK/metrics" || fail "/metrics lacks $m"
done
reqs=$(awk '$1 == "myriad_requests_total" {print $2}' "$WORK/metrics")
[ "${reqs:-0}" -ge 70 ] && pass "/metrics: $reqs requests, $(grep -E '^myriad_http_completions_cancelled_total' "$WORK/metrics")" \
  || fail "/metrics requests_total=$reqs"

rc=0
stop_server || rc=$?
[ "$rc" -eq 0 ] && pass "SIGTERM: clean exit" || fail "SIGTERM: exit $rc: $(tail -5 "$WORK/serve.log")"
grep -q "shutdown summary" "$WORK/serve.log" && grep -q "hit rate" "$WORK/serve.log" && grep -qE "bill: .*total \\$" "$WORK/serve.log" \
  && pass "shutdown summary: $(grep -A4 'shutdown summary' "$WORK/serve.log" | tail -4 | tr '\n' ' ' | head -c 400)" \
  || fail "no shutdown summary: $(tail -6 "$WORK/serve.log")"

# Prices from a file, then a flag; a chat template stored with the run.
printf '[prices]\ninput_cache_miss = 2.0\ninput_cache_hit = 0.5\n' >"$WORK/prices.toml"
printf 'generation_prompt = "<|bot|>\\n"\n' >"$WORK/run/chat_template.toml"
start_server --prices "$WORK/prices.toml" --price-output 10
grep -qF "chat template: $WORK/run/chat_template.toml" "$WORK/serve.log" \
  && pass "chat template stored with the run is used" || fail "template: $(grep 'chat template' "$WORK/serve.log")"
post /v1/completions "$REQ" >/dev/null
check "prices from --prices and --price-output" \
  "abs(j['cost']['total'] - ((j['usage']['prompt_tokens'] - j['usage']['prompt_tokens_details']['cached_tokens']) * 2.0 + j['usage']['prompt_tokens_details']['cached_tokens'] * 0.5 + j['usage']['completion_tokens'] * 10) / 1e6) < 1e-12"
stop_server || fail "second server did not stop cleanly"
printf '[prices]\noutput = -3\n' >"$WORK/bad_prices.toml"
expect_error "a negative price" "prices.output=-3" "$MYRIAD" serve --ckpt "$WORK/run" --prices "$WORK/bad_prices.toml"
finish
