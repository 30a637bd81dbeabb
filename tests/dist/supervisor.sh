#!/usr/bin/env bash
# `myriad launch` with real processes: every injected fault (kill, hang, NaN,
# torn and corrupt checkpoints, a failed health check, a full disk during a
# save) is recovered on its own, the final weights are bitwise those of a
# fault-free run, no attempt loses more than one checkpoint interval and no
# earlier checkpoint is damaged; SIGTERM writes a final checkpoint; a hang
# across two MPI ranks names the stuck rank and the collective; a host that
# keeps failing is excluded and the job completes on the rest; a soak run
# recovers 20 random faults. Arguments: BUILD_DIR SOURCE_DIR [MYRIAD].
source "$(dirname "$0")/dist_lib.bash" "$@"

INTERVAL=4
S=(--set "data.dir=$WORK/data" --set train.ckpt_every=$INTERVAL --set train.precision=fp32
   --set train.eval_every=0 --set train.keep_last=0 --set train.log_every=100)
L=(--backoff 0.05 --hang-timeout 2 --heartbeat 0.2 -q)

# reference NAME STEPS [extra train args]: a fault-free run.
reference() {
  local name="$1" steps="$2"; shift 2
  timeout 120 "$MYRIAD" train -c "$CFG" "${S[@]}" --set train.steps="$steps" --set "train.out_dir=$WORK/$name" -q "$@" \
    >"$WORK/$name.log" 2>&1 || fail "reference $name failed: $(tail -3 "$WORK/$name.log")"
}
# report_check NAME STEPS: the report says completed, every attempt lost at
# most one interval, and every checkpoint but the injected one verifies.
report_check() {
  local name="$1" steps="$2" skip="${3:-}"
  "$PY" - "$WORK/$name/supervisor/report.json" "$INTERVAL" <<'EOF' || fail "$name: report: see above"
import json, sys
r = json.load(open(sys.argv[1])); interval = int(sys.argv[2])
assert r["completed"], "not completed"
bad = [a for a in r["attempts"] if a["lost_steps"] > interval]
assert not bad, "lost more than one interval: %s" % bad
assert 0 < r["ettr"] <= 1, r["ettr"]
EOF
  local d
  for d in "$WORK/$name"/step_*; do
    [[ " $skip " == *" $(basename "$d") "* ]] && continue  # the injected damage itself
    "$MYRIAD" inspect "$d" >/dev/null 2>&1 || fail "$name: $(basename "$d") does not verify"
  done
}
same_weights() {
  cmp -s "$WORK/$1/step_$(printf %08d "$3")/model.safetensors" "$WORK/$2/step_$(printf %08d "$3")/model.safetensors"
}

reference ref 24
# fault NAME SPEC [extra]: one launch, one process, the fault plan SPEC.
fault() {
  local name="$1" spec="$2"; shift 2
  if ! timeout 120 "$MYRIAD" launch -c "$CFG" "${S[@]}" --set train.steps=24 --set "train.out_dir=$WORK/$name" \
       --hosts solo:1 --emulate-hosts "${L[@]}" --faults "$spec" "$@" >"$WORK/$name.log" 2>&1; then
    fail "$name: launch failed: $(tail -5 "$WORK/$name.log")"; return 1
  fi
  same_weights ref "$name" 24 && pass "$name ($spec): recovered, final weights bitwise equal" \
    || fail "$name: final weights differ from the fault-free run"
}
fault kill "kill:step=7" && report_check kill 24
grep -q "attempt 0 ended: crash" "$WORK/kill.log" && pass "kill: reported as a crash" || fail "kill: $(grep ended "$WORK/kill.log")"
fault hang "hang:step=9" && report_check hang 24
grep -q "hang: no progress for .* rank 0 (host solo): step 9, phase hung (injected)" "$WORK/hang.log" \
  && pass "hang: detected, rank and phase named" || fail "hang report: $(grep hang: "$WORK/hang.log")"
fault nan "nan:step=6" && report_check nan 24
grep -q "attempt 0 ended: numerical" "$WORK/nan.log" && pass "nan: reported as numerical" || fail "nan: $(grep ended "$WORK/nan.log")"
# Torn / corrupt checkpoint with disk only: the restart skips it and resumes
# from the one before; with the shared-memory copy (default) it resumes from
# that copy and loses nothing.
fault tear "tear:step=8" --set train.snapshot_dir=none && report_check tear 24
grep -q "skipped a damaged checkpoint: .*step_00000008" "$WORK/tear.log" && grep -q "attempt 1 ended: completed (exit 0, steps 4\.\.24)" "$WORK/tear.log" \
  && pass "tear: the torn latest was skipped, resumed from step 4" || fail "tear: $(grep -E 'skipped|ended' "$WORK/tear.log")"
