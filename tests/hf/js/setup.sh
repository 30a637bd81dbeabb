#!/usr/bin/env bash
# Installs the pinned Hugging Face JavaScript packages of tests/hf/js
# (package-lock.json) into $MYRIAD_NODE_CACHE/hf (default
# ~/.cache/myriad-node/hf) with `npm ci`, only when the lock file changed, and
# prints that folder; its node_modules is where the tests' .mjs scripts
# resolve their imports from (NODE_PATH does not apply to ES modules, so the
# scripts are run from a copy in that folder).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (hint: apt-get install nodejs npm; node >= 20)" >&2; exit 1; }
done
CACHE="${MYRIAD_NODE_CACHE:-$HOME/.cache/myriad-node}/hf"
mkdir -p "$CACHE"
lock_sum=$(sha256sum "$HERE/package-lock.json" | cut -d' ' -f1)
if [ ! -d "$CACHE/node_modules/@huggingface/tokenizers" ] || [ "$(cat "$CACHE/.lock-sum" 2>/dev/null)" != "$lock_sum" ]; then
  cp "$HERE/package.json" "$HERE/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund >"$CACHE/npm-ci.log" 2>&1) \
    || { echo "FAIL: npm ci in $CACHE failed (hint: is the npm registry reachable?): $(tail -5 "$CACHE/npm-ci.log")" >&2; exit 1; }
  echo "$lock_sum" >"$CACHE/.lock-sum"
fi
cp "$HERE"/*.mjs "$CACHE/" 2>/dev/null || true
echo "$CACHE"
