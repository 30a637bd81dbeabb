#!/usr/bin/python3
"""bench/decode_batched: batched greedy decode tokens/s through the serving
runner (16 sequences by default, random weights), dense attention reading the
paged KV blocks in place (the paged_attention op) vs the former gather of
each sequence's blocks into a contiguous buffer. The two run alternately
(gather, paged, gather, paged, ...) in one invocation; medians and the ratio
paged / gather are quoted, for decode (per wall second, and per CPU second
of the process, steadier on a shared machine) and for prefill.

    bench/decode_batched.py --config configs/demo-moe.toml [--rounds 5] [--batch 16]
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
    ap.add_argument("--json-out")
    a = ap.parse_args()

    def run(path):
        cmd = [f"{common.BUILD}/bench_decode_batched", "--config", a.config, "--batch", str(a.batch),
               "--prompt-len", str(a.prompt_len), "--tokens", str(a.tokens), "--attention", path]
        return lambda: common.run_json(cmd, common.myriad_env())

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


if __name__ == "__main__":
    main()
