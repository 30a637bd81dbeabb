# The KV-tier checks of `myriad serve` (serve_tiers.sh on our tiny model,
# tests/hf/serve_open_models.sh on imported open models): sourced after
# lib.sh and serve_lib.bash, not run. run_tier_checks MIN MAX: the four
# prompts must have MIN..MAX tokens (2+ full 16-token blocks, and room for 12
# more in the context); the server's model is serve_lib.bash's $SERVE_MODEL.
# Needs redis-server.
run_tier_checks() {
local PMIN="$1" PMAX="$2"
# Prompts of 3+ full 16-token blocks on the tiny model (context 64).
P1="The configuration file names every key and value it holds, each with a default"
P2="Every checkpoint directory keeps a manifest with checksums of the files it lists for the loader"
P3="Tokens are packed into rows of the sequence length plus one, and the loader keeps a cursor"
P4="A status carries a message that names the thing, the value and a hint for the user to follow"

tier_hits() {  # URL TIER -> tokens served from that tier so far
  curl -sf "$1/metrics" | awk -v t="tier=\"$2\"" '$1 ~ /^myriad_kv_hit_tokens_total/ && index($0, t) {print $2}'
}
# expect NAME GOT WANT_TEXT MIN_CACHED
expect() {
  local name="$1" got="$2" want="$3" min="$4"
  local text cached
  text=$(cut -f1 <<<"$got"); cached=$(cut -f3 <<<"$got")
  if [ "$text" != "$want" ]; then fail "$name: output differs from the no-cache server: '$text' vs '$want'"; return; fi
  if [ "${cached:-0}" -lt "$min" ]; then fail "$name: cached_tokens $cached < $min"; return; fi
  pass "$name: same greedy output as without a cache, cached_tokens $cached"
}

echo "== reference: no prefix cache"
start_server --no-prefix-cache
declare -A REF
for p in "$P1" "$P2" "$P3" "$P4"; do
  r=$(complete "$URL" "$p") || { fail "reference completion"; finish; exit 1; }
  REF["$p"]=$(cut -f1 <<<"$r")
  n=$(cut -f2 <<<"$r")
  [ "$n" -ge "$PMIN" ] && [ "$n" -le "$PMAX" ] || fail "prompt '$p' has $n tokens (the test needs $PMIN-$PMAX: 2+ full blocks, room for 12 more in the context)"
done
stop_server

echo "== host tier: a device pool of 8 blocks, prompts evicting each other"
start_server --max-batch 1 --kv-blocks 8 --kv-host-blocks 64
for p in "$P1" "$P2" "$P3" "$P4"; do complete "$URL" "$p" >/dev/null; done
r=$(complete "$URL" "$P1"); expect "host tier hit" "$r" "${REF[$P1]}" 16
h=$(tier_hits "$URL" host)
[ "${h:-0}" -gt 0 ] && pass "metrics: $h prompt tokens served from the host tier" || fail "no host tier hits in /metrics"
stop_server

echo "== disk tier across a restart"
start_server --kv-disk "$WORK/kvdisk" --kv-load always
complete "$URL" "$P2" >/dev/null
stop_server
n=$(ls "$WORK/kvdisk" | grep -c '\.kvb$' || true)
[ "$n" -gt 0 ] && pass "shutdown wrote $n blocks to the disk tier" || fail "no blocks on disk after shutdown"
start_server --kv-disk "$WORK/kvdisk" --kv-load always
r=$(complete "$URL" "$P2"); expect "restarted server hits its disk tier" "$r" "${REF[$P2]}" 16
h=$(tier_hits "$URL" disk)
[ "${h:-0}" -gt 0 ] && pass "metrics: $h prompt tokens served from disk" || fail "no disk tier hits in /metrics"
stop_server

echo "== a corrupt disk block is detected and recomputed"
for f in "$WORK"/kvdisk/*.kvb; do
  "$PY" - "$f" <<'PYEOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[len(b) // 2] ^= 0xFF
open(p, 'wb').write(b)
PYEOF
done
start_server --kv-disk "$WORK/kvdisk" --kv-load always
r=$(complete "$URL" "$P2")
text=$(cut -f1 <<<"$r"); cached=$(cut -f3 <<<"$r")
if [ "$text" = "${REF[$P2]}" ] && [ "$cached" -eq 0 ]; then pass "corrupt blocks refused: recomputed, same output, cached_tokens 0"
else fail "corrupt disk blocks: output '$text' (want '${REF[$P2]}'), cached_tokens $cached (want 0)"; fi
grep -qiE "checksum|corrupt" "$WORK/serve.log" && pass "the log names the corrupt block" || fail "no corruption message in the log"
stop_server

echo "== two servers share prefixes through Redis"
start_redis
start_server --kv-redis "$REDIS" --kv-write-through
A_URL="$URL"
# start_peer NAME ARGS...: another server on the same Redis, its own log;
# sets PEER_PID and PEER_URL.
start_peer() {
  local name="$1"; shift
  rm -f "$WORK/serve_$name.log"  # (as start_server: never read an earlier server's URL)
  "$MYRIAD" serve $SERVE_MODEL --port 0 --model-name tiny --kv-redis "$REDIS" "$@" 2>"$WORK/serve_$name.log" &
  PEER_PID=$!
  PEER_URL=""
  for _ in $(seq 1 600); do
    PEER_URL=$(grep -oE 'listening on http://[0-9.:]+' "$WORK/serve_$name.log" 2>/dev/null | awk '{print $3}' || true)
    [ -n "$PEER_URL" ] && return 0; sleep 0.1
  done
  fail "server $name did not start: $(tail -3 "$WORK/serve_$name.log")"; finish; exit 1
}
# Server B loads every hit (--kv-load always): with a model this small the
# cost model may rightly find recomputing two blocks faster than a round trip
# to Redis plus the step the request waits for it, which is server C's case.
start_peer b --kv-load always
B_PID=$PEER_PID; B_URL=$PEER_URL
complete "$A_URL" "$P3" >/dev/null
for _ in $(seq 50); do [ "$(redis-cli -p "$RPORT" dbsize)" -ge 2 ] && break; sleep 0.1; done
r=$(complete "$B_URL" "$P3"); expect "server B hits server A's blocks in Redis" "$r" "${REF[$P3]}" 16
h=$(tier_hits "$B_URL" redis)
[ "${h:-0}" -gt 0 ] && pass "metrics: $h prompt tokens served to B from Redis" || {
  fail "no redis tier hits in B's /metrics"
  echo "redis keys: $(redis-cli -p "$RPORT" dbsize)"
  curl -sf "$B_URL/metrics" | grep -E '^myriad_kv_(hit|recomputed|skipped)' | head -20
}
kill -TERM "$B_PID"; wait "$B_PID" || true; B_PID=""
# Server C leaves it to the cost model: the same output, and the hit is either
# loaded from Redis or counted as recomputed by choice -- never lost.
start_peer c
B_PID=$PEER_PID
r=$(complete "$PEER_URL" "$P3"); expect "server C (--kv-load auto) on the same prefix" "$r" "${REF[$P3]}" 0
h=$(tier_hits "$PEER_URL" redis)
rc=$(curl -sf "$PEER_URL/metrics" | awk '$1 == "myriad_kv_recomputed_hit_tokens_total" {print $2}')
sk=$(curl -sf "$PEER_URL/metrics" | awk '$1 == "myriad_kv_skipped_lookups_total" {print $2}')
# On a model this small the cost model may also skip the lookup itself (a
# round trip costs more than recomputing the whole prompt): a choice, counted.
if [ $(( ${h:-0} + ${rc:-0} )) -ge 16 ] || [ "${sk:-0}" -ge 1 ]; then
  pass "C's hit: $h tokens loaded from Redis, $rc recomputed by the cost model, ${sk:-0} lookups skipped by it"
else
  fail "C found no hit in Redis: loaded ${h:-0}, recomputed ${rc:-0}, skipped lookups ${sk:-0}"
  curl -sf "$PEER_URL/metrics" | grep -E '^myriad_kv_' | head -20
fi
kill -TERM "$B_PID"; wait "$B_PID" || true; B_PID=""
stop_server
}
