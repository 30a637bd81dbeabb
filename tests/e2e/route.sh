#!/usr/bin/env bash
# The edge/cloud router end to end through the CLI: two tiny models
# pretrained on arithmetic and Python task text (the "cloud" trained longer),
# then `myriad route prompts` -> `data` (both answer, the judge scores) ->
# `train` (two calibration knobs) -> `eval` (accuracy, APGR, cloud calls cut,
# curves, latency). Checked: the outputs' shape and invariants (splits
# disjoint, verdicts follow the rule, the budget honoured on the train split,
# the oracle's curve above every other, random routing's APGR 1/2), and bad
# input (a missing file, a malformed router.json, a bad record) is one clear
# line and a non-zero exit.
source "$(dirname "$0")/lib.sh" "$@"
[ -n "${ROUTE_KEEP:-}" ] && trap "echo kept $WORK" EXIT
export OMP_NUM_THREADS=1

mkdir -p "$WORK/corpus"
"$MYRIAD" tasks --domain arithmetic --count 3000 --difficulty 1 --text "$WORK/corpus/arith.txt" 2>/dev/null
"$MYRIAD" tasks --domain python --count 600 --text "$WORK/corpus/py.txt" 2>/dev/null
"$MYRIAD" prepare --input "$WORK/corpus" --out "$WORK/data" --vocab 300 --val-fraction 0.05 >/dev/null 2>&1
CFG="$SRC/configs/tiny.toml"
TR=(--set data.dir="$WORK/data" --set train.eval_every=0 --set train.precision=fp32 --set train.ckpt_every=0
    --set model.mtp_depth=0)
"$MYRIAD" train --config "$CFG" "${TR[@]}" --set train.steps=40 --set train.out_dir="$WORK/edge" -q 2>"$WORK/edge.log" \
  && "$MYRIAD" train --config "$CFG" "${TR[@]}" --set train.steps=1500 --set train.out_dir="$WORK/cloud" -q \
     2>"$WORK/cloud.log" && pass "pretrained an edge (40 steps) and a cloud model (1500 steps)" \
  || fail "pretraining: $(tail -3 "$WORK/edge.log" "$WORK/cloud.log")"

cat >"$WORK/docs.jsonl" <<'J'
{"text": "Quarterly report: revenue rose 12% to 4.1M. The customer Acme Ltd paid invoice INV-1001 on 3 May. Contact: li.wei@example.com, phone 13812345678."}
{"text": "会议纪要：张伟与北京星河科技有限公司签订合同，金额 120 万元，付款期限 30 天。"}
{"text": "Employee review for Maria Gomez: exceeded targets in Q3; budget request for two new client accounts approved."}
{"text": "Contract summary: Northwind Traders agrees to deliver 500 units to Contoso by 1 July; late payment incurs 2% a month."}
{"text": "客户投诉报告：订单 20261204 延迟送达，客户王芳要求退款，联系电话 021-55556666。"}
{"text": "Board meeting minutes: the account for Initech was closed; revenue forecast lowered; action items assigned to Bob."}
{"text": "Invoice dispute: customer Globex says invoice 7788 double-charged 300 USD; account manager Ana will reply."}
{"text": "年度总结报告：公司营收增长 8%，新增客户 45 家，员工满意度提升。"}
J
"$MYRIAD" route prompts --out "$WORK/prompts.jsonl" --count 48 --held-out 40 --seed 3 --docs "$WORK/docs.jsonl" \
  2>"$WORK/prompts.log" && pass "route prompts: $(tail -1 "$WORK/prompts.log")" || fail "route prompts: $(cat "$WORK/prompts.log")"
