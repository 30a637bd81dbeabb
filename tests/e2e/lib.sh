# Shared helpers for the end-to-end tests: sourced, not run.
# Usage in a test: source lib.sh "$MYRIAD" "$SRC"
set -euo pipefail
MYRIAD="$1"
SRC="$2"
WORK="$(mktemp -d /tmp/myriad-e2e.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
FAILS=0
PASSES=0

pass() { echo "ok: $*"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

# expect_error NAME PATTERN CMD...: CMD must exit non-zero, print PATTERN on
# stderr (one clear line), and not crash (no signal exit).
expect_error() {
  local name="$1" pattern="$2"; shift 2
  local out rc=0
  out="$("$@" 2>&1 >/dev/null)" || rc=$?
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0, expected an error"; return; fi
  if [ "$rc" -ge 128 ]; then fail "$name: crashed with signal $((rc - 128)): $out"; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then fail "$name: message does not match /$pattern/: $out"; return; fi
  pass "$name -> $(grep -E -- "$pattern" <<<"$out" | head -1)"
}

# A small prepared corpus from the project's own sources (fast to tokenize).
make_tiny_data() {
  mkdir -p "$WORK/corpus"
  # A frozen corpus (the project's own text as of 2026-12-01), so that
  # editing the docs or the code never changes what the tests train on.
  cp "$SRC"/tests/data/tiny_corpus/*.txt "$WORK/corpus/"
  "$MYRIAD" prepare --input "$WORK/corpus" --out "$WORK/data" --vocab 512 --val-fraction 0.1 >/dev/null 2>&1
}

finish() {
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" -eq 0 ]
}
