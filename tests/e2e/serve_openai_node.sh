#!/usr/bin/env bash
# The official OpenAI Node.js SDK (tests/node/, `openai` pinned in
# package-lock.json) streams a chat completion from `myriad serve`; the text
# must be non-empty and finished. Dependencies go to $MYRIAD_NODE_CACHE
# (default ~/.cache/myriad-node) with `npm ci`, reinstalled only when the
# lock file changes.
source "$(dirname "$0")/lib.sh" "$@"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (hint: apt-get install nodejs npm; node >= 20)"; exit 1; }
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || { echo "FAIL: node $(node --version) is too old (hint: node >= 20)"; exit 1; }

CACHE="${MYRIAD_NODE_CACHE:-$HOME/.cache/myriad-node}"
mkdir -p "$CACHE"
lock_sum=$(sha256sum "$SRC/tests/node/package-lock.json" | cut -d' ' -f1)
if [ ! -d "$CACHE/node_modules/openai" ] || [ "$(cat "$CACHE/.lock-sum" 2>/dev/null)" != "$lock_sum" ]; then
  cp "$SRC/tests/node/package.json" "$SRC/tests/node/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund >"$CACHE/npm-ci.log" 2>&1) \
    || { echo "FAIL: npm ci in $CACHE failed (hint: is the npm registry reachable?): $(tail -5 "$CACHE/npm-ci.log")"; exit 1; }
  echo "$lock_sum" >"$CACHE/.lock-sum"
fi
cp "$SRC/tests/node/stream_chat.mjs" "$CACHE/"  # imports resolve from $CACHE/node_modules
pass "openai SDK $(node -p "require('$CACHE/node_modules/openai/package.json').version") installed in $CACHE"

source "$(dirname "$0")/serve_lib.bash"
train_tiny_model
KEY="sk-node-$$"
start_server --api-key "$KEY"

rc=0
MYRIAD_URL="$URL" MYRIAD_MODEL=tiny MYRIAD_API_KEY="$KEY" timeout 120 node "$CACHE/stream_chat.mjs" \
  >"$WORK/node.out" 2>"$WORK/node.err" || rc=$?
echo "text: $(cat "$WORK/node.out")"
if [ "$rc" -eq 0 ] && grep -q '"text_chars":[1-9]' "$WORK/node.err"; then
  pass "openai SDK streamed a finished, non-empty chat completion: $(grep stream_chat: "$WORK/node.err")"
else
  fail "openai SDK client (exit $rc): $(tail -20 "$WORK/node.err")"
fi
stop_server && pass "server stopped cleanly" || fail "server exit: $(tail -5 "$WORK/serve.log")"
finish