python3 - "$WORK/prompts.jsonl" <<'PY' && pass "prompt set: four domains, verifiers on tasks, disjoint splits" || fail "prompt set"
import json, sys
ps = [json.loads(l) for l in open(sys.argv[1])]
tr = {p["prompt"] for p in ps if p["split"] == "train"}
ho = [p for p in ps if p["split"] == "held_out"]
assert 44 <= len(tr) <= 48 and len(ho) > 30, (len(tr), len(ho))
assert len({p["prompt"] for p in ps}) == len(ps)
assert not any(p["prompt"] in tr for p in ho)
assert {p["domain"] for p in ps} == {"chat", "arithmetic", "code", "business"}, {p["domain"] for p in ps}
for p in ps: assert ("verifier" in p) == (p["domain"] in ("arithmetic", "code")), p
PY

"$MYRIAD" route data --edge "$WORK/edge" --cloud "$WORK/cloud" --prompts "$WORK/prompts.jsonl" \
  --out "$WORK/verdicts.jsonl" --max-tokens 8 --max-prompt-tokens 48 --margin 0 2>"$WORK/data.log" \
  && pass "route data: $(tail -1 "$WORK/data.log")" || fail "route data: $(tail -3 "$WORK/data.log")"
python3 - "$WORK/verdicts.jsonl" <<'PY' && pass "verdicts: qualities in [0,1], the rule, features of d_model 32" || fail "verdicts"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert len(rs) > 75, len(rs)
for r in rs:
    qe, qr = r["quality"]["edge"], r["quality"]["remote"]
    assert 0 <= qe <= 1 and 0 <= qr <= 1, r["quality"]
    want = "edge" if qe >= qr else ("collaborative" if r["pii"] else "cloud")
    assert r["verdict"] == want, (r["id"], r["verdict"], want)
    assert r["judged_by"] == ("verifier" if "verifier" in r else "rubric"), r["id"]
    f = r["features"]
    assert len(f["embedding"]) == 32 and f["prompt_tokens"] > 0 and 0 < f["probe_max_prob"] <= 1, f
    assert r["edge_model"]["d_model"] == 32
assert {r["verdict"] for r in rs} >= {"edge", "cloud"}, {r["verdict"] for r in rs}
PY

"$MYRIAD" route train --data "$WORK/verdicts.jsonl" --out "$WORK/router.json" --cloud-budget 0.4 2>"$WORK/train.log" \
  && grep -qE "remote share 0\.([0-3][0-9]*|400)" "$WORK/train.log" \
  && pass "route train --cloud-budget 0.4: $(tail -1 "$WORK/train.log")" || fail "route train: $(cat "$WORK/train.log")"
# A quality floor halfway between the train split's all-edge and all-remote means.
Q="$(python3 -c "
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
rs = [r for r in rs if r['split'] == 'train']
e = sum(r['quality']['edge'] for r in rs) / len(rs); c = sum(r['quality']['remote'] for r in rs) / len(rs)
print(round((e + c) / 2, 4))" "$WORK/verdicts.jsonl")"
"$MYRIAD" route train --data "$WORK/verdicts.jsonl" --out "$WORK/router-q.json" --min-quality "$Q" --hidden 0 \
  2>"$WORK/trainq.log" && python3 -c "
import re, sys
m = re.search(r'mean quality ([0-9.]+)', open(sys.argv[1]).read())
assert m and float(m.group(1)) >= float(sys.argv[2]) - 1e-3, (m and m.group(1), sys.argv[2])" "$WORK/trainq.log" "$Q" \
  && pass "route train --min-quality $Q (logistic): $(tail -1 "$WORK/trainq.log")" || fail "route train q: $(cat "$WORK/trainq.log")"

"$MYRIAD" route eval --data "$WORK/verdicts.jsonl" --router "$WORK/router.json" --json --curve "$WORK/route.dat" \
  >"$WORK/eval.json" 2>"$WORK/eval.log" && pass "route eval" || fail "route eval: $(cat "$WORK/eval.log")"
python3 - "$WORK/eval.json" "$WORK/route.dat" <<'PY' && pass "eval: metrics in range, oracle above all, random APGR 1/2, 4 curves" || fail "eval report: $(cat "$WORK/eval.json")"
import json, sys
e = json.load(open(sys.argv[1]))
for k in ("accuracy", "remote_share", "quality", "domain_rule_agreement", "live_agreement"):
    assert 0 <= e[k] <= 1, (k, e[k])
