#!/usr/bin/env bash
# `myriad launch --np 2` and the signals an operator sends it, with real
# processes: while a launch runs, a second launch or a bare train on its
# out_dir is refused naming the holder; SIGKILL of the supervisor leaves no
# mpirun and no rank alive within seconds (one rank without mpirun too); the
# lock file a killed launch leaves is taken over with a warning naming the
# old pid; SIGTERM stops the job with a checkpoint, exit 0 and a report that
# says "stopped", and the run resumes to weights bitwise equal to a straight
# run. Arguments: BUILD_DIR SOURCE_DIR [MYRIAD].
source "$(dirname "$0")/dist_lib.bash" "$@"

STEPS=60
S=(--set "data.dir=$WORK/data" --set train.ckpt_every=4 --set train.precision=fp32 --set train.eval_every=0
   --set train.keep_last=0 --set train.log_every=100 --set parallel.dp=2 --set train.steps=$STEPS)
L0=(--np 2 --launcher-args "--oversubscribe" --backoff 0.05 --heartbeat 0.2 -q)
# Each step at least 60 ms longer (a planned straggler: the weights are the
# same), so that the signals land mid-run on a fast machine too.
L=("${L0[@]}" --faults "slow:rank=0,ms=60")
LONG=(--set train.steps=100000)  # runs that are killed, never finish

