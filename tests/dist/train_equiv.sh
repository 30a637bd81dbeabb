#!/usr/bin/env bash
# Distributed training equals single-rank training: configs/tiny.toml (fp32,
# 20 steps) on one rank is the baseline; under mpirun, dp4 (ZeRO 0, 1, 2),
# dp2 (ZeRO 1, 3), dp2 x ep2, tp2 x dp2, pp2 x dp2, cp2 x dp2, dp4 with a
# hierarchical all-reduce over 2 emulated nodes and, on 8 ranks, dp2 x ep4
# and dp2 x tp2 x pp2 must give the same 20 losses (<= 1e-4 relative; in
# practice ~1e-8). A DSA model (sparse top-8 attention from step 1) under
# dp2 x ep2 must give its single-rank losses and indexer KL (loss_indexer,
# non-zero) to the same bound; an MLA model (DeepSeek-V3's latent attention,
# its MTP input after the final norm) under pp2 x dp2 its single-rank losses.
# int8 compression of the inter-node stage must cut those
# bytes >= 3.5x and stay within 1% of the losses. dp2 ZeRO-3 must be
# bitwise dp2 ZeRO-1 (the same sums, in the same order): losses, gradient
# norms and the final model.safetensors. The dp2 x ep2 run's checkpoint
# (whole tensors) must load in single-rank `myriad eval` and `inspect`, and
# layouts that do not fit must fail with a message naming the setting.
# Usage: train_equiv.sh BUILD_DIR SOURCE_DIR MYRIAD_BINARY
# dist_lib.bash: argument handling, lib.sh, tiny data, $CFG, $PY, $T0, train().
source "$(dirname "$0")/dist_lib.bash" "$@"
S=(--set "data.dir=$WORK/data" --set train.precision=fp32 --set train.eval_every=0 --set train.ckpt_every=0
   --set train.log_every=1 --set train.steps=20 --fresh)

