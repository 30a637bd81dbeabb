#!/usr/bin/python3
"""bench/decode: batch-1 greedy decode tokens/s of Myriad vs a PyTorch decode
loop with a KV cache, on one config, and Myriad's fraction of the memory
roofline (weight bytes per token x tokens/s / DRAM read bandwidth measured in
the same run). Also runs Myriad with fp16 and int8 weights.

    bench/decode.py --config bench/configs/gpt2_dense.toml [--rounds 3] [--isa avx2]
    bench/decode.py --hf HF_DIR [--hf HF_DIR2 ...]   (imported models, their own weights; the peer is
        tests/hf/hf_reference.py; each line also gives the KV cache bytes per token)
"""
import argparse
import sys

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--hf", help="a Hugging Face folder instead of --config")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--isa", help="Myriad's CPU kernels: avx512, avx2 or scalar (MYRIAD_CPU_ISA; default: the best)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if (a.config is None) == (a.hf is None):
        ap.error("give one of --config and --hf")
    model = ["--config", a.config] if a.config else ["--hf", a.hf]
    env = common.myriad_env()
    if a.isa:
        env["MYRIAD_CPU_ISA"] = a.isa

    def mine(fmt):
        return [f"{common.BUILD}/bench_decode", *model, "--tokens", str(a.tokens),
                "--prompt-len", str(a.prompt_len), "--weights", fmt]

    peer = [common.PY, f"{common.ROOT}/bench/torch_peer.py", "decode" if a.config else "decode-hf", *model,
            "--tokens", str(a.tokens), "--prompt-len", str(a.prompt_len)]
    sys.stderr.write(f"decode {a.config or a.hf}: {a.rounds} rounds, Myriad (fp32) and PyTorch alternating\n")
    res = common.alternate(a.rounds, {"myriad-fp32": lambda: common.run_json(mine("fp32"), env),
                                      "pytorch-fp32": lambda: common.run_json(peer, common.peer_env())})
    ra, rb = res["myriad-fp32"], res["pytorch-fp32"]
    extra = {}
    for fmt in ("fp16", "int8"):
        rs = [common.run_json(mine(fmt), env) for _ in range(a.rounds)]
        extra[fmt] = {"tokens_per_s": common.median([r["tokens_per_s"] for r in rs]),
                      "roofline_fraction": common.median([r["roofline_fraction"] for r in rs]),
                      "roofline_range": [min(r["roofline_fraction"] for r in rs), max(r["roofline_fraction"] for r in rs)]}
    m = common.median([r["tokens_per_s"] for r in ra])
    p = common.median([r["tokens_per_s"] for r in rb])
    roof = common.median([r["roofline_fraction"] for r in ra])
    bw = common.median([r["read_bw_gbs"] for r in ra])
    sys.stderr.write(f"  median: myriad fp32 {m:.1f} tok/s ({100 * roof:.0f}% of the {bw:.1f} GB/s roofline), "
                     f"peer {p:.1f} tok/s, ratio {m / p:.2f}x; fp16 {extra['fp16']['tokens_per_s']:.1f}, "
                     f"int8 {extra['int8']['tokens_per_s']:.1f} tok/s "
                     f"({extra['int8']['tokens_per_s'] / m:.2f}x fp32); roofline fp16 "
                     f"{100 * extra['fp16']['roofline_fraction']:.0f}%, int8 {100 * extra['int8']['roofline_fraction']:.0f}% "
                     f"(backend {ra[0]['backend']})\n")
    gqa = None
    if a.hf and (ra[0].get("gqa_kv_bytes_per_token") or 0) != ra[0].get("kv_bytes_per_token"):
        # An MLA model: the same model with GQA attention of equal width, beside it.
        rs = [common.run_json(mine("fp32") + ["--attention", "gqa"], env) for _ in range(a.rounds)]
        gqa = {"tokens_per_s": common.median([r["tokens_per_s"] for r in rs]),
               "kv_bytes_per_token": rs[0]["kv_bytes_per_token"],
               "weight_bytes_per_token": rs[0]["weight_bytes_per_token"]}
        sys.stderr.write(f"  MLA: {m:.1f} tok/s, KV {ra[0]['kv_bytes_per_token']} B/token; the same model with GQA of "
                         f"equal width: {gqa['tokens_per_s']:.1f} tok/s, KV {gqa['kv_bytes_per_token']} B/token\n")
    common.emit({"bench": "decode", "gqa_equal_width": gqa, "config": {"file": a.config or a.hf, "kv_bytes_per_token": ra[0].get("kv_bytes_per_token"), "batch": 1, "tokens": a.tokens,
                 "prompt_len": a.prompt_len, "weights": "fp32", "read_bw_gbs": bw,
                 "weight_bytes_per_token": ra[0]["weight_bytes_per_token"], "threads": ra[0]["threads"],
                 "backend": ra[0]["backend"],
                 "fp16": extra["fp16"], "int8": extra["int8"],
                 "int8_vs_fp32": extra["int8"]["tokens_per_s"] / m},
                 "myriad": m, "peer": p, "unit": "tokens/s", "ratio": m / p, "roofline_fraction": roof},
                a.json_out)


if __name__ == "__main__":
    main()
