#!/usr/bin/env bash
# Checkpoint blocking time on the demo config: training with asynchronous
# checkpoints (snapshot in memory + shared-memory copy, disk written in the
# background) vs synchronous ones (the peer: training waits for the whole
# save), alternating rounds in one run. Reports, per save, how long training
# was blocked, and the ratio to a synchronous save's full duration.
# Usage: bench/ckpt.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
BUILD="${1:-build}"
ROUNDS="${2:-3}"
MYRIAD="$BUILD/myriad"
[ -x "$MYRIAD" ] || { echo "FAIL: $MYRIAD not built"; exit 1; }
W="$(mktemp -d /tmp/myriad-ckptbench.XXXXXX)"
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/corpus"
cp src/*/*.cc src/*/*.h docs/*.md "$W/corpus/" 2>/dev/null || true
"$MYRIAD" prepare --input "$W/corpus" --out "$W/data" --vocab 4096 --val-fraction 0.05 >/dev/null 2>&1
STEPS=13 EVERY=4
run() {  # MODE ROUND
  local mode="$1" r="$2" out="$W/run_$1_$2"
  "$MYRIAD" train -c configs/demo-moe.toml --set data.dir="$W/data" --set train.out_dir="$out" \
    --set train.steps=$STEPS --set train.ckpt_every=$EVERY --set train.eval_every=0 --set train.log_every=100 \
    --set train.async_checkpoint=$([ "$mode" = async ] && echo true || echo false) ${MYRIAD_CKPT_BENCH_SETS:-} -q 2>"$out.log"
  # Saves before the last (the last one is always waited for).
  grep -oE "checkpoint step [0-9]+ written \(training blocked [0-9.]+s, written in the background in [0-9.]+s" "$out.log" \
    | grep -v "step $STEPS " | sed -E "s/.*step ([0-9]+).*blocked ([0-9.]+)s.* in ([0-9.]+)s/$mode \1 \2 \3/" >>"$W/saves"
}
for r in $(seq "$ROUNDS"); do run async "$r"; run sync "$r"; done
python3 - "$W/saves" "$ROUNDS" <<'PY'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
a = [float(b) for m, s, b, p in rows if m == "async"]
ap = [float(p) for m, s, b, p in rows if m == "async"]
s = [float(b) for m, st, b, p in rows if m == "sync"]
ma, ms = statistics.median(a), statistics.median(s)
print(f"# demo config, {len(a)} async and {len(s)} sync saves ({sys.argv[2]} alternating rounds)")
print(f"# async: training blocked {ma*1e3:.1f} ms per save (median; max {max(a)*1e3:.1f}), disk written in the background in {statistics.median(ap):.2f} s")
print(f"# sync:  training blocked {ms*1e3:.1f} ms per save (median): the whole save")
print(f"# blocked fraction: {ma/ms:.3f} of a synchronous save (target <= 0.10)")
print(json.dumps({"bench": "ckpt_blocking", "config": {"model": "configs/demo-moe.toml", "saves_per_mode": len(a),
      "rounds": int(sys.argv[2])}, "myriad": ma, "peer": ms, "unit": "s blocked per save (peer: synchronous save)",
      "ratio": ma / ms, "roofline_fraction": None}))
PY
