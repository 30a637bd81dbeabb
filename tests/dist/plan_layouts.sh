#!/usr/bin/env bash
# Layouts the planner proposes train. `myriad plan` on configs/tiny.toml
# (a training config: planned as Myriad trains it) for 4 CPU devices gives
# its best layout and the best of every other (dp, tp, pp, ep, cp); five of
# them -- the best, then those that add a degree not yet covered -- run 3
# steps of `myriad train` under mpirun, as a run would set them in
# [parallel] (degrees, ZeRO stage; with pp, parallel.microbatches = a data
# rank's sequences / the micro-batch). Each must exit 0, log 3 steps of
# finite loss on 4 ranks. The same with DSA attention: every proposal is dp
# and ep only (what dist training supports with DSA), one with ep runs, and
# `myriad train` refuses DSA under tp2 x dp2 with the validator's message.
# tests/layout_test.cc checks that every proposal validates; this checks a
# sample really trains.
# Usage: plan_layouts.sh BUILD_DIR SOURCE_DIR MYRIAD_BINARY
# dist_lib.bash: argument handling, lib.sh, tiny data, $CFG, $PY, $T0, train().
source "$(dirname "$0")/dist_lib.bash" "$@"
S=(--set "data.dir=$WORK/data" --set train.precision=fp32 --set train.eval_every=0 --set train.ckpt_every=0
   --set train.log_every=1 --set train.steps=3 --set train.health_check=false --set 'train.snapshot_dir="none"'
   --fresh)
DSA=(--set 'model.attention="dsa"' --set model.dsa_topk=8 --set model.dsa_index_heads=2 --set model.dsa_index_dim=16)

# sample NAME COUNT [plan args...]: plan 4 devices, print COUNT layouts as
# "dp tp pp ep cp zero microbatches" lines (the first the planner's best).
sample() {
  local name="$1" count="$2"; shift 2
  "$MYRIAD" plan -c "$CFG" --cluster cpu --devices 4 --set cluster.node.size=4 --top 50 --json "$@" \
    >"$WORK/$name.plan.json" 2>"$WORK/$name.plan.err" || { fail "$name: myriad plan: $(cat "$WORK/$name.plan.err")"; return 1; }
  "$PY" - "$WORK/$name.plan.json" "$count" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
count = int(sys.argv[2])
assert j["found"], j
all_ = [j["best"]] + j.get("runners_up", [])
dims = ("dp", "tp", "pp", "ep", "cp")
picked, covered = [], set()
for cand in all_:  # the best first, then whatever adds a degree > 1 not yet covered
    new = {d for d in dims if cand["layout"][d] > 1} - covered
    if picked and not new: continue
    picked.append(cand); covered |= new
    if len(picked) == count: break
print(f"# {len(all_)} proposals: " + ", ".join(
    "x".join(f"{d}{c['layout'][d]}" for d in dims if c["layout"][d] > 1) or "1" for c in all_), file=sys.stderr)
for cand in picked:  # "microbatches": the estimate's per data rank (its sequences / micro_batch)
    l = cand["layout"]
    print(l["dp"], l["tp"], l["pp"], l["ep"], l["cp"], l["zero"], cand["microbatches"] if l["pp"] > 1 else 0)
EOF
}

# run NAME dp tp pp ep cp zero micro [extra --set...]: 3 steps on dp*..*cp ranks, checked.
run() {
  local name="$1" dp="$2" tp="$3" pp="$4" ep="$5" cp="$6" zero="$7" micro="$8"; shift 8
  local np=$((dp * tp * pp * ep * cp))
  local set=(--set parallel.dp="$dp" --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.ep="$ep"
             --set parallel.cp="$cp" --set parallel.zero="$zero" --set parallel.microbatches="$micro")
  train "$name" "$np" "${set[@]}" "$@" || return 0
  if out=$("$PY" - "$WORK/$name/metrics.jsonl" "$np" <<'EOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "loss" in r and "step" in r]
ok = [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows)
ok = ok and all(r.get("ranks") == int(sys.argv[2]) for r in rows)
print(f"steps {[r['step'] for r in rows]}, losses {[round(r['loss'], 4) for r in rows]}, ranks {rows[-1].get('ranks') if rows else None}")
sys.exit(0 if ok else 1)
EOF
  ); then pass "$name (dp$dp tp$tp pp$pp ep$ep cp$cp zero$zero micro$micro) trains: $out"
  else fail "$name: $out"; fi
}

echo "== planner proposals for the tiny config, 4 devices"
if layouts=$(sample dense 5); then
  cat "$WORK/dense.plan.err" >&2 || true
  [ "$(wc -l <<<"$layouts")" -ge 5 ] && pass "5 sampled proposals cover dp, ep, tp, cp and pp" ||
    fail "fewer than 5 proposals: $layouts"
  i=0
  # (fd 3: mpirun reads stdin)
  while read -r -u 3 dp tp pp ep cp zero micro; do
    i=$((i + 1))
    run "dense$i" "$dp" "$tp" "$pp" "$ep" "$cp" "$zero" "$micro"
  done 3<<<"$layouts"
  [ "$i" -eq 5 ] && pass "5 proposals run" || fail "$i proposals run, expected 5"
fi

echo "== with DSA attention"
if layouts=$(sample dsa 8 "${DSA[@]}"); then
  cat "$WORK/dsa.plan.err" >&2 || true
  if "$PY" - "$WORK/dsa.plan.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
bad = [c["layout"] for c in [j["best"]] + j.get("runners_up", []) if max(c["layout"][d] for d in ("tp", "pp", "cp")) > 1]
print(bad); sys.exit(1 if bad else 0)
EOF
  then pass "every DSA proposal is dp/ep only"; else fail "a DSA proposal with tp, pp or cp"; fi
  read -r dp tp pp ep cp zero micro < <(awk '$4 > 1' <<<"$layouts" | head -1) || true
  if [ -n "${dp:-}" ]; then run dsa_ep "$dp" "$tp" "$pp" "$ep" "$cp" "$zero" "$micro" "${DSA[@]}"
  else fail "no DSA proposal with ep > 1: $layouts"; fi
fi

# What the planner leaves out, training refuses with the same rule.
expect_error "DSA under tp2 x dp2" 'parallel\.tp=2: model\.attention="dsa" trains with data and expert parallelism only' \
  timeout 60 mpirun -np 4 --oversubscribe "$MYRIAD" train -c "$CFG" "${S[@]}" "${DSA[@]}" --set "train.out_dir=$WORK/bad" \
  -q --set parallel.tp=2 --set parallel.dp=2

echo "   total $((SECONDS - T0)) s"
finish