# compare NAME [BASE [KEYS]]: NAME's 20 steps against BASE's (default r1)
# for each metric in KEYS (comma-separated, default "loss"); each must be
# non-zero in the baseline.
compare() {
  local name="$1" base="${2:-r1}" keys="${3:-loss}" out
  if out=$("$PY" - "$WORK/$base/metrics.jsonl" "$WORK/$name/metrics.jsonl" "$name" "$keys" <<'EOF'
import json, sys
def losses(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return {r["step"]: r for r in rows}
base, run, name, keys = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
if sorted(run) != list(range(1, 21)) or sorted(base) != list(range(1, 21)):
    print(f"steps logged: {sorted(run)}"); sys.exit(1)
ok = "comm" in run[20] and run[20].get("ranks", 0) > 1
figures = []
for k in keys:
    if not all(base[s][k] != 0 for s in base):
        print(f"{k} is 0 in the baseline"); ok = False
    worst = max(abs(run[s][k] - base[s][k]) / abs(base[s][k] or 1) for s in base)
    ok = ok and worst <= 1e-4
    figures.append(f"max rel {k} diff {worst:.2e} (step 20 {run[20][k]:.6f} vs {base[20][k]:.6f})")
comm = run[20].get("comm", {})
print(f"{'; '.join(figures)} over 20 steps; ranks {run[20].get('ranks')}, grad_bytes {comm.get('grad_bytes')}, "
      f"ep_bytes {comm.get('ep_bytes')}")
if name.find("ep") >= 0 and not comm.get("ep_bytes", 0) > 0: print("no ep_bytes"); ok = False
if not comm.get("grad_bytes", 0) > 0: print("no grad_bytes"); ok = False
sys.exit(0 if ok else 1)
EOF
  ); then pass "$name matches single rank: $out"; else fail "$name: $out"; fi
}

echo "== runs"
train r1 1 || { finish; exit 1; }
runs=()
train dp4_z1 4 --set parallel.dp=4 && runs+=(dp4_z1)
train dp2ep2 4 --set parallel.dp=2 --set parallel.ep=2 && runs+=(dp2ep2)
train dp2_z3 2 --set parallel.dp=2 --set parallel.zero=3 && runs+=(dp2_z3)
train dp2_z1 2 --set parallel.dp=2 --set parallel.zero=1 && runs+=(dp2_z1)
train dp4_z0 4 --set parallel.dp=4 --set parallel.zero=0 && runs+=(dp4_z0)
train dp4_z2 4 --set parallel.dp=4 --set parallel.zero=2 && runs+=(dp4_z2)
train ep4dp2 8 --set parallel.dp=2 --set parallel.ep=4 && runs+=(ep4dp2)
train tp2dp2 4 --set parallel.tp=2 --set parallel.dp=2 && runs+=(tp2dp2)
train pp2dp2 4 --set parallel.pp=2 --set parallel.dp=2 && runs+=(pp2dp2)
train cp2dp2 4 --set parallel.cp=2 --set parallel.dp=2 && runs+=(cp2dp2)
train dp2tp2pp2 8 --set parallel.dp=2 --set parallel.tp=2 --set parallel.pp=2 && runs+=(dp2tp2pp2)
train hier4 4 --set parallel.dp=4 --set parallel.hierarchical=true --set parallel.ranks_per_node=2 && runs+=(hier4)
train int8 4 --set parallel.dp=4 --set parallel.compression=int8 --set parallel.ranks_per_node=2
# DeepSeek sparse attention: top-8 of the 32 keys, one indexer per two layers.
DSA=(--set 'model.attention="dsa"' --set model.dsa_topk=8 --set model.dsa_index_heads=2 --set model.dsa_index_dim=16
     --set model.dsa_index_share=2)
dsa_ok=0
# Open-model features (docs/open-models.md): q/k/v biases split by rows and
# per-head q/k norms whose gradients sum over the tp ranks' heads, yarn RoPE,
# unnormalised scaled routing.
OPEN=(--set model.qkv_bias=true --set model.qk_norm=true --set 'model.rope_scaling="yarn"' --set model.rope_factor=2
      --set model.norm_topk_prob=false --set model.routed_scaling_factor=2.5)
open_ok=0
train open_r1 1 "${OPEN[@]}" && train open_tp2dp2 4 "${OPEN[@]}" --set parallel.tp=2 --set parallel.dp=2 && open_ok=1
train dsa_r1 1 "${DSA[@]}" && train dsa_dp2ep2 4 "${DSA[@]}" --set parallel.dp=2 --set parallel.ep=2 && dsa_ok=1
# Multi-head latent attention (tp and cp are refused for it; pp, dp, ep are not).
MLA=(--set model.kv_lora_rank=16 --set model.q_lora_rank=12 --set model.qk_nope_head_dim=8
     --set model.qk_rope_head_dim=4 --set model.v_head_dim=12 --set model.mtp_after_final_norm=true)
mla_ok=0
train mla_r1 1 "${MLA[@]}" && train mla_pp2dp2 4 "${MLA[@]}" --set parallel.pp=2 --set parallel.dp=2 && mla_ok=1

echo "== losses against single rank"
for r in "${runs[@]}"; do compare "$r"; done
[ "$dsa_ok" = 1 ] && compare dsa_dp2ep2 dsa_r1 loss,loss_main,loss_indexer
if [ "$open_ok" = 1 ]; then compare open_tp2dp2 open_r1; else fail "open-model features: a run failed"; fi
if [ "$mla_ok" = 1 ]; then compare mla_pp2dp2 mla_r1 loss,loss_main,loss_mtp; else fail "MLA: a run failed"; fi

echo "== pipeline and compression figures"
if out=$("$PY" - "$WORK/pp2dp2/metrics.jsonl" "$WORK/hier4/metrics.jsonl" "$WORK/int8/metrics.jsonl" "$WORK/r1/metrics.jsonl" <<'EOF'
import json, sys
rows = [[json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:]]
pp, hier, int8, base = (r[-1] for r in rows)
pipe = pp["pipeline"]
ok = abs(pipe["bubble_theory"] - 1 / 5) < 1e-12 and 0 <= pipe["bubble_measured"] < 1 and pipe["p2p_bytes"] > 0
ratio = hier["comm"]["inter_node_bytes"] / max(1, int8["comm"]["inter_node_bytes"])
ok = ok and ratio >= 3.5 and hier["comm"]["intra_node_bytes"] == int8["comm"]["intra_node_bytes"] > 0
worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(rows[2], rows[3]))
ok = ok and worst < 1e-2
print(f"pp2 bubble {pipe['bubble_theory']:.3f} (schedule) / {pipe['bubble_measured']:.3f} (measured); "
      f"inter-node bytes {hier['comm']['inter_node_bytes']} -> {int8['comm']['inter_node_bytes']} with int8 "
      f"({ratio:.2f}x), int8 losses within {worst:.1e} of single rank")
sys.exit(0 if ok else 1)
EOF
); then pass "$out"; else fail "pipeline/compression figures: $out"; fi

