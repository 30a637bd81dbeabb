#!/usr/bin/env bash
# A hung (SIGSTOPped, not dead) Redis under `myriad serve --kv-redis`: a
# client streaming back to back keeps getting tokens with no gap near the
# Redis timeout (2 s) while Redis is frozen for 3 s and new requests, whose
# prefixes must be looked up there, arrive; those are served (no remote hit);
# the log has one outage line per connection and the reconnect after
# SIGCONT; and the blocks in Redis are intact afterwards (a fresh server
# loads them and gives the greedy output of a server without any cache).
# Usage: serve_redis_freeze.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
source "$(dirname "$0")/serve_lib.bash"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
command -v redis-server >/dev/null || { echo "FAIL: redis-server not installed (hint: scripts/install-deps.sh)"; exit 1; }
export OMP_NUM_THREADS=1
train_tiny_model

P3="Tokens are packed into rows of the sequence length plus one, and the loader keeps a cursor"

echo "== reference: no prefix cache"
start_server --no-prefix-cache
REF=$(complete "$URL" "$P3" | cut -f1) || { fail "reference completion"; finish; exit 1; }
stop_server

start_redis

echo "== Redis frozen for 3 s under a streaming client"
start_server --kv-redis "$REDIS" --kv-write-through --kv-load always
complete "$URL" "$P3" >/dev/null
for _ in $(seq 50); do [ "$(redis-cli -p "$RPORT" dbsize)" -ge 2 ] && break; sleep 0.1; done
# The client: streams one completion after another for 7 s and records when
# each token arrives; prints the largest gap between consecutive tokens in
# the window given by the files freeze_at / thaw_at (unix seconds).
"$PY" - "$URL" "$WORK" >"$WORK/client.out" 2>"$WORK/client.err" <<'PYEOF' &
import http.client, json, sys, time, urllib.parse
url, work = sys.argv[1], sys.argv[2]
u = urllib.parse.urlparse(url)
times, streams = [], 0
end = time.time() + 7.0
body = json.dumps({"model": "tiny", "prompt": "The loader keeps a cursor", "max_tokens": 40,
                   "temperature": 0, "stream": True})
while time.time() < end:
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    for line in r:
        if line.startswith(b"data: {"):
            times.append(time.time())
    c.close()
    streams += 1
def read(name):
    try: return float(open(f"{work}/{name}").read())
    except Exception: return None
a, b = read("freeze_at"), read("thaw_at")
w = [t for t in times if a is not None and b is not None and a <= t <= b]
gaps = [y - x for x, y in zip(w, w[1:])]
print(f"streams {streams} tokens {len(times)} tokens_while_frozen {len(w)} max_gap_while_frozen {max(gaps) if gaps else -1:.3f}")
PYEOF
CLIENT=$!
sleep 1.5
kill -STOP "$RPID"
date +%s.%N >"$WORK/freeze_at"
# New requests while frozen: fresh prompts (two full blocks each) whose
# prefixes the server must look up in Redis.
served=0
for i in 1 2 3; do
  r=$(complete "$URL" "Request $i asks about a configuration file that names every key and value it holds today") && served=$((served + 1))
  sleep 0.5
done
sleep 1
date +%s.%N >"$WORK/thaw_at"
kill -CONT "$RPID"
[ "$served" -eq 3 ] && pass "3 new requests served while Redis was frozen" || fail "only $served of 3 requests served while Redis was frozen"
wait "$CLIENT" || fail "streaming client: $(tail -5 "$WORK/client.err")"
out=$(cat "$WORK/client.out"); echo "client: $out"
gap=$(sed -n 's/.*max_gap_while_frozen \([-0-9.]*\).*/\1/p' <<<"$out")
n=$(sed -n 's/.*tokens_while_frozen \([0-9]*\).*/\1/p' <<<"$out")
if [ "${n:-0}" -gt 10 ] && "$PY" -c "import sys; sys.exit(0 if 0 <= float('$gap') < 0.5 else 1)"; then
  pass "streams kept going while Redis was frozen: $n tokens, largest gap ${gap}s (< 0.5 s; Redis timeout 2 s)"
else
  fail "streams stalled while Redis was frozen: $n tokens, largest gap ${gap}s"
fi
sleep 1.5  # past the retry interval: the next command reconnects
r=$(complete "$URL" "$P3"); [ "$(cut -f1 <<<"$r")" = "$REF" ] && pass "after the thaw: same greedy output as without a cache" || fail "after the thaw: '$(cut -f1 <<<"$r")' vs '$REF'"
complete "$URL" "A fresh question after the thaw, about the manifest of checksums that a loader reads first" >/dev/null || true
sleep 0.5
grep -E "redis kv tier .*outage:" "$WORK/serve.log" | head -3
grep -E "redis kv tier .*reconnected" "$WORK/serve.log" | head -3
no=$(grep -cE "redis kv tier .*outage:" "$WORK/serve.log" || true)
nr=$(grep -cE "redis kv tier .*reconnected" "$WORK/serve.log" || true)
[ "$no" -ge 1 ] && [ "$no" -le 2 ] && pass "the log has the outage ($no lines: one per connection at most)" || fail "outage lines in the log: $no (want 1-2)"
[ "$nr" -ge 1 ] && pass "the log has the reconnect ($nr lines)" || fail "no reconnect line in the log"
late=$(curl -sf "$URL/metrics" | awk '$1 == "myriad_kv_late_lookups_total" {print $2}')
[ "${late:-0}" -ge 1 ] && pass "metrics: $late remote lookups came too late and were skipped" || fail "myriad_kv_late_lookups_total = ${late:-none}"
stop_server

echo "== the blocks in Redis are intact"
start_server --kv-redis "$REDIS" --kv-load always
r=$(complete "$URL" "$P3")
if [ "$(cut -f1 <<<"$r")" = "$REF" ] && [ "$(cut -f3 <<<"$r")" -ge 16 ]; then
  pass "a fresh server loads the prefix from Redis ($(cut -f3 <<<"$r") cached tokens): same greedy output"
else
  fail "fresh server after the freeze: '$(cut -f1 <<<"$r")' (want '$REF'), cached $(cut -f3 <<<"$r")"
fi
stop_server
finish
