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
expect_error() { _expect_error 0 "$@"; }
# expect_one_line_error NAME PATTERN CMD...: as expect_error, and the error
# is the only line on stderr, within 60 s (a hang fails the test, not ctest).
expect_one_line_error() { _expect_error 1 "$@"; }
_expect_error() {
  local strict="$1" name="$2" pattern="$3"; shift 3
  local out rc=0
  if [ "$strict" = 1 ]; then out="$(timeout 60 "$@" 2>&1 >/dev/null)" || rc=$?
  else out="$("$@" 2>&1 >/dev/null)" || rc=$?; fi
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0, expected an error"; return; fi
  if [ "$strict" = 1 ] && [ "$rc" -eq 124 ]; then fail "$name: still running after 60 s"; return; fi
  if [ "$rc" -ge 128 ]; then fail "$name: crashed with signal $((rc - 128)): $out"; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then fail "$name: message does not match /$pattern/: $out"; return; fi
  if [ "$strict" = 1 ] && [ "$(wc -l <<<"$out")" -ne 1 ]; then fail "$name: more than one line on stderr: $out"; return; fi
  pass "$name -> $(grep -E -- "$pattern" <<<"$out" | head -1 | cut -c1-200)"
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