# The processes of run NAME: every one has train.out_dir=$WORK/NAME on its
# command line (launch, mpirun, ranks). Pids, one per line.
procs() { pgrep -f -- "train.out_dir=$WORK/$1( |\$)" || true; }
# Whatever a failed check left running is ended here, by pid.
cleanup_left() { local p; for p in $(procs "$1"); do kill -KILL "$p" 2>/dev/null || true; done; }
cleanup() {
  local p
  for p in $(pgrep -f -- "train.out_dir=$WORK/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME [args]: a launch in the background ($LPID) on $WORK/NAME;
# returns once it has written a checkpoint past those already there.
start() {
  local name="$1"; shift
  local before; before=$(ls "$WORK/$name" 2>/dev/null | grep -c '^step_[0-9]*$' || true)
  "$MYRIAD" launch -c "$CFG" "${S[@]}" --set "train.out_dir=$WORK/$name" "${L[@]}" "$@" >"$WORK/$name.log" 2>&1 &
  LPID=$!
  for _ in $(seq 600); do
    [ "$(ls "$WORK/$name" 2>/dev/null | grep -c '^step_[0-9]*$' || true)" -gt "$before" ] && return 0
    kill -0 $LPID 2>/dev/null || { fail "$name: launch ended early: $(tail -3 "$WORK/$name.log")"; return 1; }
    sleep 0.05
  done
  fail "$name: no checkpoint after 30 s"; return 1
}
# gone_within NAME SECONDS: no process of run NAME is left (prints the ms).
gone_within() {
  local name="$1" t="$2" i
  for i in $(seq $((t * 20))); do [ -z "$(procs "$name")" ] && { echo $((i * 50)); return 0; }; sleep 0.05; done
  return 1
}
# sigkill NAME: SIGKILL to the launch; no process of the run 3 s later.
sigkill() {
  kill -KILL $LPID 2>/dev/null || fail "$1: the launch ended before it was killed"
  wait $LPID 2>/dev/null || true
  local ms
  if ms=$(gone_within "$1" 3); then pass "$1: SIGKILL of launch: no process of the run left within $ms ms"
  else fail "$1: SIGKILL of launch: still running 3 s later: $(procs "$1" | xargs -r ps -o pid=,args= -p | cut -c1-90)"; fi
  cleanup_left "$1"
}

train ref 2  # the straight run the stopped and resumed one must equal

# 1. SIGKILL of the supervisor mid-training takes mpirun and both ranks
#    with it.
start kill9 "${LONG[@]}"
n=$(procs kill9 | wc -l)
[ "$n" -ge 4 ] && pass "launch, mpirun and two ranks running ($n processes)" || fail "only $n processes of the run"
sigkill kill9

# 2. While a launch runs, a second launch and a bare train on its out_dir
#    are refused, naming the holder.
start lock "${LONG[@]}"
expect_error "second launch on the same out_dir" "in use: myriad launch pid $LPID on host .* holds $WORK/lock/launch.lock" \
  timeout 10 "$MYRIAD" launch -c "$CFG" "${S[@]}" "${LONG[@]}" --set "train.out_dir=$WORK/lock" "${L0[@]}"
expect_error "train on the out_dir of a running launch" \
  "in use: myriad train pid [0-9]+ on host .* holds $WORK/lock/train.lock \(under myriad launch pid $LPID\)" \
  timeout 10 "$MYRIAD" train -c "$CFG" "${S[@]}" "${LONG[@]}" --set parallel.dp=1 --set "train.out_dir=$WORK/lock" -q
sigkill lock

# 3. A lock file left by a killed launch is stale: the next launch on that
#    folder takes it over, saying whose it was. Then SIGTERM stops that job
#    with a checkpoint, exit 0 and a report that says "stopped".
mkdir -p "$WORK/stop"
cp "$WORK/lock/launch.lock" "$WORK/stop/" 2>/dev/null || fail "the killed launch left no $WORK/lock/launch.lock"
old=$(grep -o '"pid":[0-9]*' "$WORK/stop/launch.lock" | grep -o '[0-9]*' || true)
start stop || true
grep -q "stop/launch.lock: taking over a stale lock: myriad launch pid ${old:-none} on host .* is no longer running" \
  "$WORK/stop.log" && pass "stale lock of the killed launch (pid $old) taken over with a warning" \
  || fail "no stale-lock warning naming pid ${old:-none}: $(grep -i lock "$WORK/stop.log" | head -3)"
kill -TERM $LPID 2>/dev/null || fail "stop: the launch ended before SIGTERM"
rc=0; wait $LPID || rc=$?
[ "$rc" -eq 0 ] && pass "SIGTERM to launch --np 2: exit 0" || fail "SIGTERM to launch --np 2: exit $rc: $(tail -2 "$WORK/stop.log")"
"$PY" - "$WORK/stop/supervisor/report.json" <<'EOF' && pass "report.json: state stopped, the attempt stopped" || fail "report.json: see above"
import json, sys
r = json.load(open(sys.argv[1]))
a = r["attempts"][-1]
assert r["state"] == "stopped" and not r["completed"], (r["state"], r["completed"])
assert a["outcome"] == "stopped", (a["outcome"], a["detail"])
assert len(r["attempts"]) == 1, "restarted after the stop"
EOF
grep -q "attempt 0: 2 rank(s) on .*, stopped: by signal; checkpoint written" "$WORK/stop.log" \
  && pass "the printed report says stopped" || fail "printed report: $(grep -E '^  attempt 0' "$WORK/stop.log")"
at=$(grep -o "the job wrote a checkpoint at step [0-9]*" "$WORK/stop.log" | grep -o "[0-9]*$" || true)
[ -n "$at" ] && "$MYRIAD" inspect "$WORK/stop/step_$(printf %08d "$at")" >/dev/null 2>&1 \
  && pass "stopped at step $at with a checkpoint that verifies" \
  || fail "no verified checkpoint at the stop: $(grep 'stopped by signal' "$WORK/stop.log")"
[ -z "$(procs stop)" ] && pass "nothing left running after the stop" || fail "left running: $(procs stop)"
timeout 120 "$MYRIAD" launch -c "$CFG" "${S[@]}" --set "train.out_dir=$WORK/stop" "${L0[@]}" >"$WORK/resume.log" 2>&1 \
  || fail "resume after the stop failed: $(tail -3 "$WORK/resume.log")"
grep -q "attempt 0 ended: completed (exit 0, steps ${at:-none}\.\.$STEPS)" "$WORK/resume.log" \
  && cmp -s "$WORK/ref/step_$(printf %08d $STEPS)/model.safetensors" "$WORK/stop/step_$(printf %08d $STEPS)/model.safetensors" \
  && pass "resumed from step $at to $STEPS: weights bitwise equal to the straight run" \
  || fail "resume: $(grep -E 'ended|resumed' "$WORK/resume.log" | head -3)"

# 4. One rank without mpirun: the lone trainer dies with its supervisor.
S=("${S[@]}" --set parallel.dp=1)
L=(--np 1 --backoff 0.05 --heartbeat 0.2 -q --faults "slow:rank=0,ms=60")
start solo "${LONG[@]}"
sigkill solo
echo "   total $((SECONDS - T0)) s"
finish
