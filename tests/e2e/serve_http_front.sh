#!/usr/bin/env bash
# The HTTP front against hostile or merely ordinary clients (issue 17,
# hardening), on the real server over loopback:
#   - a kept-alive connection gets /health in under 5 ms at p50 (without
#     TCP_NODELAY, Nagle's algorithm and the client's delayed ACK added
#     ~40 ms to every response);
#   - a body with invalid UTF-8, and a number too large for a double (1e999),
#     are 400 invalid_json, not 500; the server keeps serving;
#   - with a small KV pool (--kv-blocks 2: 32 tokens), a chat request without
#     max_tokens is served with what fits (finish_reason "length"), and a
#     prompt that leaves no room is a 400 naming --kv-blocks.
# Usage: serve_http_front.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
source "$(dirname "$0")/serve_lib.bash"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
train_tiny_model
start_server

out=$("$PY" - "$URL" <<'PYEOF'
import http.client, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port)
ts = []
for _ in range(40):
    t0 = time.perf_counter()
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    assert r.status == 200, r.status
    ts.append(time.perf_counter() - t0)
ts.sort()
print(f"{ts[len(ts) // 2] * 1e3:.2f}")
PYEOF
) || { fail "keep-alive client failed: $out"; }
if "$PY" -c "import sys; sys.exit(0 if float('$out') < 5 else 1)" 2>/dev/null; then
  pass "kept-alive /health: p50 $out ms (< 5 ms)"
else
  fail "kept-alive /health: p50 $out ms (want < 5 ms: TCP_NODELAY?)"
fi

# status_of BODY_FILE -> "HTTP_CODE error.code"
status_of() {
  curl -s -o "$WORK/resp.json" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
    --data-binary @"$1" || true
  printf ' '
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["code"])' "$WORK/resp.json" 2>/dev/null || echo "?"
}
printf '{"model":"tiny","prompt":"\xff\xfe not UTF-8","max_tokens":2}' >"$WORK/utf8.json"
printf '{"model":"tiny","prompt":"x","max_tokens":2,"temperature":1e999}' >"$WORK/huge.json"
for c in utf8 huge; do
  got=$(status_of "$WORK/$c.json")
  [ "$got" = "400 invalid_json" ] && pass "$c body: $got" || fail "$c body: got '$got', want '400 invalid_json'"
done
r=$(curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' -d '{"model":"tiny","prompt":"The","max_tokens":3}') &&
  pass "still serving after the bad bodies" || fail "a completion after the bad bodies failed"
stop_server || fail "server exit"

start_server --kv-blocks 2
r=$(curl -s "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"temperature":0}')
"$PY" - "$r" <<'PYEOF' && pass "--kv-blocks 2: a chat without max_tokens is served with what fits" || fail "--kv-blocks 2 chat: $r"
import json, sys
j = json.loads(sys.argv[1])
u = j["usage"]
print(f"prompt {u['prompt_tokens']} + completion {u['completion_tokens']} tokens, finish_reason {j['choices'][0]['finish_reason']}")
sys.exit(0 if u["prompt_tokens"] + u["completion_tokens"] <= 32 and u["completion_tokens"] >= 1 else 1)
PYEOF
long=$("$PY" -c 'print(" ".join(["checkpoint", "manifest"] * 4))')  # 32-63 tokens: within the context, beyond the pool
r=$(curl -s -w ' %{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny\",\"prompt\":\"$long\",\"max_tokens\":2}")
grep -q -- '--kv-blocks' <<<"$r" && [ "${r##* }" = 400 ] && pass "a prompt that fills the pool: 400 naming --kv-blocks" ||
  fail "a prompt that fills the pool: $r"
stop_server || fail "server exit"
finish
