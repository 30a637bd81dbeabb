#!/usr/bin/env bash
# Training that runs steadily (issue 15): a crash during the final
# checkpoint's save loses nothing; an edited manifest is refused and the run
# falls back to the checkpoint before; metrics that cannot be written are
# reported, not lost silently.
source "$(dirname "$0")/lib.sh" "$@"
make_tiny_data
CFG="$SRC/configs/tiny.toml"
COMMON=(--set data.dir="$WORK/data" --set train.eval_every=0 --set train.precision=fp32 -q)
step_of() { python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['step'])" "$1/manifest.json"; }

# --- 1. A crash while the final checkpoint is written to disk. ---------------
# The shared-memory copy of step 6 is complete when rank 0 dies half-way
# through the disk copy (fault crashsave). The rerun must put step 6 on disk
# (the same bytes as a run that never crashed), not say "nothing to do".
RUN1=(--set train.steps=6 --set train.ckpt_every=3 --set train.snapshot_dir="$WORK/shm1")
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" --set train.out_dir="$WORK/straight" --set train.steps=6 \
  --set train.ckpt_every=3 --set train.snapshot_dir=none 2>"$WORK/straight.log"
rc=0
MYRIAD_FAULTS="crashsave:step=6" "$MYRIAD" train --config "$CFG" "${COMMON[@]}" "${RUN1[@]}" \
  --set train.out_dir="$WORK/crash" 2>"$WORK/crash1.log" || rc=$?
[ "$rc" -eq 137 ] && pass "killed half-way through saving step 6 (exit $rc)" || fail "crash drill: exit $rc: $(tail -3 "$WORK/crash1.log")"
[ "$(cat "$WORK/crash/latest")" = "step_00000003" ] && [ -d "$WORK/crash/step_00000006.tmp" ] \
  && pass "on disk after the crash: latest step 3 and a torn step_00000006.tmp" \
  || fail "unexpected state after the crash: $(ls "$WORK/crash") latest=$(cat "$WORK/crash/latest")"
rc=0
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" "${RUN1[@]}" --set train.out_dir="$WORK/crash" 2>"$WORK/crash2.log" || rc=$?
[ "$rc" -eq 0 ] && grep -q "recovered step 6 from shared memory" "$WORK/crash2.log" \
  && pass "rerun wrote the shared-memory copy of step 6 to disk" \
  || fail "rerun (exit $rc) did not recover step 6: $(cat "$WORK/crash2.log")"
[ "$(cat "$WORK/crash/latest")" = "step_00000006" ] && [ ! -e "$WORK/crash/step_00000006.tmp" ] \
  && pass "latest is step 6, no .tmp left" || fail "after the rerun: $(ls "$WORK/crash") latest=$(cat "$WORK/crash/latest")"
cmp -s "$WORK/crash/step_00000006/model.safetensors" "$WORK/straight/step_00000006/model.safetensors" && \
  cmp -s "$WORK/crash/step_00000006/optimizer.safetensors" "$WORK/straight/step_00000006/optimizer.safetensors" \
  && pass "recovered step 6 is bitwise the uncrashed run's step 6" || fail "recovered step 6 differs from the straight run"
"$MYRIAD" inspect "$WORK/crash/step_00000006" >/dev/null 2>&1 && pass "inspect verifies the recovered step 6" \
  || fail "inspect rejects the recovered step 6"
[ ! -e "$WORK/shm1" ] && pass "shared-memory copy removed once the final step is on disk" \
  || fail "shared-memory copy left behind: $(ls "$WORK/shm1")"
rc=0
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" "${RUN1[@]}" --set train.out_dir="$WORK/crash" 2>"$WORK/crash3.log" || rc=$?
[ "$rc" -eq 0 ] && grep -q "nothing to do" "$WORK/crash3.log" && pass "a third run has nothing to do" \
  || fail "third run: exit $rc: $(cat "$WORK/crash3.log")"

# --- 2. An edited manifest. ---------------------------------------------------
RUN2=(--set train.ckpt_every=2 --set train.keep_last=5 --set train.snapshot_dir=none)
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" "${RUN2[@]}" --set train.steps=4 --set train.out_dir="$WORK/edit" \
  2>"$WORK/edit1.log"
cp -r "$WORK/edit" "$WORK/edit_cursor"
python3 - "$WORK/edit/step_00000004/manifest.json" "$WORK/edit_cursor/step_00000004/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["step"] = 5; json.dump(m, open(sys.argv[1], "w"), indent=2)
m = json.load(open(sys.argv[2]))
c = m["data_cursor"]
key = next(k for k in sorted(c) if isinstance(c[k], int) and not isinstance(c[k], bool))
c[key] += 1
json.dump(m, open(sys.argv[2], "w"), indent=2)
PY
expect_error "inspect of the edited step" "manifest.json: checksum mismatch" "$MYRIAD" inspect "$WORK/edit/step_00000004"
for d in edit edit_cursor; do
  rc=0
  "$MYRIAD" train --config "$CFG" "${COMMON[@]}" "${RUN2[@]}" --set train.steps=6 --set train.out_dir="$WORK/$d" \
    2>"$WORK/$d.log" || rc=$?
  if [ "$rc" -eq 0 ] && grep -q "skipped a damaged checkpoint: .*step_00000004/manifest.json: checksum mismatch" "$WORK/$d.log" \
     && grep -q "resumed from .*step_00000002 at step 2" "$WORK/$d.log"; then
    pass "$d: refused the edited step 4, resumed from step 2"
  else
    fail "$d: exit $rc: $(cat "$WORK/$d.log")"
  fi
done
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" "${RUN2[@]}" --set train.steps=6 --set train.out_dir="$WORK/edit_ref" \
  2>/dev/null
cmp -s "$WORK/edit/step_00000006/model.safetensors" "$WORK/edit_ref/step_00000006/model.safetensors" \
  && pass "the run that fell back ends bitwise where an undisturbed run ends" || fail "fell-back run's step 6 differs"

# --- 3. Metrics that cannot be written (a full disk: /dev/full). -------------
rc=0
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" --set train.steps=3 --set train.ckpt_every=0 --set train.snapshot_dir=none \
  --set train.log_every=1 --set train.out_dir="$WORK/full" --set train.metrics_file=/dev/full 2>"$WORK/full.log" || rc=$?
n=$(grep -c "cannot write metrics" "$WORK/full.log" || true)
[ "$rc" -eq 0 ] && [ "$n" -eq 1 ] && grep -q "3 metrics records could not be written" "$WORK/full.log" \
  && pass "metrics on a full disk: one warning, the count at the end, training finished" \
  || fail "metrics on a full disk: exit $rc, $n warnings: $(cat "$WORK/full.log")"
finish
