#!/usr/bin/env bash
# Config values that crashed, hung or failed late (issue 15, defects 4, 5, 6
# and 8), each through the real `myriad train` and `myriad preflight` on the
# tiny config with --set: one clear line naming the key (train) or a FAIL
# item naming it (preflight), never a signal (134: abort, 139: segfault) or
# a hang, and nothing trained.
source "$(dirname "$0")/lib.sh" "$@"
MYRIAD="$(realpath "$MYRIAD")"
CFG="$(realpath "$SRC/configs/tiny.toml")"
make_tiny_data
cd "$WORK"  # no tuned/ folder here: the error is the only line
OUT="$WORK/run"
D=(--set data.dir="$WORK/data" --set train.out_dir="$OUT" --set train.snapshot_dir=none -q)
TRAIN=("$MYRIAD" train --config "$CFG" "${D[@]}")

# preflight_problem NAME PATTERN SETS...: preflight exits 1 without a signal
# or a hang, a FAIL line matches PATTERN, it does not say "0 problems" and
# prints no negative size.
preflight_problem() {
  local name="$1" pattern="$2"; shift 2
  local out rc=0
  out="$(timeout 60 "$MYRIAD" preflight --config "$CFG" --set data.dir="$WORK/data" \
           --set train.out_dir="$WORK/pf" "$@" 2>&1)" || rc=$?
  if [ "$rc" -ne 1 ]; then fail "preflight $name: exit $rc (wanted 1): $(tail -3 <<<"$out")"; return; fi
  if grep -q "^0 problems" <<<"$out"; then fail "preflight $name: 0 problems"; return; fi
  if grep -qE -- "-[0-9]+ B\b" <<<"$out"; then fail "preflight $name: a negative size: $out"; return; fi
  if ! grep -E "^  FAIL" <<<"$out" | grep -qE -- "$pattern"; then
    fail "preflight $name: no FAIL item matching /$pattern/: $out"; return
  fi
  pass "preflight $name -> $(grep -E '^  FAIL' <<<"$out" | grep -E -- "$pattern" | head -1 | cut -c1-150)"
}

# Defect 4: sizes that wrap 64 bits (a segfault in the RoPE table build, and
# a negative size with "0 problems" from preflight, before).
HUGE=(--set model.vocab_size=2147483647 --set model.d_model=8589934592)
expect_one_line_error "vocab 2^31-1 x d_model 2^33" "model.d_model=8589934592 is out of range" "${TRAIN[@]}" "${HUGE[@]}"
preflight_problem "vocab 2^31-1 x d_model 2^33" "config .*model.d_model=8589934592 is out of range" "${HUGE[@]}"
EXPERTS=(--set model.n_layers=1024 --set model.n_dense_layers=1 --set model.n_routed_experts=256
         --set model.d_model=1048576 --set model.n_heads=4096 --set model.n_kv_heads=4096 --set model.d_expert=4194304)
expect_one_line_error "expert parameters past 64 bits" \
  "the parameters' size overflows 64-bit integers \(it grows with model.n_layers, model.n_routed_experts, model.d_model, model.d_expert" \
  "${TRAIN[@]}" "${EXPERTS[@]}"
preflight_problem "expert parameters past 64 bits" "config .*overflows 64-bit integers" "${EXPERTS[@]}"

# Defect 5: configs that need terabytes (std::bad_alloc, exit 134, before):
# train checks the estimate against this machine before it allocates.
expect_one_line_error "vocab_size=2e9" "memory: needs .* TiB.* available .*largest: .*model.vocab_size" \
  "${TRAIN[@]}" --set model.vocab_size=2000000000
expect_one_line_error "d_model=65536 x 32 layers" "memory: needs .* available .*lower model.n_layers, model.d_model" \
  "${TRAIN[@]}" --set model.d_model=65536 --set model.n_layers=32