fault corrupt "corrupt:step=12" --set train.snapshot_dir=none && report_check corrupt 24
grep -q "skipped a damaged checkpoint: .*step_00000012.*checksum" "$WORK/corrupt.log" \
  && pass "corrupt: checksum mismatch found, fell back to step 8" || fail "corrupt: $(grep -E 'skipped|ended' "$WORK/corrupt.log")"
fault tearmem "tear:step=8" && report_check tearmem 24 step_00000008
grep -q "attempt 1 ended: completed (exit 0, steps 8\.\.24)" "$WORK/tearmem.log" \
  && pass "tear with the shared-memory copy: resumed at step 8, nothing lost" || fail "tearmem: $(grep ended "$WORK/tearmem.log")"
fault diskfull "diskfull:step=8" && report_check diskfull 24
retry=$(ls "$WORK/diskfull" | grep -oE "step_0000000(9)|step_0000001[012]" | head -1 || true)
grep -q "checkpoint step 8 failed: .*No space left on device" "$WORK/diskfull.log" && [ -n "$retry" ] \
  && grep -q "attempt 0 ended: completed" "$WORK/diskfull.log" \
  && pass "disk full during a save: reported, retried at $retry, no restart" || fail "diskfull: $(grep -i checkpoint "$WORK/diskfull.log" | head -5)"
if ls "$WORK/diskfull" | grep -q "\.tmp"; then fail "diskfull: a .tmp directory was left"; fi
fault health "health:host=solo,once=1" && report_check health 24
grep -q "rank 0 on host solo failed its health check" "$WORK/health.log" \
  && pass "failed health check: host named, restarted" || fail "health: $(grep -i health "$WORK/health.log" | head -3)"

# SIGTERM: a final checkpoint, exit 0, and the resumed run ends where a
# straight one does.
reference ref400 400
"$MYRIAD" train -c "$CFG" "${S[@]}" --set train.steps=400 --set "train.out_dir=$WORK/sigterm" -q >"$WORK/sigterm.log" 2>&1 &
TPID=$!
for _ in $(seq 200); do ls "$WORK/sigterm" 2>/dev/null | grep -q step_ && break; sleep 0.05; done
kill -TERM $TPID; rc=0; wait $TPID || rc=$?
if [ "$rc" -eq 0 ] && grep -q "stopped by signal 15 at step" "$WORK/sigterm.log"; then
  at=$(grep -o "stopped by signal 15 at step [0-9]*" "$WORK/sigterm.log" | grep -o "[0-9]*$")
  [ -d "$WORK/sigterm/step_$(printf %08d "$at")" ] && pass "SIGTERM: checkpoint written at step $at, exit 0" || fail "SIGTERM: no checkpoint at $at"
  "$MYRIAD" train -c "$CFG" "${S[@]}" --set train.steps=400 --set "train.out_dir=$WORK/sigterm" -q >>"$WORK/sigterm.log" 2>&1
  same_weights ref400 sigterm 400 && pass "SIGTERM: resumed run bitwise equal to the straight one" || fail "SIGTERM: resumed weights differ"
else
  fail "SIGTERM: rc=$rc: $(tail -3 "$WORK/sigterm.log")"
fi

# Two ranks under mpirun: rank 1 hangs; rank 0 waits in a collective.
S2=("${S[@]}" --set parallel.dp=2)
S_SAVE=("${S[@]}"); S=("${S2[@]}")
train ref_dp2 2 --set train.steps=24
timeout 120 "$MYRIAD" launch -c "$CFG" "${S2[@]}" --set train.steps=24 --set "train.out_dir=$WORK/hang2" --np 2 \
  --launcher-args "--oversubscribe" --backoff 0.05 --hang-timeout 4 --heartbeat 0.2 -q --faults "hang:rank=1,step=10" >"$WORK/hang2.log" 2>&1 \
  || fail "hang2: launch failed: $(tail -5 "$WORK/hang2.log")"
grep -qE "hang: no progress .* rank 1 \(host [^)]*\): step 10, phase hung \(injected\), not in a collective.*rank 0 \(host [^)]*\): step 10, phase step, waiting in AllReduce on \"mpi" "$WORK/hang2.log" \
  && pass "two ranks: the hung rank and the collective the other waits in are named" || fail "hang2: $(grep 'hang:' "$WORK/hang2.log")"
