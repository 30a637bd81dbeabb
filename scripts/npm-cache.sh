#!/usr/bin/env bash
# Usage: npm-cache.sh PKG_DIR NAME
# Installs the pinned npm packages of PKG_DIR (its package.json and
# package-lock.json) into $MYRIAD_NODE_CACHE/NAME (default
# ~/.cache/myriad-node/NAME) with `npm ci`, only when the lock file changed,
# copies PKG_DIR's .mjs scripts beside them (ES modules resolve imports from
# their own folder; NODE_PATH does not apply), and prints that folder.
# The one installer of the JavaScript tools the tests use (the OpenAI SDK in
# tests/node, the Hugging Face oracles in tests/hf/js).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: npm-cache.sh PKG_DIR NAME" >&2; exit 2; }
PKG="$(cd "$1" && pwd)"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (hint: apt-get install nodejs npm; node >= 20)" >&2; exit 1; }
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || { echo "FAIL: node $(node --version) is too old (hint: node >= 20)" >&2; exit 1; }
CACHE="${MYRIAD_NODE_CACHE:-$HOME/.cache/myriad-node}/$2"
mkdir -p "$CACHE"
lock_sum=$(sha256sum "$PKG/package-lock.json" | cut -d' ' -f1)
if [ ! -d "$CACHE/node_modules" ] || [ "$(cat "$CACHE/.lock-sum" 2>/dev/null)" != "$lock_sum" ]; then
  cp "$PKG/package.json" "$PKG/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund >"$CACHE/npm-ci.log" 2>&1) \
    || { echo "FAIL: npm ci in $CACHE failed (hint: is the npm registry reachable?): $(tail -5 "$CACHE/npm-ci.log")" >&2; exit 1; }
  echo "$lock_sum" >"$CACHE/.lock-sum"
fi
cp "$PKG"/*.mjs "$CACHE/" 2>/dev/null || true
echo "$CACHE"