echo "== ZeRO-3 holds only some parameters at once"
if out=$("$PY" -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]["zero3"]
peak, local = r["params_resident_peak"], r["params_local"]
print(f"peak {peak} of {local} parameter floats gathered at once")
sys.exit(0 if 0 < peak < local else 1)' "$WORK/dp2_z3/metrics.jsonl"); then pass "dp2 zero3: $out"
else fail "dp2 zero3 residency: $out"; fi

echo "== dp2 ZeRO-3 vs dp2 ZeRO-1, bitwise"
if [ -f "$WORK/dp2_z3/metrics.jsonl" ] && [ -f "$WORK/dp2_z1/metrics.jsonl" ]; then
  if out=$("$PY" - "$WORK/dp2_z3/metrics.jsonl" "$WORK/dp2_z1/metrics.jsonl" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
keys = ["loss", "loss_main", "loss_mtp", "loss_aux", "grad_norm"]
diff = [(x["step"], k) for x, y in zip(a, b) for k in keys if x[k] != y[k]]
print(f"{len(a)} steps, {len(keys)} figures each; {len(diff)} differ" + (f", first {diff[0]}" if diff else ""))
sys.exit(0 if len(a) == len(b) == 20 and not diff else 1)
EOF
  ); then pass "dp2 zero3 == dp2 zero1 bitwise: $out"; else fail "dp2 zero3 != dp2 zero1: $out"; fi
  a=$(ls -d "$WORK"/dp2_z3/step_* | tail -1)/model.safetensors
  b=$(ls -d "$WORK"/dp2_z1/step_* | tail -1)/model.safetensors
  if cmp -s "$a" "$b"; then pass "dp2 zero3 and zero1 final model.safetensors identical ($(stat -c %s "$a") bytes)"
  else fail "dp2 zero3 and zero1 final model.safetensors differ"; fi
fi

echo "== dp2 x ep2 checkpoint on one rank"
if [ -f "$WORK/dp2ep2/latest" ]; then
  # Single-rank eval of it equals eval of the single-rank run's checkpoint.
  if out=$("$MYRIAD" eval --ckpt "$WORK/dp2ep2" --batches 2 2>&1) &&
     ref=$("$MYRIAD" eval --ckpt "$WORK/r1" --batches 2 2>&1); then
    a=$(awk '/^val_loss/ {print $2}' <<<"$out"); b=$(awk '/^val_loss/ {print $2}' <<<"$ref")
    if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d <= 2e-4 && d >= -2e-4) }'; then
      pass "myriad eval loads the dp2 x ep2 checkpoint: val_loss $a (single-rank run's: $b)"
    else fail "myriad eval: dp2 x ep2 checkpoint val_loss '$a', single-rank run's '$b'"; fi
  else fail "myriad eval of the dp2 x ep2 checkpoint: $out ${ref:-}"; fi
  if out=$("$MYRIAD" inspect "$WORK/dp2ep2" 2>&1) && grep -q "mlp.experts.3.down_proj.weight" <<<"$out"; then
    pass "myriad inspect: whole tensors (experts 0-3 in one file)"
  else fail "myriad inspect of the dp2 x ep2 checkpoint: $(echo "$out" | tail -5)"; fi
fi

echo "== layouts that do not fit"
BAD=(-c "$CFG" "${S[@]}" --set "train.out_dir=$WORK/bad" -q)
expect_error "dp3 on 4 ranks" "parallel.*dp3.*4 ranks" \
  timeout 60 mpirun -np 4 --oversubscribe "$MYRIAD" train "${BAD[@]}" --set parallel.dp=3
expect_error "ep3 with 4 experts" "model\.n_routed_experts=4.*parallel\.ep=3" \
  timeout 60 mpirun -np 3 --oversubscribe "$MYRIAD" train "${BAD[@]}" --set parallel.ep=3
expect_error "dp3 on 3 ranks, batch of 8" "global batch.*=8 is not divisible by dp\*ep=3" \
  timeout 60 mpirun -np 3 --oversubscribe "$MYRIAD" train "${BAD[@]}" --set parallel.dp=3

echo "   total $((SECONDS - T0)) s"
finish
