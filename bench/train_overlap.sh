#!/usr/bin/env bash
# Gradient reduction hidden under backward, measured inside `myriad train`:
# the demo MoE under mpirun (one thread per rank). Step 2 reduces each
# block's gradients synchronously (the reduction's time on its own); every
# other step launches them asynchronously as each block's backward ends and
# waits only at the end. hidden = 1 - exposed wait / reduction alone.
# Usage: bench/train_overlap.sh [BUILD_DIR] [STEPS]   (needs data/default: make demo-data or make demo)
set -euo pipefail
BUILD="${1:-build}"
STEPS="${2:-30}"
MYRIAD="$BUILD/myriad"
[ -x "$MYRIAD" ] || { echo "FAIL: $MYRIAD not built"; exit 1; }
[ -f data/default/tokenizer.model ] || { echo "FAIL: data/default missing (hint: make demo prepares it)"; exit 1; }
export OMP_NUM_THREADS=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT="$(mktemp -d /tmp/myriad-overlap.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
run() {  # NAME NP ARGS...
  local name="$1" np="$2"; shift 2
  mpirun -np "$np" --oversubscribe "$MYRIAD" train -c configs/demo-moe.toml --fresh -q \
    --set train.steps="$STEPS" --set train.eval_every=0 --set train.ckpt_every=0 --set train.log_every=1 \
    --set train.precision=fp32 --set train.out_dir="$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 ||
    { echo "FAIL: $name: $(tail -3 "$OUT/$name.log")"; exit 1; }
  "$PY" - "$OUT/$name/metrics.jsonl" "$name" "$np" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][2:]   # skip warm-up and the timing step
alone = rows[0]["comm"]["reduce_alone_s"]
exposed = statistics.median(r["comm"]["exposed_s"] for r in rows)
step = statistics.median(r["step_s"] for r in rows)
rec = {"bench": "train_overlap", "config": {"model": "demo-moe", "layout": sys.argv[2], "ranks": int(sys.argv[3]),
       "steps_measured": len(rows)}, "myriad": 1 - exposed / alone, "peer": None, "unit": "fraction hidden",
       "reduce_alone_s": alone, "exposed_median_s": exposed, "step_median_s": step,
       "bytes_per_step": rows[-1]["comm"]["grad_bytes"]}
print(json.dumps(rec))
print(f"# {sys.argv[2]}: reduction alone {alone*1e3:.1f} ms, exposed {exposed*1e3:.1f} ms (median), "
      f"hidden {100*(1-exposed/alone):.0f}%, step {step*1e3:.0f} ms", file=sys.stderr)
PY
}
run dp2_zero1 2 --set parallel.dp=2
run dp4_hier_2x2 4 --set parallel.dp=4 --set parallel.hierarchical=true --set parallel.ranks_per_node=2
run dp4_int8_2x2 4 --set parallel.dp=4 --set parallel.compression=int8 --set parallel.ranks_per_node=2
