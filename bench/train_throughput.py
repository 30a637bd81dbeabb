#!/usr/bin/python3
"""bench/train_throughput: training tokens/s of Myriad vs PyTorch on one config.

Same model (the golden reference architecture), same shapes and batch, random
tokens, fp32, both using both cores (Myriad: OpenMP over 2 threads; PyTorch:
torch.set_num_threads(1) with OpenBLAS using both cores, its fastest setting
here per BENCHMARKS.md), both with OpenBLAS's fast kernel. MFU is against the
SGEMM peak Myriad measures in the same run.

    bench/train_throughput.py --config configs/demo-moe.toml [--rounds 3]
    bench/train_throughput.py --hf HF_DIR [--batch 8 --seq 256]   (an imported model; the peer is
        tests/hf/hf_reference.py's independent implementation of its family)
"""
import argparse
import sys

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--hf", help="a Hugging Face folder instead of --config")
    ap.add_argument("--batch", type=int, default=8, help="with --hf")
    ap.add_argument("--seq", type=int, default=256, help="with --hf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if (a.config is None) == (a.hf is None):
        ap.error("give one of --config and --hf")
    model = ["--config", a.config] if a.config else ["--hf", a.hf, "--batch", str(a.batch), "--seq", str(a.seq)]
    def mine(precision):
        return [f"{common.BUILD}/bench_train_throughput", *model, "--steps", str(a.steps),
                "--warmup", str(a.warmup), "--precision", precision]
    if a.config:
        peer = [common.PY, f"{common.ROOT}/bench/torch_peer.py", "train", "--config", a.config, "--steps",
                str(a.steps), "--warmup", str(a.warmup), "--threads", "1"]
    else:
        peer = [common.PY, f"{common.ROOT}/bench/torch_peer.py", "train-hf", "--hf", a.hf, "--batch", str(a.batch),
                "--seq", str(a.seq), "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", "1"]
    sys.stderr.write(f"train_throughput {a.config or a.hf}: {a.rounds} rounds, Myriad and PyTorch alternating\n")
    res = common.alternate(a.rounds, {
        "myriad-fp32": lambda: common.run_json(mine("fp32"), common.myriad_env()),
        "pytorch-fp32": lambda: common.run_json(peer, common.peer_env()),
        "myriad-auto": lambda: common.run_json(mine("auto"), common.myriad_env()),
    })
    ra, rb, rc = res["myriad-fp32"], res["pytorch-fp32"], res["myriad-auto"]
    auto = common.median([r["tokens_per_s"] for r in rc])
    auto_precision = rc[0].get("precision", "fp32")
    m = common.median([r["tokens_per_s"] for r in ra])
    p = common.median([r["tokens_per_s"] for r in rb])
    peak = common.median([r["sgemm_peak_gflops"] for r in ra])
    fpt = ra[0]["flops_per_token"]
    mfu = fpt * m / (peak * 1e9)
    sys.stderr.write(f"  median: myriad fp32 {m:.1f} tok/s (MFU {100 * mfu:.1f}%), peer fp32 {p:.1f} tok/s "
                     f"(MFU {100 * fpt * p / (peak * 1e9):.1f}%), ratio {m / p:.2f}x (same precision); "
                     f"myriad default ({auto_precision}) {auto:.1f} tok/s, {auto / p:.2f}x; "
                     f"SGEMM peak {peak:.0f} GFLOP/s\n")
    common.emit({"bench": "train_throughput", "config": {"file": a.config or a.hf, "params": ra[0]["params"],
                 "threads": ra[0]["threads"], "blas_core": ra[0]["blas_core"], "backend": ra[0]["backend"],
                 "peer_blas_core": rb[0].get("openblas_coretype"), "peer_threads": rb[0].get("threads"),
                 "precision": "fp32", "steps": a.steps, "rounds": a.rounds, "sgemm_peak_gflops": peak,
                 "peer_mfu": fpt * p / (peak * 1e9), "myriad_default_precision": auto_precision,
                 "myriad_default_tokens_per_s": auto, "myriad_default_ratio": auto / p},
                 "myriad": m, "peer": p, "unit": "tokens/s", "ratio": m / p, "roofline_fraction": mfu},
                a.json_out)


if __name__ == "__main__":
    main()
