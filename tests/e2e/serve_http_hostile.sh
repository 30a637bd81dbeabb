#!/usr/bin/env bash
# The HTTP front against hostile clients (issue 17, hardening), on the real
# server over loopback:
#   - a 200 MiB chunked body is 413 after --max-body-bytes, and the server's
#     peak RSS (VmHWM) grows by less than 64 MiB (it was read whole: ~1 GB);
#     a declared 200 MiB Content-Length is 413 before any body is sent;
#   - two requests written back to back on one connection (pipelining) are
#     both answered at once (the second waited 5 s);
#   - a client sending its head one line at a time is dropped at
#     --header-timeout-s;
#   - 100 such slow clients do not keep /health and a completion from
#     answering, and SIGTERM with all of them connected exits within the
#     drain timeout + 3 s (they held every HTTP thread and blocked SIGTERM);
#   - requests the drain timeout cancels end as 503 (or an error event in a
#     stream), never as 200 with finish_reason "cancelled", and the server
#     exits within the drain timeout + 3 s.
# Usage: serve_http_hostile.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
source "$(dirname "$0")/serve_lib.bash"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
train_tiny_model

# health_and_completion: both must answer 200 within 5 s each; prints the times.
health_and_completion() {
  local h c
  h=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 5 "$URL/health" || echo "000 -")
  c=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 5 "$URL/v1/completions" \
    -H 'Content-Type: application/json' -d '{"model":"tiny","prompt":"The","max_tokens":4}' || echo "000 -")
  echo "health $h s, completion $c s"
  [ "${h%% *}" = 200 ] && [ "${c%% *}" = 200 ]
}

start_server --header-timeout-s 2

# 1. Bodies over the limit (default --max-body-bytes: 1 MiB).
out=$("$PY" - "$URL" "$SERVER_PID" <<'PYEOF'
import socket, sys, threading, urllib.parse
u = urllib.parse.urlparse(sys.argv[1]); pid = sys.argv[2]
def hwm():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
base = hwm()
def status_line(s):
    got = b""
    while b"\r\n" not in got:
        b = s.recv(65536)
        if not b:
            break
        got += b
    return got.split(b"\r\n")[0].decode(errors="replace")
# Chunked: a sender thread writes 200 chunks of 1 MiB while this one reads the answer.
s = socket.create_connection((u.hostname, u.port), timeout=60)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Transfer-Encoding: chunked\r\n\r\n")
sent = [0]
def send():
    chunk = b"100000\r\n" + b"x" * (1 << 20) + b"\r\n"
    try:
        for _ in range(200):
            s.sendall(chunk)
            sent[0] += 1
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server closed after answering
t = threading.Thread(target=send); t.start()
chunked = status_line(s)
t.join(); s.close()
# Content-Length: refused on the head.
s = socket.create_connection((u.hostname, u.port), timeout=60)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: 209715200\r\n\r\n")
declared = status_line(s)
s.close()
print(f"{chunked}|{declared}|{sent[0]}|{base}|{hwm()}")
PYEOF
) || fail "the big-body client failed: $out"
IFS='|' read -r chunked declared sent base peak <<<"$out"
[[ "$chunked" == "HTTP/1.1 413"* ]] && pass "200 MiB chunked body: '$chunked' (the client got $sent MiB out)" ||
  fail "200 MiB chunked body: got '$chunked', want 413"
[[ "$declared" == "HTTP/1.1 413"* ]] && pass "declared 200 MiB Content-Length: '$declared'" ||
  fail "declared 200 MiB Content-Length: got '$declared', want 413"
if [ -n "$peak" ] && [ $((peak - base)) -lt 64 ]; then
  pass "server VmHWM $base MiB before, $peak MiB after the 200 MiB body (< +64 MiB)"
else
  fail "server VmHWM $base MiB before, $peak MiB after the 200 MiB body (want < +64 MiB)"
fi
r=$(health_and_completion) && pass "still serving after the big bodies: $r" || fail "after the big bodies: $r"

# 2. Pipelining: three requests in one write, three answers within 2 s.
out=$("$PY" - "$URL" <<'PYEOF'
import socket, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
body = b'{"model":"tiny","prompt":"The","max_tokens":3}'
reqs = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
s = socket.create_connection((u.hostname, u.port))
s.settimeout(2)
t0 = time.perf_counter()
s.sendall(reqs)
got = b""
try:
    while got.count(b"HTTP/1.1 200 OK") < 3 or not got.endswith(b'{"status":"ok"}'):
        b = s.recv(65536)
        if not b:
            break
        got += b
except socket.timeout:
    pass
print(f"{got.count(b'HTTP/1.1 200 OK')} {time.perf_counter() - t0:.3f} {b'text_completion' in got}")
PYEOF
)
read -r n secs has_completion <<<"$out"
[ "$n" = 3 ] && [ "$has_completion" = True ] && pass "pipelining: 3 requests in one write, 3 answers in $secs s" ||
  fail "pipelining: $out (want 3 answers within 2 s)"

# 3. A head sent one line every 0.5 s is cut off at --header-timeout-s 2.
out=$("$PY" - "$URL" <<'PYEOF'
import socket, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
s = socket.create_connection((u.hostname, u.port))
t0 = time.perf_counter()
s.sendall(b"GET /health HTTP/1.1\r\n")
closed = None
try:
    for i in range(40):
        time.sleep(0.5)
        s.sendall(b"X-Slow-%d: 1\r\n" % i)
except OSError:
    closed = time.perf_counter() - t0
print("never closed" if closed is None else f"{closed:.1f}")
PYEOF
)
if [ "$out" != "never closed" ] && "$PY" -c "import sys; sys.exit(0 if 1.5 <= float('$out') <= 8 else 1)"; then
  pass "a slow head was cut off after $out s (--header-timeout-s 2)"
