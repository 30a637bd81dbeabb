#!/usr/bin/env bash
# `myriad plan` and `myriad simulate` end to end on the committed
# descriptions: a published layout is estimated, the planner finds a layout
# that fits, the dynamic mode and the failure simulator report, JSON parses,
# and bad input gets one clear line.
# Usage: plan.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
P="$SRC/configs/plan"

out=$("$MYRIAD" plan -c "$P/megatron-1t.toml" --layout dp=6,tp=8,pp=64,mb=1,zero=1,rc=full,v=2)
grep -qE '^step +[0-9.]+ s' <<<"$out" && grep -q 'MFU' <<<"$out" && pass "published layout estimated: $(grep '^step' <<<"$out" | cut -c1-60)" ||
  fail "no estimate: $out"
# The printed layout can be pasted back.
printed=$(grep '^layout' <<<"$out" | sed -E 's/^layout +//; s/ +\(.*//')
"$MYRIAD" plan -c "$P/megatron-1t.toml" --layout "$printed" >/dev/null && pass "printed layout parses back" || fail "'$printed' does not parse"

j=$("$MYRIAD" plan -c "$P/megascale-175b.toml" --json)
"$PY" -c 'import json,sys; j=json.load(sys.stdin); b=j["best"]; assert j["found"] and b["feasible"]; assert b["memory_bytes"]["total"] <= b["memory_bytes"]["capacity"]; assert 0 < b["mfu"] < 1; print(b["layout"])' <<<"$j" >/dev/null &&
  pass "planner JSON: a feasible best layout within memory" || fail "bad planner JSON"

out=$("$MYRIAD" plan -c "$P/spark-293b.toml" --buckets 4096:0.6,65536:0.3,262144:0.1 --set failures.trials=20 2>/dev/null)
grep -q 'speedup' <<<"$out" && grep -q 'ETTR' <<<"$out" && pass "dynamic plan with failures: $(grep speedup <<<"$out")" ||
  fail "dynamic plan: $out"

out=$("$MYRIAD" simulate -c "$P/spark-293b.toml" --work-hours 100 --set failures.trials=30 2>/dev/null)
grep -q 'best checkpoint interval' <<<"$out" && grep -q 'automatic recovery' <<<"$out" &&
  pass "simulate: $(grep 'best checkpoint' <<<"$out")" || fail "simulate: $out"

# Calibration end to end on the tiny config: kernels and collectives
# measured, two layouts predicted and run under mpirun (no timing asserted:
# the report has both, measured and predicted, positive).
make_tiny_data
if "$MYRIAD" plan --calibrate -c "$SRC/configs/tiny.toml" --set "data.dir=\"$WORK/data\"" --layouts "dp=1;dp=2" \
    --steps 6 --repeats 1 --report "$WORK/cal.json" >"$WORK/cal.out" 2>&1; then
  "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); L=j["layouts"]; assert len(L)==2 and all(l["measured_s"]>0 and l["predicted_s"]>0 for l in L); assert j["calibration"]["gemm_gflops"]>0 and j["calibration"]["comm_gbs"]>0' "$WORK/cal.json" &&
    pass "calibrate: $(grep 'mean |error|' "$WORK/cal.out")" || fail "calibrate report: $(cat "$WORK/cal.json")"
else
  fail "calibrate failed: $(tail -5 "$WORK/cal.out")"
fi
expect_error "calibrate without a config" "no training config" "$MYRIAD" plan --calibrate
expect_error "calibrate with a bad layout" "not an integer" "$MYRIAD" plan --calibrate -c "$SRC/configs/tiny.toml" --layouts "dp=x"

expect_error "bad layout" "not an integer.*hint" "$MYRIAD" plan -c "$P/megatron-1t.toml" --layout dp=x
expect_error "layout that breaks a rule" "n_heads=160 is not divisible by tp=3" "$MYRIAD" plan -c "$P/megatron-1t.toml" --layout dp=1,tp=3,pp=1024,mb=1
expect_error "unknown preset" "unknown cluster preset 'tpu'.*hint" "$MYRIAD" plan -c "$P/megatron-1t.toml" --cluster tpu
expect_error "typo in a key" "unknown key job.seq_lne" "$MYRIAD" plan -c "$P/megatron-1t.toml" --set job.seq_lne=4
expect_error "bad buckets" "LENGTH:FRACTION" "$MYRIAD" plan -c "$P/megatron-1t.toml" --buckets 4096
expect_error "missing file" "megatron-2t.toml" "$MYRIAD" plan -c "$P/megatron-2t.toml"
expect_error "nothing fits" "no feasible layout.*GB per device" "$MYRIAD" plan -c "$P/megatron-1t.toml" --set cluster.device.memory_gb=0.5
expect_error "bad failure rate" "failures.device" "$MYRIAD" simulate -c "$P/spark-293b.toml" --set failures.device.rate_per_1000_device_days=-1
finish
