#!/usr/bin/env bash
# Resume test: N steps straight equals N/2 steps, save, load in a new
# process, N/2 steps — bitwise equal weights, optimizer state and data cursor.
source "$(dirname "$0")/lib.sh" "$@"
make_tiny_data
CFG="$SRC/configs/tiny.toml"
# fp32 explicitly: "auto" times GEMMs at start, and the straight run must not
# choose differently from the split one on a noisy machine. (A resumed auto
# run keeps the precision its checkpoint records: checked below.)
COMMON=(--set data.dir="$WORK/data" --set train.steps=12 --set train.ckpt_every=0 --set train.eval_every=0
        --set train.precision=fp32 -q)

"$MYRIAD" train --config "$CFG" "${COMMON[@]}" --set train.out_dir="$WORK/straight" 2>"$WORK/straight.log"
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" --set train.out_dir="$WORK/split" --stop-after 6 2>"$WORK/split1.log"
[ -d "$WORK/split/step_00000006" ] && pass "stopped and saved at step 6" || fail "no checkpoint at step 6"
"$MYRIAD" train --config "$CFG" "${COMMON[@]}" --set train.out_dir="$WORK/split" 2>"$WORK/split2.log"
grep -q "resumed from .*step_00000006 at step 6" "$WORK/split2.log" && pass "second process resumed at step 6" \
  || fail "second process did not resume: $(cat "$WORK/split2.log")"

A="$WORK/straight/step_00000012"
B="$WORK/split/step_00000012"
cmp -s "$A/model.safetensors" "$B/model.safetensors" && pass "weights bitwise equal" || fail "weights differ"
cmp -s "$A/optimizer.safetensors" "$B/optimizer.safetensors" && pass "optimizer state bitwise equal" || fail "optimizer state differs"
ca=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['data_cursor'])" "$A/manifest.json")
cb=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['data_cursor'])" "$B/manifest.json")
[ "$ca" = "$cb" ] && pass "data cursor equal ($ca)" || fail "data cursor differs: $ca vs $cb"
# The loss curve of the resumed run continues the straight one exactly.
la=$(python3 -c "import json,sys;print([json.loads(l)['loss'] for l in open(sys.argv[1])][-1])" "$WORK/straight/metrics.jsonl")
lb=$(python3 -c "import json,sys;print([json.loads(l)['loss'] for l in open(sys.argv[1])][-1])" "$WORK/split/metrics.jsonl")
[ "$la" = "$lb" ] && pass "final loss equal ($la)" || fail "final loss differs: $la vs $lb"
# A run started with "auto" records its choice; resuming keeps it.
"$MYRIAD" train --config "$CFG" --set data.dir="$WORK/data" --set train.steps=4 --set train.out_dir="$WORK/auto" \
  --stop-after 2 -q 2>/dev/null
chosen=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['precision'])" "$WORK/auto/step_00000002/manifest.json")
"$MYRIAD" train --config "$CFG" --set data.dir="$WORK/data" --set train.steps=4 --set train.out_dir="$WORK/auto" \
  2>"$WORK/auto.log" >/dev/null
grep -q "kept from the run's checkpoint" "$WORK/auto.log" && \
  [ "$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['precision'])" "$WORK/auto/step_00000004/manifest.json")" = "$chosen" ] \
  && pass "resumed auto run kept its precision ($chosen)" || fail "resumed auto run changed precision: $(cat "$WORK/auto.log")"
finish
