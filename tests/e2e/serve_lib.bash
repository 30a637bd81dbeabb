# Helpers for the `myriad serve` end-to-end tests (serve.sh,
# serve_openai_node.sh): sourced after lib.sh, not run (and not *.sh, so
# CMake does not take it for a test).
SERVER_PID=""
trap '[ -n "$SERVER_PID" ] && kill -9 "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"' EXIT

# A tiny model in $WORK/run (30 steps of configs/tiny.toml on make_tiny_data).
train_tiny_model() {
  make_tiny_data
  "$MYRIAD" train --config "$SRC/configs/tiny.toml" --set data.dir="$WORK/data" --set train.steps=30 \
    --set train.ckpt_every=0 --set train.eval_every=0 --set train.precision=fp32 --set train.out_dir="$WORK/run" \
    -q 2>"$WORK/train.log" || { echo "FAIL: training the tiny model: $(tail -3 "$WORK/train.log")"; exit 1; }
}

# The model the servers serve (word-split): the tiny trained one by default.
SERVE_MODEL="${SERVE_MODEL:---ckpt $WORK/run}"

# start_server ARGS...: `myriad serve $SERVE_MODEL --port 0 --model-name tiny ARGS` in the
# background (SERVER_PID); sets URL from its "listening on" log line.
start_server() {
  # The previous server's log goes first: the new process truncates it only
  # once it runs, and until then the loop below would read the old URL.
  rm -f "$WORK/serve.log"
  # shellcheck disable=SC2086
  "$MYRIAD" serve $SERVE_MODEL --port 0 --model-name tiny "$@" 2>"$WORK/serve.log" &
  SERVER_PID=$!
  URL=""
  for _ in $(seq 1 600); do
    URL=$(grep -oE 'listening on http://[0-9.:]+' "$WORK/serve.log" 2>/dev/null | awk '{print $3}' || true)
    [ -n "$URL" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: the server did not start: $(cat "$WORK/serve.log")"
  exit 1
}

# stop_server: SIGTERM, then a clean exit and the shutdown summary are checked by the caller via $WORK/serve.log.
stop_server() {
  local rc=0
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  return "$rc"
}

# complete URL PROMPT -> "text<TAB>prompt_tokens<TAB>cached_tokens": one
# greedy completion of 12 tokens (newlines in the text as \n).
complete() {
  curl -sf -m 30 "$1/v1/completions" -H 'Content-Type: application/json' \
    -d "$("$PY" -c 'import json,sys; print(json.dumps({"model":"tiny","prompt":sys.argv[1],"max_tokens":12,"temperature":0}))' "$2")" |
    "$PY" -c 'import json,sys; j=json.load(sys.stdin); u=j["usage"]; print(j["choices"][0]["text"].replace("\t"," ").replace("\n","\\n") + "\t" + str(u["prompt_tokens"]) + "\t" + str(u["prompt_tokens_details"]["cached_tokens"]))'
}

# start_redis: a redis-server of its own on a free port (data under
# $WORK/redis); sets RPID and REDIS (its URL). The exit trap stops it too,
# after a SIGCONT in case a test froze it, and a second server B_PID.
start_redis() {
  RDIR="$WORK/redis"; mkdir -p "$RDIR"
  RPORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$RDIR" >"$RDIR/log" 2>&1 &
  RPID=$!
  trap 'kill -CONT "$RPID" 2>/dev/null; [ -n "$SERVER_PID" ] && kill -9 "$SERVER_PID" 2>/dev/null; [ -n "${B_PID:-}" ] && kill -9 "$B_PID" 2>/dev/null; kill "$RPID" 2>/dev/null; rm -rf "$WORK"' EXIT
  for _ in $(seq 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  REDIS="redis://127.0.0.1:$RPORT"
}
