#!/usr/bin/env bash
# Speculative decoding in `myriad serve` (issue 17), over real HTTP on
# loopback, on the tiny model (mtp_depth 1): with n-gram, MTP and auto
# drafts (--fixed-draft: every decode step verifies a draft) the greedy
# output of 16 concurrent completions, sent twice (the second time as
# prefix-cache hits on blocks the speculative requests published), is the
# output of a server without speculation; each response's usage carries the
# "speculative" object; /metrics has the verifications and the acceptance
# per draft position; the default adaptive mode serves the same text too.
# Usage: serve_speculative.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
source "$(dirname "$0")/serve_lib.bash"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
train_tiny_model

run_clients() {  # URL OUT_FILE: 16 concurrent greedy completions, twice; one JSON line per response
  "$PY" - "$1" >"$2" <<'PYEOF'
import http.client, json, sys, threading, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
prompts = []
for i in range(16):
    unit = ["alpha beta gamma", "def f(x): return x", "the cat sat on the mat", "one two three four"][i % 4]
    prompts.append((unit + " ") * (2 + i % 3) + str(i))
def one(i, out):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": prompts[i], "max_tokens": 24,
                                                      "temperature": 0}), {"Content-Type": "application/json"})
    r = c.getresponse()
    out[i] = (r.status, json.loads(r.read()))
for rnd in range(2):
    out = [None] * 16
    ts = [threading.Thread(target=one, args=(i, out)) for i in range(16)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for i, (st, body) in enumerate(out):
        print(json.dumps({"round": rnd, "i": i, "status": st, "text": body["choices"][0]["text"] if st == 200 else None,
                          "usage": body.get("usage")}))
PYEOF
}

start_server
run_clients "$URL" "$WORK/off.jsonl" || fail "clients against the plain server"
stop_server || fail "plain server exit"

for mode in ngram mtp auto; do
  start_server --speculative "$mode" --draft-tokens 3 --fixed-draft
  run_clients "$URL" "$WORK/$mode.jsonl" || fail "$mode: clients"
  metrics=$(curl -s "$URL/metrics")
  stop_server || fail "$mode: server exit"
  res=$("$PY" - "$WORK/off.jsonl" "$WORK/$mode.jsonl" <<'PYEOF'
import json, sys
off = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
bad = [(g["round"], g["i"]) for o, g in zip(off, got) if o["status"] != 200 or g["status"] != 200 or o["text"] != g["text"]]
spec = [g["usage"].get("speculative") for g in got if g["status"] == 200]
with_spec = [s for s in spec if s]
acc = sum(s["accepted_tokens"] for s in with_spec)
cached = sum(g["usage"]["prompt_tokens_details"]["cached_tokens"] for g in got if g["round"] == 1)
print("ok" if not bad and len(with_spec) == len(got) and cached > 0 else "bad",
      f"differing={bad} usage_with_speculative={len(with_spec)}/{len(got)} accepted={acc} round2_cached_tokens={cached}")
PYEOF
)
  case "$res" in ok*) pass "$mode: 32 greedy completions identical to the plain server's; $res";; *) fail "$mode: $res";; esac
  v=$(grep -E '^myriad_spec_verifications_total ' <<<"$metrics" | awk '{print $2}')
  a1=$(grep -E '^myriad_spec_acceptance\{position="1"\}' <<<"$metrics" | awk '{print $2}')
  if [ -n "$v" ] && [ "${v%.*}" -gt 0 ] && [ -n "$a1" ]; then pass "$mode: /metrics: $v verifications, position-1 acceptance $a1"
  else fail "$mode: /metrics lacks the speculation series: verifications '$v', acceptance '$a1'"; fi
done

start_server --speculative auto
run_clients "$URL" "$WORK/adaptive.jsonl" || fail "adaptive: clients"
stop_server || fail "adaptive: server exit"
res=$("$PY" -c "
import json, sys
off = [json.loads(l) for l in open('$WORK/off.jsonl')]
got = [json.loads(l) for l in open('$WORK/adaptive.jsonl')]
print('ok' if all(o['text'] == g['text'] and g['status'] == 200 for o, g in zip(off, got)) else 'bad')")
[ "$res" = ok ] && pass "auto with the cost model: identical greedy output" || fail "auto with the cost model: output differs"
finish