assert e["live_agreement"] == 1.0, e["live_agreement"]  # live features equal the stored ones
assert e["latency_ms"]["p50"] > 0 and e["latency_ms"]["p99"] >= e["latency_ms"]["p50"]
gap = e["all_cloud_quality"] != e["all_edge_quality"]
if gap: assert abs(e["random"]["apgr"] - 0.5) < 1e-9, e["random"]
for k in ("router", "knn", "random"):
    assert e["oracle"]["cloud_calls_cut"] >= e[k]["cloud_calls_cut"] - 1e-9, k
    if e["all_cloud_quality"] > e["all_edge_quality"]: assert e["oracle"]["apgr"] >= e[k]["apgr"] - 1e-9, k
blocks = [b for b in open(sys.argv[2]).read().split("\n\n\n") if b.strip()]
assert len(blocks) == 4, len(blocks)
curves = []
for b in blocks:
    pts = [[float(v) for v in l.split()] for l in b.splitlines() if l and not l.startswith("#")]
    assert len(pts) == e["held_out"] + 1 and pts[0][0] == 0 and pts[-1][0] == 1, len(pts)
    curves.append(pts)
for c in curves[:3]:  # the oracle's curve is above every other at every share (dat rounds to 6 digits)
    assert all(o[1] >= x[1] - 2e-6 for o, x in zip(curves[3], c)), (c, curves[3])
PY
if command -v gnuplot >/dev/null; then
  gnuplot -e "dat='$WORK/route.dat'; png='$WORK/route.png'" "$SRC/scripts/route_plot.gp" 2>"$WORK/gp.log" \
    && [ -s "$WORK/route.png" ] && pass "scripts/route_plot.gp draws the curves" || fail "gnuplot: $(cat "$WORK/gp.log")"
fi
"$MYRIAD" route eval --data "$WORK/verdicts.jsonl" --router "$WORK/router.json" --no-latency >"$WORK/eval.txt" 2>&1 \
  && grep -q "^router   APGR" "$WORK/eval.txt" && grep -q "^accuracy" "$WORK/eval.txt" \
  && pass "route eval (text, no model)" || fail "route eval text: $(cat "$WORK/eval.txt")"

# Bad input: one clear line, non-zero exit.
expect_one_line_error "missing verdicts" "nope.jsonl: cannot open" \
  "$MYRIAD" route train --data "$WORK/nope.jsonl" --out "$WORK/r.json"
expect_one_line_error "missing router.json" "nope.json: cannot read" \
  "$MYRIAD" route eval --data "$WORK/verdicts.jsonl" --router "$WORK/nope.json"
echo '{"format": "myriad-router-1", "features": {"embedding_dim": 32}}' >"$WORK/bad.json"
expect_one_line_error "malformed router.json" "bad.json: features.max_prompt_tokens: expected an integer" \
  "$MYRIAD" route eval --data "$WORK/verdicts.jsonl" --router "$WORK/bad.json"
echo 'not json' >"$WORK/bad2.json"
expect_one_line_error "router.json not JSON" "bad2.json: not JSON" \
  "$MYRIAD" route eval --data "$WORK/verdicts.jsonl" --router "$WORK/bad2.json" --no-latency
{ head -2 "$WORK/verdicts.jsonl"; echo '{"id": "x", "domain": "chat", "split": "sideways", "prompt": "p"}'; } >"$WORK/bad.jsonl"
expect_one_line_error "bad record names its line" "bad.jsonl:3: \"split\": 'sideways'" \
  "$MYRIAD" route train --data "$WORK/bad.jsonl" --out "$WORK/r.json"
expect_one_line_error "missing prompts" "nope.jsonl: cannot open" \
  "$MYRIAD" route data --edge "$WORK/edge" --cloud "$WORK/cloud" --prompts "$WORK/nope.jsonl" --out "$WORK/v.jsonl"
expect_one_line_error "unknown step" "unknown step 'fly'" "$MYRIAD" route fly
finish