same_weights ref_dp2 hang2 24 && pass "two ranks: recovered from the hang, weights bitwise equal" || fail "hang2: weights differ"
report_check hang2 24

# A host that keeps failing its health check is excluded; the job finishes
# on the other one (dp 2 -> 1, the checkpoint resharded).
timeout 120 "$MYRIAD" launch -c "$CFG" "${S2[@]}" --set train.steps=24 --set "train.out_dir=$WORK/exclude" \
  --hosts node0:1,node1:1 --emulate-hosts --launcher-args "--oversubscribe" "${L[@]}" --exclude-after 2 \
  --faults "health:host=node1;kill:rank=0,step=14" >"$WORK/exclude.log" 2>&1 \
  || fail "exclude: launch failed: $(tail -5 "$WORK/exclude.log")"
grep -q "host node1 failed 2 times: excluded" "$WORK/exclude.log" && grep -q "attempt 2: 1 rank(s) on node0" "$WORK/exclude.log" \
  && "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['completed'] and r['excluded_hosts']==['node1']" \
       "$WORK/exclude/supervisor/report.json" \
  && pass "failing host excluded, job completed on node0" || fail "exclude: $(grep launch: "$WORK/exclude.log" | tail -5)"
# A rank that computes 60 ms longer each step is reported as a straggler, with its host.
timeout 120 "$MYRIAD" launch -c "$CFG" "${S2[@]}" --set train.steps=24 --set "train.out_dir=$WORK/slow" \
  --hosts node0:1,node1:1 --emulate-hosts --launcher-args "--oversubscribe" "${L[@]}" \
  --faults "slow:rank=1,ms=60" >"$WORK/slow.log" 2>&1 || fail "slow: launch failed: $(tail -5 "$WORK/slow.log")"
grep -q "rank 1 on host node1 is a straggler" "$WORK/slow.log" && ! grep -q "rank 0 on host node0 is a straggler" "$WORK/slow.log" \
  && pass "straggler reported with its host: $(grep -o 'rank 1 on host node1 is a straggler.*' "$WORK/slow.log" | head -1)" \
  || fail "slow: $(grep -i straggler "$WORK/slow.log" | head -3)"
S=("${S_SAVE[@]}")

# Soak: 20 random faults in one run (fixed seed), all recovered.
reference ref160 160
SPEC=$("$PY" - <<'EOF'
import random
rng = random.Random(7)
steps = rng.sample(range(2, 158), 60)
faults, used = [], set()
for s in steps:
    if len(faults) == 20: break
    kind = rng.choice(["kill", "kill", "hang", "nan", "tear", "corrupt", "diskfull"])
    if kind in ("tear", "corrupt", "diskfull"): s = s - s % 4 or 4
    if s in used: continue
    used.add(s)
    faults.append(f"{kind}:step={s}")
print(";".join(faults))
EOF
)
echo "   soak plan: $SPEC"
t=$SECONDS
timeout 600 "$MYRIAD" launch -c "$CFG" "${S[@]}" --set train.steps=160 --set "train.out_dir=$WORK/soak" --hosts solo:1 \
  --emulate-hosts "${L[@]}" --max-restarts 30 --faults "$SPEC" >"$WORK/soak.log" 2>&1 \
  || fail "soak: launch failed: $(tail -5 "$WORK/soak.log")"
"$PY" - "$WORK/soak/supervisor/report.json" <<'EOF' && pass "soak: 20 faults fired and recovered ($((SECONDS - t)) s)" || fail "soak: see above"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"], "not completed"
assert r["faults_fired"] == 20, r["faults_fired"]
print("   soak: %d attempts, ETTR %.3f, lost %.1f s, checkpoints blocked %.1f%% of a save" %
      (len(r["attempts"]), r["ettr"], r["lost_s"], 100 * r["checkpoints"]["blocked_fraction"]))
EOF
grep -E "^ETTR" "$WORK/soak.log" && pass "soak: ETTR reported" || fail "soak: no ETTR line"
report_check soak 160 "$(grep -oE '(tear|corrupt):step=[0-9]+' <<<"$SPEC" | grep -oE '[0-9]+$' | xargs -I{} printf 'step_%08d ' {})"
same_weights ref160 soak 160 && pass "soak: final weights bitwise equal to the fault-free run" || fail "soak: weights differ"
echo "   total $((SECONDS - T0)) s"
finish
