#!/usr/bin/python3
"""bench/edge_cloud: a mixed workload (chat, arithmetic, code, PII-heavy
business documents: the held-out split of `myriad route prompts`) sent to an
edge `myriad serve --edge --cloud URL --router R` twice per prompt, in
alternating order: pinned to the cloud ("all-cloud") and routed ("auto").
Both servers are real processes on loopback. Reported per arm: mean judged
quality (`myriad route score`: the verifier, else the cloud model's rubric),
cost at the cloud's billing prices (the cloud's "cost" of every request it
answered; an edge answer is free), p50/p99 latency, and the share per route.

    bench/edge_cloud.py --edge CKPT --cloud CKPT --router router.json --prompts prompts.jsonl
        [--tagger DIR] [--limit N] [--max-tokens 24] [--json-out FILE]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import common


def start(args, name):
    cmd = [f"{common.BUILD}/myriad", "serve", "--port", "0", "--model-name", name] + args
    p = subprocess.Popen(cmd, env=common.myriad_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, m.group(1)
    raise SystemExit(f"myriad serve did not start: {' '.join(cmd)}")


def ask(url, prompt, route, max_tokens):
    body = {"model": "edge", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stop": ["\n"],
            "route": route}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            j = json.loads(r.read())
    except urllib.error.HTTPError as e:
        j = json.loads(e.read())
        j["status"] = e.code
    ms = (time.perf_counter() - t0) * 1000
    return j, ms


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edge", required=True)
    ap.add_argument("--cloud", required=True)
    ap.add_argument("--router", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--tagger")
    ap.add_argument("--limit", type=int, default=0, help="held-out prompts to send (0: all)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    prompts = [json.loads(l) for l in open(a.prompts) if l.strip()]
    held = [p for p in prompts if p.get("split") == "held_out"]
    if a.limit:
        held = held[:a.limit]
    cloud, cloud_url = start(["--ckpt", a.cloud], "cloud")
    edge_args = ["--ckpt", a.edge, "--edge", "--cloud", cloud_url, "--router", a.router]
    if a.tagger:
        edge_args += ["--tagger", a.tagger]
    edge, edge_url = start(edge_args, "edge")
    rows = []
    skipped = []  # prompts a server refused (longer than these tiny models' context): left out of both arms
    try:
        for i, p in enumerate(held):
            arms = ["cloud", "auto"] if i % 2 == 0 else ["auto", "cloud"]
            got = []
            for arm in arms:
                j, ms = ask(edge_url, p["prompt"], arm, a.max_tokens)
                got.append((arm, j, ms))
            errors = [j for _, j, _ in got if "error" in j]
            if errors:
                skipped.append({"id": p["id"], "domain": p["domain"], "error": errors[0]["error"].get("message", "")[:160]})
                continue
            for arm, j, ms in got:
                route = j.get("route", "edge")
                cost = j.get("cost", {}).get("total", 0.0) if route != "edge" else 0.0
                rows.append({"id": p["id"], "domain": p["domain"], "arm": "all-cloud" if arm == "cloud" else "routed",
                             "route": route, "answer": j["choices"][0]["text"], "ms": ms, "cost": cost})
            if (i + 1) % 50 == 0:
                sys.stderr.write(f"edge_cloud: {i + 1}/{len(held)} prompts\n")
        metrics = urllib.request.urlopen(edge_url + "/metrics", timeout=30).read().decode()
    finally:
        for proc in (edge, cloud):
            proc.terminate()
            proc.wait(timeout=60)
    with tempfile.TemporaryDirectory() as tmp:
        ans = os.path.join(tmp, "answers.jsonl")
        with open(ans, "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        scored = os.path.join(tmp, "scored.jsonl")
        subprocess.run([f"{common.BUILD}/myriad", "route", "score", "--prompts", a.prompts, "--answers", ans,
                        "--judge", a.cloud, "--out", scored], check=True, env=common.myriad_env())
        rows = [json.loads(l) for l in open(scored)]
    out = {"bench": "edge_cloud", "cpu": common.cpu_model(), "prompts": len(held) - len(skipped),
           "skipped": len(skipped), "skipped_by_domain": {}, "arms": {}}
    for s in skipped:
        out["skipped_by_domain"][s["domain"]] = out["skipped_by_domain"].get(s["domain"], 0) + 1
    if skipped:
        sys.stderr.write(f"edge_cloud: {len(skipped)} prompts refused (e.g. {skipped[0]['error']}), left out of both arms\n")
    for arm in ("all-cloud", "routed"):
        rs = [r for r in rows if r["arm"] == arm]
        share = {k: sum(r["route"] == k for r in rs) / len(rs) for k in ("edge", "collaborative", "cloud")}
        per_domain = {}
        for d in sorted({r["domain"] for r in rs}):
            ds = [r for r in rs if r["domain"] == d]
            per_domain[d] = {"n": len(ds), "quality": sum(r["quality"] for r in ds) / len(ds),
                             "edge_share": sum(r["route"] == "edge" for r in ds) / len(ds)}
        out["arms"][arm] = {"quality": sum(r["quality"] for r in rs) / len(rs), "cost": sum(r["cost"] for r in rs),
                            "p50_ms": pct([r["ms"] for r in rs], 50), "p99_ms": pct([r["ms"] for r in rs], 99),
                            "share": share, "cloud_calls": sum(r["route"] != "edge" for r in rs),
                            "domains": per_domain}
    c, r = out["arms"]["all-cloud"], out["arms"]["routed"]
    out["cost_saved_fraction"] = 1 - r["cost"] / c["cost"] if c["cost"] > 0 else 0.0
    out["cloud_calls_cut"] = 1 - r["cloud_calls"] / max(1, c["cloud_calls"])
    m = re.search(r'^myriad_edge_redactions_total\{type="PHONE"\} (\d+)', metrics, re.M)
    out["metrics_phone_redactions"] = int(m.group(1)) if m else None
    print(f"| arm | quality | cost ({out['prompts']} requests) | p50 ms | p99 ms | edge / collaborative / cloud |")
    print("|---|---|---|---|---|---|")
    for arm, v in out["arms"].items():
        s = v["share"]
        print(f"| {arm} | {v['quality']:.3f} | {v['cost']:.6f} | {v['p50_ms']:.1f} | {v['p99_ms']:.1f} | "
              f"{s['edge']:.0%} / {s['collaborative']:.0%} / {s['cloud']:.0%} |")
    print(f"\ncloud calls cut {out['cloud_calls_cut']:.1%}, cost saved {out['cost_saved_fraction']:.1%}")
    print("\n| domain | n | all-cloud quality | routed quality | routed on the edge |")
    print("|---|---|---|---|---|")
    for d, v in r["domains"].items():
        print(f"| {d} | {v['n']} | {c['domains'][d]['quality']:.3f} | {v['quality']:.3f} | {v['edge_share']:.0%} |")
    if a.json_out:
        json.dump(out, open(a.json_out, "w"), indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
