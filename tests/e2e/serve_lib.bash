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