else
  fail "a slow head: closed after '$out' s (want about 2 s, the header deadline)"
fi
stop_server || fail "server exit"

# 4. 100 slow-header clients, then SIGTERM while they are connected.
start_server --drain-timeout 5
port=${URL##*:}
"$PY" - "$URL" "$WORK/slow.txt" <<'PYEOF' &
import select, socket, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
socks = [socket.create_connection((u.hostname, u.port)) for _ in range(100)]
for s in socks:
    s.sendall(b"GET /health HTTP/1.1\r\n")
open_ = set(range(100))
for i in range(30):
    with open(sys.argv[2], "a") as f:
        f.write(f"round {i} open {len(open_)}\n")
    time.sleep(2)
    for k in list(open_):
        s = socks[k]
        try:
            r, _, _ = select.select([s], [], [], 0)
            if r and not s.recv(1, socket.MSG_PEEK):
                raise OSError("closed")
            s.sendall(b"X-Slow-%d: 1\r\n" % i)
        except OSError:
            open_.discard(k)
    if not open_:
        break
PYEOF
slow_pid=$!
for _ in $(seq 1 100); do grep -q "round 1 " "$WORK/slow.txt" 2>/dev/null && break; sleep 0.1; done
r=$(health_and_completion) && pass "with 100 slow-header clients connected: $r" ||
  fail "with 100 slow-header clients connected: $r"
conns=$(ss -Htn state established "( sport = :$port )" | wc -l)
[ "$conns" -ge 100 ] && pass "$conns connections to the server open at SIGTERM" ||
  fail "only $conns connections open at SIGTERM (want the 100 slow clients)"
t0=$(date +%s.%N)
kill -TERM "$SERVER_PID"
rc=0; wait "$SERVER_PID" || rc=$?
SERVER_PID=""
secs=$("$PY" -c "import time; print(f'{time.time() - $t0:.2f}')")
if [ "$rc" = 0 ] && "$PY" -c "import sys; sys.exit(0 if $secs < 5 + 3 else 1)"; then
  pass "SIGTERM with 100 slow clients connected: exit 0 after $secs s (drain timeout 5 s + 3)"
else
  fail "SIGTERM with 100 slow clients connected: exit $rc after $secs s (want 0 within 8 s):" \
    "$(tail -3 "$WORK/serve.log")"
fi
kill "$slow_pid" 2>/dev/null || true
wait "$slow_pid" 2>/dev/null || true

# 5. Requests the drain timeout cancels: 503 or an SSE error event, never 200 "cancelled".
start_server --max-batch 1 --max-queue 200 --drain-timeout 0
cancel_pid=$SERVER_PID
out=$("$PY" - "$URL" "$SERVER_PID" "$WORK/sigterm_at" <<'PYEOF'
import http.client, json, os, signal, sys, threading, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1]); pid = int(sys.argv[2])
results = []
def one(i):
    stream = i % 2 == 0
    body = json.dumps({"model": "tiny", "prompt": "The", "max_tokens": 48, "stream": stream})
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        results.append((stream, r.status, r.read().decode(errors="replace")))
    except Exception as e:  # the server closed the connection after shutting down
        results.append((stream, 0, repr(e)))
threads = [threading.Thread(target=one, args=(i,)) for i in range(120)]
for t in threads:
    t.start()
waiting = 0
for _ in range(2000):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    c.request("GET", "/metrics")
    m = c.getresponse().read().decode()
    waiting = int(next(l.split()[1] for l in m.splitlines() if l.startswith("myriad_requests_waiting ")))
    if waiting >= 10:
        break
    time.sleep(0.002)
with open(sys.argv[3], "w") as f:
    f.write(f"{time.time()}\n")
os.kill(pid, signal.SIGTERM)
for t in threads:
    t.join()
bad, refused, errored, done = [], 0, 0, 0
for stream, status, text in results:
    if '"finish_reason":"cancelled"' in text or '"finish_reason": "cancelled"' in text:
        bad.append(text[:200])
    elif status == 503 and not stream and json.loads(text)["error"]["code"] in ("cancelled", "unavailable"):
        refused += "cancelled" in text
    elif status == 200 and stream and 'data: {"error"' in text and "cancelled before it finished" in text:
        errored += 1
    elif status == 200:
        done += 1
print(f"waiting {waiting} at SIGTERM; {done} finished, {refused} x 503 cancelled, {errored} streams ended "
      f"with an error event, {len(bad)} with finish_reason cancelled {bad[:1]}")
sys.exit(0 if waiting >= 10 and not bad and refused > 0 and errored > 0 else 1)
PYEOF
) && pass "drain timeout 0 with 120 requests: $out" || fail "drain-timeout cancels: $out"
rc=0; wait "$cancel_pid" || rc=$?
SERVER_PID=""
secs=$("$PY" -c 'import sys, time; print("%.2f" % (time.time() - float(open(sys.argv[1]).read())))' "$WORK/sigterm_at" ||
  echo "?")
if [ "$rc" = 0 ] && "$PY" -c "import sys; sys.exit(0 if $secs < 0 + 3 else 1)" 2>/dev/null; then
  pass "SIGTERM with 120 requests running or waiting: exit 0 after $secs s (drain timeout 0 s + 3)"
else
  fail "SIGTERM with 120 requests running or waiting: exit $rc after $secs s (want 0 within 3 s):" \
    "$(tail -3 "$WORK/serve.log")"
fi
finish