expect_one_line_error "n_layers=1e8" "model.n_layers=100000000 is out of range \[1, 1024\]" \
  "${TRAIN[@]}" --set model.n_layers=100000000
expect_one_line_error "batch_size=1e9" "train.batch_size=1000000000 is out of range \[1, 1048576\]" \
  "${TRAIN[@]}" --set train.batch_size=1000000000
expect_one_line_error "batch_size=2^20" "memory: needs .* available .*activations \(hint: lower train.batch_size" \
  "${TRAIN[@]}" --set train.batch_size=1048576
preflight_problem "vocab_size=2e9" "memory .*needs .*lower model.vocab_size" --set model.vocab_size=2000000000

# Defect 6: counts that hang (preflight passed both, before).
expect_one_line_error "threads=100000" "train.threads=100000 is out of range \[0, 1024\]" "${TRAIN[@]}" --set train.threads=100000
expect_one_line_error "eval_batches=1e12" "train.eval_batches=1000000000000 is out of range \[0, 100000\]" \
  "${TRAIN[@]}" --set train.eval_batches=1000000000000
preflight_problem "threads=100000" "config .*train.threads=100000 is out of range" --set train.threads=100000
preflight_problem "eval_batches=1e12" "config .*train.eval_batches=1000000000000 is out of range" \
  --set train.eval_batches=1000000000000

# Defect 8: refused at load, naming the key (a NaN at step 2, a NaN at step 1
# with the hint "lower train.lr", a refusal at the first save, and a run
# with dp silently 1, before).
expect_one_line_error "lr=inf" "train.lr=inf must be a finite number" "${TRAIN[@]}" --set train.lr=inf
expect_one_line_error "init_std=nan" "model.init_std=nan must be a finite number" "${TRAIN[@]}" --set model.init_std=nan
expect_one_line_error "keep_last=-1" "train.keep_last=-1 is out of range \[0, 10000\]" "${TRAIN[@]}" --set train.keep_last=-1
expect_one_line_error "dp=4294967297" "parallel.dp=4294967297 is out of range \[1, 65536\]" \
  "${TRAIN[@]}" --set parallel.dp=4294967297
expect_one_line_error "steps past 64 bits" "train.steps=99999999999999999999 does not fit in a 64-bit integer" \
  "${TRAIN[@]}" --set train.steps=99999999999999999999
[ -e "$OUT/latest" ] && fail "a refused config trained: $OUT/latest exists" || pass "no refused config trained"

# A refused config exits 6 (kExitConfig), and `launch` (its pre-flight off,
# so only the trainer's memory check refuses it) gives up after the first
# attempt instead of spending its restart budget.
rc=0
"${TRAIN[@]}" --set train.lr=inf 2>/dev/null || rc=$?
[ "$rc" -eq 6 ] && pass "a refused config exits 6" || fail "a refused config exits $rc (wanted 6)"
rc=0
timeout 120 "$MYRIAD" launch --np 1 --no-preflight --max-restarts 5 --backoff 0.1 --config "$CFG" \
  --set data.dir="$WORK/data" --set train.out_dir="$WORK/lrun" --set train.snapshot_dir=none \
  --set model.vocab_size=2000000000 >"$WORK/launch.out" 2>&1 || rc=$?
n=$(grep -cE "^  attempt [0-9]+:" "$WORK/launch.out" || true)
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$n" -eq 1 ] && grep -q "restarting cannot help" "$WORK/launch.out"; then
  pass "launch gives up at once on a refused config (exit $rc, 1 attempt)"
else
  fail "launch on a refused config: exit $rc, $n attempts: $(tail -5 "$WORK/launch.out")"
fi

# The tiny config itself still trains.
if "${TRAIN[@]}" --set train.steps=2 2>"$WORK/ok.log" && [ -e "$OUT/latest" ]; then
  pass "the tiny config trains"
else
  fail "the tiny config: $(tail -3 "$WORK/ok.log")"
fi
finish
