#!/usr/bin/env bash
# The official OpenAI Node.js SDK (tests/node/, `openai` pinned in
# package-lock.json) streams a chat completion from `myriad serve`; the text
# must be non-empty and finished. Dependencies go to $MYRIAD_NODE_CACHE
# (default ~/.cache/myriad-node/openai) with `npm ci` (scripts/npm-cache.sh), reinstalled only when the
# lock file changes.
source "$(dirname "$0")/lib.sh" "$@"
CACHE=$("$SRC/scripts/npm-cache.sh" "$SRC/tests/node" openai) || { echo "FAIL: the OpenAI SDK could not be installed"; exit 1; }
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
