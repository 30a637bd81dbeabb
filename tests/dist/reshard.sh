#!/usr/bin/env bash
# Checkpoints reshard: a run stopped under one layout resumes under another
# and continues as if never stopped.
#   reference: configs/tiny.toml (fp32) for 20 steps on one rank, saving at 10
#   dp2 x ep2, --stop-after 10 (saves step 10), then
#     - the same out_dir resumed under dp4 for steps 11-20
#     - a copy of it resumed under ep4 for steps 11-20
#     - another copy resumed under tp2 x pp2 for steps 11-20
# Steps 11-20 must match the reference (<= 1e-4 relative). The step-10
# checkpoint written by dp2 x ep2 must hold the whole tensors: model and
# optimizer (exp_avg / exp_avg_sq of every expert of every MoE block, none
# all zero) equal to the reference's own step-10 checkpoint (<= 1e-4).
# Negative control: the same checkpoint with its moments zeroed (checksums
# recomputed) resumed under dp4 must diverge beyond the tolerance, so the
# comparison above would notice lost optimizer state.
# Usage: reshard.sh BUILD_DIR SOURCE_DIR MYRIAD_BINARY
# dist_lib.bash: argument handling, lib.sh, tiny data, $CFG, $PY, $T0, train().
source "$(dirname "$0")/dist_lib.bash" "$@"
S=(--set "data.dir=$WORK/data" --set train.precision=fp32 --set train.eval_every=0 --set train.ckpt_every=10
   --set train.log_every=1 --set train.steps=20)

