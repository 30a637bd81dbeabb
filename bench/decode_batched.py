#!/usr/bin/python3
"""bench/decode_batched: batched greedy decode tokens/s through the serving
runner (16 sequences by default, random weights), dense attention reading the
paged KV blocks in place (the paged_attention op) vs the former gather of
each sequence's blocks into a contiguous buffer. The two run alternately
(gather, paged, gather, paged, ...) in one invocation; medians and the ratio
paged / gather are quoted, for decode (per wall second, and per CPU second
of the process, steadier on a shared machine) and for prefill.

    bench/decode_batched.py --config configs/demo-moe.toml [--rounds 5] [--batch 16]

With --before-build DIR (a build of another commit whose bench_decode_batched
takes --weights), the paged path of that build and of this one alternate
instead, for each format of --weights (fp32,fp16,int8): decode tokens/s of
the batch before and after, and the memory-roofline fraction of a step (the
weight bytes one step reads x steps/s / the read bandwidth measured in the
same process).

    bench/decode_batched.py --config bench/configs/gpt2_dense.toml --before-build B --weights fp32,fp16,int8
"""
import argparse
import sys

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--weights", default="fp32", help="comma-separated formats (with --before-build)")
    ap.add_argument("--before-build", help="a build dir of the commit to compare with (see above)")
    ap.add_argument("--isa", help="Myriad's CPU kernels: avx512, avx2 or scalar (MYRIAD_CPU_ISA)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    env = common.myriad_env()
    if a.isa:
        env["MYRIAD_CPU_ISA"] = a.isa
    if a.before_build:
        return before_after(a, env)

    def run(path):
        cmd = [f"{common.BUILD}/bench_decode_batched", "--config", a.config, "--batch", str(a.batch),
               "--prompt-len", str(a.prompt_len), "--tokens", str(a.tokens), "--attention", path]
        return lambda: common.run_json(cmd, env)

    sys.stderr.write(f"decode_batched {a.config}: batch {a.batch}, {a.rounds} rounds, gather and paged alternating\n")
    res = common.alternate(a.rounds, {"gather": run("gather"), "paged": run("paged")})
    med = {k: common.median([r["tokens_per_s"] for r in v]) for k, v in res.items()}
    pre = {k: common.median([r["prefill_tokens_per_s"] for r in v]) for k, v in res.items()}
    cpu = {k: common.median([r["tokens_per_cpu_s"] for r in v]) for k, v in res.items()}
    sys.stderr.write(f"  median decode: paged {med['paged']:.0f} tok/s, gather {med['gather']:.0f} tok/s, "
                     f"ratio {med['paged'] / med['gather']:.3f}x; per CPU second: paged {cpu['paged']:.0f}, "
                     f"gather {cpu['gather']:.0f} ({cpu['paged'] / cpu['gather']:.3f}x); prefill: paged {pre['paged']:.0f}, "
                     f"gather {pre['gather']:.0f} tok/s ({pre['paged'] / pre['gather']:.3f}x)\n")
    g = res["paged"][0]
    common.emit({"bench": "decode_batched", "config": {"file": a.config, "batch": a.batch, "tokens": a.tokens,
                 "prompt_len": a.prompt_len, "backend": g["backend"], "threads": g["threads"],
                 "rounds": {k: [r["tokens_per_s"] for r in v] for k, v in res.items()},
                 "per_cpu_s": {"paged": cpu["paged"], "gather": cpu["gather"],
                               "ratio": cpu["paged"] / cpu["gather"]},
                 "prefill": {"paged": pre["paged"], "gather": pre["gather"],
                             "ratio": pre["paged"] / pre["gather"]}},
                 "myriad": med["paged"], "peer": med["gather"], "unit": "tokens/s",
                 "ratio": med["paged"] / med["gather"]}, a.json_out)


def before_after(a, env):
    def run(build, fmt):
        cmd = [f"{build}/bench_decode_batched", "--config", a.config, "--batch", str(a.batch),
               "--prompt-len", str(a.prompt_len), "--tokens", str(a.tokens), "--weights", fmt]
        return lambda: common.run_json(cmd, env)

    fmts = a.weights.split(",")
    runners = {}
    for fmt in fmts:
        runners[f"before-{fmt}"] = run(a.before_build, fmt)
        runners[f"after-{fmt}"] = run(common.BUILD, fmt)
    sys.stderr.write(f"decode_batched {a.config}: batch {a.batch}, {a.rounds} rounds, before ({a.before_build}) "
                     f"and after alternating, weights {a.weights}\n")
    res = common.alternate(a.rounds, runners)
    out = {}
    for fmt in fmts:
        row = {}
        for side in ("before", "after"):
            rs = res[f"{side}-{fmt}"]
            row[side] = {k: common.median([r[k] for r in rs])
                         for k in ("tokens_per_s", "tokens_per_cpu_s", "prefill_tokens_per_s", "roofline_fraction")}
            row[side]["range"] = [min(r["tokens_per_s"] for r in rs), max(r["tokens_per_s"] for r in rs)]
        row["ratio"] = row["after"]["tokens_per_s"] / row["before"]["tokens_per_s"]
        out[fmt] = row
        b, f = row["before"], row["after"]
        sys.stderr.write(f"  {fmt}: decode {b['tokens_per_s']:.0f} -> {f['tokens_per_s']:.0f} tok/s ({row['ratio']:.2f}x; "
                         f"step roofline {100 * b['roofline_fraction']:.0f}% -> {100 * f['roofline_fraction']:.0f}%), "
                         f"prefill {b['prefill_tokens_per_s']:.0f} -> {f['prefill_tokens_per_s']:.0f} tok/s\n")
    g = res[f"after-{fmts[0]}"][0]
    common.emit({"bench": "decode_batched_before_after", "config": {"file": a.config, "batch": a.batch,
                 "tokens": a.tokens, "prompt_len": a.prompt_len, "backend": g["backend"], "threads": g["threads"],
                 "read_bw_gbs": g["read_bw_gbs"], "step_weight_bytes": g["step_weight_bytes"], "formats": out},
                 "myriad": out[fmts[0]]["after"]["tokens_per_s"], "peer": out[fmts[0]]["before"]["tokens_per_s"],
                 "unit": "tokens/s", "ratio": out[fmts[0]]["ratio"]}, a.json_out)


if __name__ == "__main__":
    main()
