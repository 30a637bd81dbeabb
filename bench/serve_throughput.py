#!/usr/bin/python3
"""bench/serve_throughput: `myriad serve` under 1, 4, 16, 64 concurrent streaming
chat clients (threads + http.client, SSE), each level for --seconds; reports
output tokens/s, TTFT p50/p99 and inter-token gap p50/p99, and the speculative
acceptance from /metrics (the counters' change over the level), for each
--speculative mode and --weights format. The issue's target: 16
clients >= 6x the 1-client output rate on the GPT-2-shaped dense config.

    bench/serve_throughput.py [--ckpt runs/demo-moe] [--levels 1,4,16,64] [--seconds 20]
        [--speculative off,ngram,mtp] [--weights fp32,fp16,int8] [--max-tokens 64]
    bench/serve_throughput.py --gpt2 --data data/default   (writes a GPT-2-shaped dense checkpoint
        with `myriad train --set train.steps=1` into bench/out/gpt2_ckpt first; random-ish weights)
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import common

PROMPTS = ["Tell me a story about the sea.", "def parse_args(argv):", "What is the meaning of life?",
           "import os\nimport sys\n\nclass Config:", "A fortune for today:", "Write a haiku about snow."]


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(myriad_spec_\w+)(\{position="(\d+)"\})?\s+([-0-9.eE+naninf]+)$', line)
        if m:
            out[(m.group(1), int(m.group(3)) if m.group(3) else 0)] = float(m.group(4))
    return out


def client(port, model, stop_at, idx, max_tokens, rec):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    i = idx
    while time.time() < stop_at:
        body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]})
        i += 1
        t0 = time.time()
        try:
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
        except (http.client.HTTPException, OSError) as e:
            rec["errors"].append(repr(e))
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            continue
        if r.status != 200:
            rec["errors"].append(f"{r.status} {r.read()[:200]!r}")
            time.sleep(0.2)
            continue
        first, last, chunks, usage = None, None, 0, None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                r.read()  # the chunked body's end, so the connection can carry the next request
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    now = time.time()
                    if first is None:
                        first = now
                        rec["ttft"].append(now - t0)
                    else:
                        rec["itl"].append(now - last)
                    last = now
                    chunks += 1
        end = time.time()
        n = usage.get("completion_tokens", chunks) if usage else chunks
        with rec["lock"]:
            rec["requests"] += 1
            if end <= stop_at + 60:
                rec["tokens"] += n
            if usage and "speculative" in usage:
                rec["spec"] = usage["speculative"]
    conn.close()


def level(port, model, n, seconds, max_tokens):
    rec = {"ttft": [], "itl": [], "tokens": 0, "requests": 0, "errors": [], "lock": threading.Lock(), "spec": None}
    m0 = metrics(port)
    t0 = time.time()
    stop_at = t0 + seconds
    ts = [threading.Thread(target=client, args=(port, model, stop_at, i, max_tokens, rec)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0  # requests in flight at the deadline finish: count their time too
    m1 = metrics(port)
    acc = []
    for p in range(1, 17):
        k1, k2 = ("myriad_spec_draft_proposed_total", p), ("myriad_spec_draft_accepted_total", p)
        if k1 in m1:
            prop = m1[k1] - m0.get(k1, 0)
            acc.append((m1[k2] - m0.get(k2, 0)) / prop if prop > 0 else None)
    ver = m1.get(("myriad_spec_verifications_total", 0), 0) - m0.get(("myriad_spec_verifications_total", 0), 0)
    emi = m1.get(("myriad_spec_emitted_tokens_total", 0), 0) - m0.get(("myriad_spec_emitted_tokens_total", 0), 0)
    return {"clients": n, "tokens_per_s": rec["tokens"] / wall, "requests": rec["requests"],
            "ttft_p50": pct(rec["ttft"], 0.5), "ttft_p99": pct(rec["ttft"], 0.99),
            "itl_p50": pct(rec["itl"], 0.5), "itl_p99": pct(rec["itl"], 0.99), "errors": len(rec["errors"]),
            "first_error": rec["errors"][0] if rec["errors"] else None,
            "spec_acceptance_by_position": acc, "spec_mean_accepted_length": emi / ver if ver else None}


def serve(ckpt, tokenizer, spec, draft_tokens, max_batch, weights="fp32"):
    cmd = [f"{common.BUILD}/myriad", "serve", "--ckpt", ckpt, "--tokenizer", tokenizer, "--port", "0", "--speculative", spec,
           "--weights", weights,
           "--draft-tokens", str(draft_tokens), "--max-batch", str(max_batch), "--max-queue", "1024",
           "--http-threads", str(max(8, max_batch + 4)), "--model-name", "bench"]
    p = subprocess.Popen(cmd, env=common.myriad_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    raise SystemExit(f"myriad serve did not start: {' '.join(cmd)}")


def make_gpt2(data, out):
    if os.path.exists(os.path.join(out, "latest")):
        return out
    cmd = [f"{common.BUILD}/myriad", "train", "--config", f"{common.ROOT}/bench/configs/gpt2_dense.toml",
           "--set", "train.steps=1", "--set", "train.batch_size=1", "--set", "train.seq_len=32",
           "--set", f"train.out_dir={out}", "--set", f"data.dir={data}", "--set", "train.ckpt_every=1"]
    sys.stderr.write("writing a GPT-2-shaped checkpoint: " + " ".join(cmd) + "\n")
    subprocess.run(cmd, env=common.myriad_env(), check=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default=os.path.join(common.ROOT, "runs/demo-moe"))
    ap.add_argument("--gpt2", action="store_true", help="serve a GPT-2-shaped dense checkpoint (written once)")
    ap.add_argument("--data", default=os.path.join(common.ROOT, "data/default"))
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--speculative", default="off,ngram,mtp")
    ap.add_argument("--weights", default="fp32", help="comma-separated: fp32,fp16,int8")
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    ckpt = make_gpt2(a.data, os.path.join(common.ROOT, "bench/out/gpt2_ckpt")) if a.gpt2 else a.ckpt
    levels = [int(x) for x in a.levels.split(",")]
    results = {}
    print(f"serve {ckpt}; CPU {common.cpu_model()}")
    print(f"{'wts':5} {'spec':6} {'clients':>7} {'out tok/s':>9} {'x 1':>5} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7}"
          f" {'reqs':>5} {'err':>4}  acceptance by position")
    runs = [(w, s) for w in a.weights.split(",") for s in a.speculative.split(",")]
    for weights, spec in runs:
        p, port = serve(ckpt, os.path.join(a.data, "tokenizer.model"), spec, a.draft_tokens, max(levels), weights)
        try:
            level(port, "bench", 1, min(3, a.seconds), a.max_tokens)  # warm-up
            rows = []
            for n in levels:
                r = level(port, "bench", n, a.seconds, a.max_tokens)
                rows.append(r)
                x1 = r["tokens_per_s"] / rows[0]["tokens_per_s"] if rows[0]["tokens_per_s"] else float("nan")
                acc = " ".join("-" if v is None else f"{v:.2f}" for v in r["spec_acceptance_by_position"])
                print(f"{weights:5} {spec:6} {n:7d} {r['tokens_per_s']:9.1f} {x1:5.2f} {1e3 * r['ttft_p50']:7.0f}ms "
                      f"{1e3 * r['ttft_p99']:5.0f}ms {1e3 * r['itl_p50']:6.0f}ms {1e3 * r['itl_p99']:5.0f}ms "
                      f"{r['requests']:5d} {r['errors']:4d}  {acc}", flush=True)
                if r["first_error"]:
                    print(f"       first error: {r['first_error']}")
            results[f"{weights}/{spec}"] = rows
        finally:
            p.terminate()
            p.wait(timeout=60)
    base = results[next(iter(results))]
    r1 = base[0]["tokens_per_s"]
    r16 = next((r["tokens_per_s"] for r in base if r["clients"] == 16), None)
    ratio = r16 / r1 if r16 and r1 else None
    if ratio is not None:
        print(f"16 clients / 1 client ({next(iter(results))}): {ratio:.2f}x (target >= 6x on the GPT-2-shaped config: "
              f"{'met' if ratio >= 6 else 'NOT met'}{'' if a.gpt2 else '; this run is not that config'})")
    common.emit({"bench": "serve_throughput", "config": {"ckpt": ckpt, "levels": levels, "seconds": a.seconds,
                 "max_tokens": a.max_tokens, "draft_tokens": a.draft_tokens, "results": results},
                 "myriad": r16, "peer": r1, "peer_is": "myriad at 1 client", "unit": "output tokens/s",
                 "ratio": ratio, "roofline_fraction": None}, a.json_out)


if __name__ == "__main__":
    main()