# compare NAME [MODE]: steps 11-20 of NAME against the reference; MODE
# "diverge" expects a difference above the tolerance instead.
compare() {
  local name="$1" mode="${2:-match}" out
  if out=$("$PY" - "$WORK/ref/metrics.jsonl" "$WORK/$name/metrics.jsonl" "$mode" <<'EOF'
import json, sys
def by_step(path):
    d = {}
    for l in open(path):
        if l.strip():
            r = json.loads(l); d[r["step"]] = r   # the last record of a step wins
    return d
ref, run, mode = by_step(sys.argv[1]), by_step(sys.argv[2]), sys.argv[3]
steps = range(11, 21)
if any(s not in run for s in steps):
    print(f"steps logged: {sorted(run)}"); sys.exit(1)
rel = {s: abs(run[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"]) for s in steps}
worst = max(rel.values())
print(f"steps 11-20: max rel loss diff {worst:.2e} (step 11 {rel[11]:.1e}, step 20 {rel[20]:.1e}; "
      f"loss at 20 {run[20]['loss']:.6f} vs {ref[20]['loss']:.6f}; ranks {run[20].get('ranks', 1)})")
sys.exit(0 if (worst <= 1e-4) == (mode == "match") else 1)
EOF
  ); then
    if [ "$mode" = match ]; then pass "$name matches the uninterrupted run: $out"
    else pass "$name diverges from the uninterrupted run, as it must: $out"; fi
  else fail "$name ($mode expected): $out"; fi
}

echo "== runs"
train ref 1 --fresh || { finish; exit 1; }
train a 4 --fresh --set parallel.dp=2 --set parallel.ep=2 --stop-after 10 || { finish; exit 1; }
CK10=$WORK/a/step_00000010
[ -f "$CK10/manifest.json" ] || { fail "dp2 x ep2 --stop-after 10 left no step-10 checkpoint: $(ls "$WORK/a")"; finish; exit 1; }
cp -a "$WORK/a" "$WORK/b"
cp -a "$WORK/a" "$WORK/c"
cp -a "$WORK/a" "$WORK/zeroed"

echo "== the step-10 checkpoint of dp2 x ep2 against the reference's"
if out=$("$PY" - "$CK10" "$WORK/ref/step_00000010" <<'EOF'
import json, struct, sys, array
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n)); data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a = array.array("f"); a.frombytes(data[v["data_offsets"][0]:v["data_offsets"][1]])
        out[k] = a
    return out
got_dir, ref_dir = sys.argv[1], sys.argv[2]
ok = True
for fname in ["model.safetensors", "optimizer.safetensors"]:
    got, ref = load(f"{got_dir}/{fname}"), load(f"{ref_dir}/{fname}")
    if sorted(got) != sorted(ref):
        print(f"{fname}: tensor names differ: {sorted(set(got) ^ set(ref))[:5]}"); ok = False; continue
    worst, wname = 0.0, ""
    for k in ref:
        den = max(max(abs(x) for x in ref[k]), 1e-30)
        d = max(abs(x - y) for x, y in zip(got[k], ref[k])) / den
        if d > worst: worst, wname = d, k
    print(f"{fname}: {len(ref)} tensors, max rel diff {worst:.1e} ({wname})")
    if worst > 1e-4: ok = False
opt = load(f"{got_dir}/optimizer.safetensors")
cfg = json.load(open(f"{got_dir}/manifest.json"))
mc = cfg.get("model_config") or cfg.get("meta", {}).get("model_config")
E = mc["n_routed_experts"]
blocks = sorted({k.split(".mlp.experts.")[0] for k in opt if ".mlp.experts." in k})
missing, zero = [], []
for b in blocks:
    for e in range(E):
        for w in ["gate_proj", "up_proj", "down_proj"]:
            for m in ["exp_avg", "exp_avg_sq"]:
                k = f"{b}.mlp.experts.{e}.{w}.weight.{m}"
                if k not in opt: missing.append(k)
                elif max(abs(x) for x in opt[k]) == 0: zero.append(k)
print(f"optimizer: {len(blocks)} MoE blocks x {E} experts x 3 weights x 2 moments; "
      f"{len(missing)} missing, {len(zero)} all zero" + (f" (e.g. {(missing + zero)[0]})" if missing or zero else ""))
if not blocks or missing or zero: ok = False
sys.exit(0 if ok else 1)
EOF
); then pass "checkpoint holds whole tensors equal to the reference's: ${out//$'\n'/; }"
else fail "step-10 checkpoint: ${out//$'\n'/; }"; fi

echo "== resume under other layouts"
if train a 4 --set parallel.dp=4; then compare a; fi  # dp2 x ep2 -> dp4
if train b 4 --set parallel.ep=4; then compare b; fi  # dp2 x ep2 -> ep4
if train c 4 --set parallel.tp=2 --set parallel.pp=2; then compare c; fi  # dp2 x ep2 -> tp2 x pp2

echo "== negative control: moments zeroed"
if out=$("$PY" - "$WORK/zeroed/step_00000010" <<'EOF'
import json, struct, sys
M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def rnd(acc, lane): return (rotl((acc + lane * P2) & M, 31) * P1) & M
def merge(h, v): return ((h ^ rnd(0, v)) * P1 + P4) & M
def xxh64(b):  # xxHash64, seed 0
    n, i = len(b), 0
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        for i in range(0, n - 31, 32):
            a, b2, c, d = struct.unpack_from("<4Q", b, i)
            v = [rnd(v[0], a), rnd(v[1], b2), rnd(v[2], c), rnd(v[3], d)]
        i = (n // 32) * 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v: h = merge(h, x)
    else:
        h = P5
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", b, i)[0]), 27) * P1 + P4) & M; i += 8
    if i + 4 <= n:
        h = (rotl(h ^ ((struct.unpack_from("<I", b, i)[0] * P1) & M), 23) * P2 + P3) & M; i += 4
    while i < n:
        h = (rotl(h ^ ((b[i] * P5) & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = (h * P2) & M; h ^= h >> 29; h = (h * P3) & M; h ^= h >> 32
    return h
d = sys.argv[1]
man = json.load(open(f"{d}/manifest.json"))
files = {f["name"]: f for f in man["files"]}
# The implementation must agree with the manifest before it may rewrite it.
model = open(f"{d}/model.safetensors", "rb").read()
if f"{xxh64(model):016x}" != files["model.safetensors"]["xxhash64"]:
    print("xxh64 here disagrees with the manifest's checksum"); sys.exit(1)
buf = bytearray(open(f"{d}/optimizer.safetensors", "rb").read())
n = struct.unpack_from("<Q", buf, 0)[0]
buf[8 + n:] = bytes(len(buf) - 8 - n)   # every moment zero
open(f"{d}/optimizer.safetensors", "wb").write(buf)
files["optimizer.safetensors"]["xxhash64"] = f"{xxh64(bytes(buf)):016x}"
# The manifest's own checksum: xxh64 of its compact, key-sorted dump
# without that key (checkpoint.h); checked against the written one first.
def own(m):
    rest = {k: v for k, v in m.items() if k != "manifest_xxhash64"}
    return f"{xxh64(json.dumps(rest, sort_keys=True, separators=(',', ':'), ensure_ascii=False).encode()):016x}"
if own(json.load(open(f"{d}/manifest.json"))) != man["manifest_xxhash64"]:
    print("the manifest checksum here disagrees with the written one"); sys.exit(1)
man["manifest_xxhash64"] = own(man)
json.dump(man, open(f"{d}/manifest.json", "w"), indent=2)
print(f"zeroed {len(buf) - 8 - n} bytes of moments")
EOF
); then
  if train zeroed 4 --set parallel.dp=4; then compare zeroed diverge; fi
else
  echo "   skip: negative control not run, could not rewrite the checkpoint: $out"
fi

echo "   total $((SECONDS - T0)) s"
finish
