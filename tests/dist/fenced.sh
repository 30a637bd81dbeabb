#!/usr/bin/env bash
# Training behind the fenced backend (src/backend/fenced/): device memory the
# host cannot touch outside backend calls, so any host loop over activations,
# KV blocks or comm buffers left in the model, trainer or parallel code dies
# at its line. Under it: single-rank training gives the same bits as the
# plain CPU backend (the fence wraps the same kernels), and 2-rank dp, tp, pp,
# cp and ep runs (and DSA under dp2) match single rank within 1e-4, as
# train_equiv.sh asks of the unfenced ones. The serving side runs behind the
# fence in the e2e_serve_fenced and fenced_* unit-test entries (CMakeLists.txt).
# dist_lib.bash: argument handling, lib.sh, tiny data, $CFG, $PY, $T0, train().
source "$(dirname "$0")/dist_lib.bash" "$@"
S=(--set "data.dir=$WORK/data" --set train.precision=fp32 --set train.eval_every=0 --set train.ckpt_every=0
   --set train.log_every=1 --set train.steps=6 --fresh)

# check NAME BASE TOL [KEYS]: every step's KEYS (default loss) within TOL
# (relative; 0: bitwise) of BASE's, and NAME ran on the fenced backend.
check() {
  local name="$1" base="$2" tol="$3" keys="${4:-loss}" out
  if out=$("$PY" - "$WORK/$base/metrics.jsonl" "$WORK/$name/metrics.jsonl" "$tol" "$keys" <<'PYEOF'
import json, sys
rows = lambda p: {r["step"]: r for r in (json.loads(l) for l in open(p) if l.strip())}
base, run, tol, keys = rows(sys.argv[1]), rows(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(",")
if sorted(run) != list(range(1, 7)) or sorted(base) != sorted(run):
    print(f"steps logged: {sorted(run)} vs {sorted(base)}"); sys.exit(1)
backend = run[6].get("backend", "")
if not backend.startswith("fenced-"): print(f"ran on backend {backend!r}, not the fenced one"); sys.exit(1)
worst = max(abs(run[s][k] - base[s][k]) / abs(base[s][k] or 1) for s in base for k in keys)
print(f"backend {backend}, max rel diff of {','.join(keys)} over 6 steps {worst:.2e} (step 6 loss {run[6]['loss']:.6f})")
sys.exit(0 if worst <= tol and all(base[s][k] != 0 for s in base for k in keys) else 1)
PYEOF
  ); then pass "$name: $out"; else fail "$name: $out"; fi
}

echo "== runs"
train cpu1 1 || { finish; exit 1; }
MYRIAD_BACKEND=fenced train fenced1 1 && check fenced1 cpu1 0
MYRIAD_BACKEND=fenced train fenced_dp2 2 --set parallel.dp=2 && check fenced_dp2 cpu1 1e-4
MYRIAD_BACKEND=fenced train fenced_tp2 2 --set parallel.tp=2 && check fenced_tp2 cpu1 1e-4
MYRIAD_BACKEND=fenced train fenced_pp2 2 --set parallel.pp=2 && check fenced_pp2 cpu1 1e-4
MYRIAD_BACKEND=fenced train fenced_cp2 2 --set parallel.cp=2 && check fenced_cp2 cpu1 1e-4
MYRIAD_BACKEND=fenced train fenced_ep2 2 --set parallel.ep=2 && check fenced_ep2 cpu1 1e-4
DSA=(--set 'model.attention="dsa"' --set model.dsa_topk=8 --set model.dsa_index_heads=2 --set model.dsa_index_dim=16
     --set model.dsa_index_share=2)
if train dsa1 1 "${DSA[@]}"; then
  MYRIAD_BACKEND=fenced train fenced_dsa1 1 "${DSA[@]}" && check fenced_dsa1 dsa1 0 loss,loss_indexer
  MYRIAD_BACKEND=fenced train fenced_dsa_dp2 2 "${DSA[@]}" --set parallel.dp=2 &&
    check fenced_dsa_dp2 dsa1 1e-4 loss,loss_indexer
fi
echo "   total $((SECONDS - T0)) s"
finish
