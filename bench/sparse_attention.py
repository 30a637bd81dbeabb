#!/usr/bin/python3
"""bench/sparse_attention: DSA (DeepSeek-style sparse attention, src/backend/cpu/dsa/dsa.h)
prefill and decode, Myriad against PyTorch, and Myriad's DSA against its own
dense flash attention.

    bench/sparse_attention.py [--T 4096,16384] [--rounds 3] [--reps 3]
        [--peer-max-T 16384] [--skip-dense-above 0] [--json-out FILE]

Per sequence length T (H 8, Hkv 4, D 64, indexer Hi 4 x Di 32, K 2048, B 1,
fp32, causal), rounds alternate (Myriad, PyTorch, Myriad, PyTorch ...):
  * Myriad (bench_sparse_attention): IndexerTopK + SparseAttention over
    Tq = Tk = T, and ops::Attention (dense flash attention, causal), the two
    alternating rep by rep inside the process; decode: one query against T
    keys, both ways; the indexer run once for 4 layers of attention.
  * PyTorch (this file, --peer): the same DSA written the way a PyTorch user
    would write it fast: per block of query rows, indexer scores by one
    matmul, relu, a batched weighted sum over the heads, the causal mask and
    torch.topk; then per block of rows the K selected keys and values are
    gathered and attended to with batched matmuls and a softmax. fp32,
    torch.set_num_threads(1) (--torch-threads) with OPENBLAS_CORETYPE=SkylakeX,
    PyTorch's fastest setting here (BENCHMARKS.md); same random inputs shape.
    It checks itself first against tests/golden/dsa_reference.py (float64) on
    a small problem.
Each process reports the median of its reps; the figures are the medians
over rounds. The last line is one JSON object.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and "--peer" in sys.argv and os.environ.get("MYRIAD_PEER_MALLOC", "tuned") != "default" \
        and "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):
    # The peer's allocator setting of bench/torch_peer.py (see its tune_malloc):
    # glibc reads GLIBC_TUNABLES only at start, so re-exec once with it set.
    _prev = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = (_prev + ":" if _prev else "") + "glibc.malloc.hugetlb=1"
    os.execv(sys.executable, [sys.executable] + sys.argv)
sys.path.insert(0, HERE)
import common  # noqa: E402

SHAPE = dict(B=1, H=8, Hkv=4, D=64, Hi=4, Di=32, K=2048)


# ----------------------------------------------------------------------------
# The PyTorch peer (runs in its own process, torch loaded after the env is set)
# ----------------------------------------------------------------------------

def torch_dsa(torch, q, k, v, qi, ki, wi, K, scale, pos0=0, idx_rows=128, att_rows=8):
    """One batch element. q [Tq,H,D], k/v [Tk,Hkv,D], qi [Tq,Hi,Di], ki [Tk,Di],
    wi [Tq,Hi]; query t at position pos0 + t. Returns out [Tq,H,D], the time
    spent in the indexer (scores + top-k) and in the attention, and the
    selection (idx [Tq, K], unsorted; valid [Tq, K] False on pads).

    Written for speed the ordinary way: row blocks bound the memory, every
    large intermediate lives in a buffer allocated once (out=), keys and
    values are gathered head-major so the batched matmuls need no copies."""
    Tq, H, D = q.shape
    Tk, Hkv, _ = k.shape
    Hi, Di = qi.shape[1], qi.shape[2]
    g = H // Hkv
    ninf = float("-inf")
    t0 = time.perf_counter()
    # --- indexer: I = sum_j w_j relu(qi_j . ki), causal, top-K per row.
    idx = torch.empty(Tq, K, dtype=torch.long)
    valid = torch.ones(Tq, K, dtype=torch.bool)
    nb = min(idx_rows, Tq)
    kmax = pos0 + Tq
    s_buf = torch.empty(nb * Hi * kmax)
    i_buf = torch.empty(nb * kmax)
    kiT = ki.t()
    cols = torch.arange(kmax)
    for r0 in range(0, Tq, idx_rows):
        r1 = min(Tq, r0 + idx_rows)
        n = r1 - r0
        kend = pos0 + r1  # keys a row of this block may see: 0 .. pos0 + r1 - 1
        s = s_buf[:n * Hi * kend].view(n * Hi, kend)
        torch.mm(qi[r0:r1].reshape(n * Hi, Di), kiT[:, :kend], out=s)
        s.relu_()
        I = i_buf[:n * kend].view(n, 1, kend)
        torch.bmm(wi[r0:r1].unsqueeze(1), s.view(n, Hi, kend), out=I)
        I = I.view(n, kend)
        if pos0 + r0 + 1 < kend:  # causal: row i sees keys <= pos0 + r0 + i
            rows = torch.arange(pos0 + r0, pos0 + r1).unsqueeze(1)
            I.masked_fill_(cols[:kend].unsqueeze(0) > rows, ninf)
        kk = min(K, kend)
        vals, ind = torch.topk(I, kk, dim=1, sorted=False)
        idx[r0:r1, :kk] = ind
        if kk < K:
            idx[r0:r1, kk:] = 0
            valid[r0:r1, kk:] = False
        if pos0 + r0 + 1 < K:  # rows with fewer than K visible keys: -inf picks are pads
            valid[r0:r1, :kk] &= vals != ninf
    t1 = time.perf_counter()
    # --- attention over the K gathered keys/values of each row.
    kh = k.permute(1, 0, 2).contiguous()  # [Hkv, Tk, D]
    vh = v.permute(1, 0, 2).contiguous()
    qh = q.view(Tq, Hkv, g, D).permute(1, 0, 2, 3).contiguous()  # [Hkv, Tq, g, D]
    oh = torch.empty(Hkv, Tq, g, D)
    na = min(att_rows, Tq)
    kg_buf = torch.empty(Hkv, na * K, D)
    vg_buf = torch.empty(Hkv, na * K, D)
    sc_buf = torch.empty(Hkv * na, K, g)
    o_buf = torch.empty(Hkv * na, g, D)
    for r0 in range(0, Tq, att_rows):
        r1 = min(Tq, r0 + att_rows)
        n = r1 - r0
        ib = idx[r0:r1].reshape(-1)
        kg = kg_buf[:, :n * K]
        vg = vg_buf[:, :n * K]
        torch.index_select(kh, 1, ib, out=kg)
        torch.index_select(vh, 1, ib, out=vg)
        # Scores as [K, g] per (head, row): bmm(keys, q^T) is the faster
        # orientation for OpenBLAS here (measured: ~1.6x over bmm(q, keys^T)).
        sc = sc_buf[:Hkv * n]
        torch.bmm(kg.view(Hkv * n, K, D), qh[:, r0:r1].reshape(Hkv * n, g, D).transpose(1, 2), out=sc)
        sc.mul_(scale)
        if pos0 + r0 + 1 < K:
            sc.view(Hkv, n, K, g).masked_fill_(~valid[r0:r1].view(1, n, K, 1), ninf)
        p = torch.softmax(sc.transpose(1, 2), dim=-1)  # [Hkv * n, g, K] (3x faster than dim=1 here)
        o = o_buf[:Hkv * n]
        torch.bmm(p, vg.view(Hkv * n, K, D), out=o)
        oh[:, r0:r1] = o.view(Hkv, n, g, D)
    out = oh.permute(1, 0, 2, 3).reshape(Tq, H, D)
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1, idx, valid


def peer_selfcheck(torch):
    """The peer computes DSA: compare with the float64 golden reference."""
    sys.path.insert(0, os.path.join(common.ROOT, "tests", "golden"))
    import dsa_reference as ref
    g = torch.Generator().manual_seed(5)
    for (Tq, Tk, K) in ((300, 300, 64), (1, 300, 64)):
        H, Hkv, D, Hi, Di = 8, 4, 32, 4, 16
        q = torch.randn(Tq, H, D, generator=g)
        k = torch.randn(Tk, Hkv, D, generator=g)
        v = torch.randn(Tk, Hkv, D, generator=g)
        qi = torch.randn(Tq, Hi, Di, generator=g) * 0.5
        ki = torch.randn(Tk, Di, generator=g) * 0.5
        wi = torch.randn(Tq, Hi, generator=g) * 0.5
        scale = 1 / math.sqrt(D)
        out, _, _, idx, valid = torch_dsa(torch, q, k, v, qi, ki, wi, K, scale, pos0=Tk - Tq, idx_rows=64,
                                          att_rows=5)
        # Selection: the scores picked are the K highest (random inputs tie
        # at exactly 0 often -- relu -- and torch.topk breaks ties its own
        # way, the spec's way is the lower index: compare score multisets).
        I, _ = ref.indexer_scores(qi[None].double(), ki[None].double(), wi[None].double())
        want_idx = ref.select_topk(I, Tq, Tk, K)[0]
        for t in range(Tq):
            got = sorted(I[0, t, idx[t][valid[t]]].tolist())
            w = want_idx[t][want_idx[t] >= 0]
            exp = sorted(I[0, t, w].tolist())
            if len(got) != len(exp) or max((abs(a_ - b_) for a_, b_ in zip(got, exp)), default=0) > 1e-5:
                raise SystemExit(f"PyTorch peer selects other scores than the reference (row {t})")
        # Attention over the peer's own selection.
        mask = torch.zeros(1, Tq, Tk, dtype=torch.bool)
        for t in range(Tq):
            mask[0, t, idx[t][valid[t]]] = True
        want, _, _ = ref.masked_attention(q[None].double(), k[None].double(), v[None].double(), mask, scale)
        err = float((out.double() - want[0]).abs().max() / want.abs().max())
        if err > 1e-4:
            raise SystemExit(f"PyTorch peer disagrees with tests/golden/dsa_reference.py: {err:.2e} "
                             f"(Tq {Tq}, Tk {Tk}, K {K})")


def run_peer(a):
    import torch_peer  # sets OPENBLAS_CORETYPE if unset and tunes malloc (MYRIAD_PEER_MALLOC=default: not)
    import torch
    torch.set_num_threads(a.torch_threads)
    peer_selfcheck(torch)
    s = SHAPE
    T, K = a.T, s["K"]
    scale = 1 / math.sqrt(s["D"])

    def inputs(Tq, Tk, seed):
        g = torch.Generator().manual_seed(seed)
        return dict(q=torch.randn(Tq, s["H"], s["D"], generator=g), k=torch.randn(Tk, s["Hkv"], s["D"], generator=g),
                    v=torch.randn(Tk, s["Hkv"], s["D"], generator=g),
                    qi=torch.randn(Tq, s["Hi"], s["Di"], generator=g) * 0.5,
                    ki=torch.randn(Tk, s["Di"], generator=g) * 0.5, wi=torch.randn(Tq, s["Hi"], generator=g) * 0.5)

    w = inputs(min(T, 2 * K), min(T, 2 * K), 1)
    for _ in range(2):
        torch_dsa(torch, **w, K=K, scale=scale)
    x = inputs(T, T, 42)
    ti, ta = [], []
    for r in range(a.reps):
        _, i_s, a_s, _, _ = torch_dsa(torch, **x, K=K, scale=scale)
        ti.append(i_s), ta.append(a_s)
        sys.stderr.write(f"  [pytorch T={T} rep {r + 1}/{a.reps}] indexer {i_s:.3f} s, attention {a_s:.3f} s, "
                         f"dsa {i_s + a_s:.3f} s\n")
    d = inputs(1, T, 44)
    di, da = [], []
    for r in range(a.decode_reps + 2):
        _, i_s, a_s, _, _ = torch_dsa(torch, **d, K=K, scale=scale, pos0=T - 1)
        if r >= 2:
            di.append(i_s), da.append(a_s)
    med = common.median
    dsa = [i + j for i, j in zip(ti, ta)]
    ddsa = [i + j for i, j in zip(di, da)]
    print(json.dumps({"bench": "sparse_attention_pytorch",
                      "config": dict(SHAPE, T=T, reps=a.reps, torch_threads=a.torch_threads,
                                     torch=torch.__version__,
                                     openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", ""),
                                     openblas_corename=torch_peer.openblas_corename(),
                                     malloc_tuned=torch_peer.MALLOC_TUNED,
                                     glibc_tunables=os.environ.get("GLIBC_TUNABLES")),
                      "prefill": {"indexer_s": med(ti), "attention_s": med(ta), "dsa_s": med(dsa), "dsa_s_reps": dsa},
                      "decode": {"indexer_s": med(di), "attention_s": med(da), "dsa_s": med(ddsa)}}))


# ----------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", default="4096,16384", help="comma-separated sequence lengths")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="timed reps inside each process")
    ap.add_argument("--decode-reps", type=int, default=30)
    ap.add_argument("--peer-max-T", type=int, default=16384, help="no PyTorch run above this T")
    ap.add_argument("--skip-dense-above", type=int, default=0,
                    help="Myriad dense prefill measured at this T and extrapolated (T^2) above it; 0: always measured")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--index-precision", default="int8", choices=["int8", "fp32"],
                    help="Myriad's indexer arithmetic for the DSA figure (the other one is timed too)")
    ap.add_argument("--no-roofline", action="store_true")
    ap.add_argument("--json-out")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        a.T = int(a.T)
        run_peer(a)
        return

    Ts = [int(t) for t in a.T.split(",")]
    binary = os.path.join(common.BUILD, "bench_sparse_attention")
    if not os.path.exists(binary):
        raise SystemExit(f"{binary} not found (build it: cmake --build {common.BUILD} --target bench_sparse_attention;"
                         f" MYRIAD_BUILD selects the build folder)")
    med = common.median
    rows = []
    for T in Ts:
        mine = [binary, "--T", str(T), "--reps", str(a.reps), "--decode-reps", str(a.decode_reps),
                "--skip-dense-above", str(a.skip_dense_above), "--roofline", "0" if a.no_roofline else "1",
                "--index-precision", a.index_precision]
        peer = [common.PY, os.path.abspath(__file__), "--peer", "--T", str(T), "--reps", str(a.reps),
                "--decode-reps", str(a.decode_reps), "--torch-threads", str(a.torch_threads)]
        runners = {"myriad": lambda: common.run_json(mine, common.myriad_env(), timeout=7200)}
        if T <= a.peer_max_T:
            runners["pytorch"] = lambda: common.run_json(peer, common.peer_env(), timeout=7200)
        sys.stderr.write(f"T={T}: {a.rounds} rounds of " + " / ".join(runners) + f", {a.reps} reps each\n")
        res = {n: [] for n in runners}
        for r in range(a.rounds):
            for n, run in runners.items():
                res[n].append(run())
            sys.stderr.write(f"  round {r + 1}/{a.rounds}: " + ", ".join(
                f"{n} DSA {res[n][-1]['prefill']['dsa_s']:.3f} s" for n in runners) + "\n")
        m = res["myriad"]
        mp = lambda key, part="prefill": med([x[part][key] for x in m])  # noqa: E731
        row = {"T": T, "myriad_indexer_s": mp("indexer_s"), "myriad_attention_s": mp("attention_s"),
               "myriad_dsa_s": mp("dsa_s"), "dense_measured": m[0]["prefill"]["dense_measured"],
               "myriad_decode_dsa_ms": 1e3 * mp("dsa_s", "decode"),
               "myriad_decode_indexer_ms": 1e3 * mp("indexer_s", "decode"),
               "myriad_decode_dense_ms": 1e3 * mp("dense_s", "decode")}
        if "one_thread" in m[0]["decode"]:
            row["myriad_decode_dsa_1thread_ms"] = 1e3 * med([x["decode"]["one_thread"]["dsa_s"] for x in m])
            row["myriad_decode_dense_1thread_ms"] = 1e3 * med([x["decode"]["one_thread"]["dense_s"] for x in m])
        dkey = "dense_s" if row["dense_measured"] else "dense_extrapolated_s"
        row["myriad_dense_s" if row["dense_measured"] else "myriad_dense_extrapolated_s"] = mp(dkey)
        row["dsa_vs_dense"] = mp(dkey) / row["myriad_dsa_s"]
        row["decode_dsa_vs_dense"] = row["myriad_decode_dense_ms"] / row["myriad_decode_dsa_ms"]
        row["indexer_share"] = row["myriad_indexer_s"] / row["myriad_dsa_s"]
        other = m[0]["prefill"].get("indexer_other")
        if other:
            row["index_precision"] = m[0]["config"].get("index_precision")
            row["other_precision"] = other["precision"]
            row["myriad_indexer_other_s"] = med([x["prefill"]["indexer_other"]["indexer_s"] for x in m])
            row["myriad_dsa_other_s"] = row["myriad_indexer_other_s"] + row["myriad_attention_s"]
            row["schedule"] = m[0]["config"].get("schedule")
        if "shared" in m[0]["prefill"]:
            n_l = m[0]["prefill"]["shared"]["layers"]
            once = med([x["prefill"]["shared"]["indexer_once_s"] for x in m])
            every = n_l * row["myriad_dsa_s"]
            row["shared"] = {"layers": n_l, "indexer_once_s": once, "indexer_every_layer_s": every,
                             "speedup": every / once,
                             "indexer_time_removed": 1 - 1 / n_l,
                             "dsa_time_removed": 1 - once / every}
        if "sgemm_peak_gflops" in m[0]["prefill"]:
            row["dsa_roofline_fraction"] = mp("dsa_roofline_fraction")
            row["dense_roofline_fraction"] = mp("dense_roofline_fraction")
            row["sgemm_peak_gflops"] = mp("sgemm_peak_gflops")
        if "pytorch" in res:
            p = res["pytorch"]
            pp = lambda key, part="prefill": med([x[part][key] for x in p])  # noqa: E731
            row.update({"pytorch_indexer_s": pp("indexer_s"), "pytorch_attention_s": pp("attention_s"),
                        "pytorch_dsa_s": pp("dsa_s"), "pytorch_decode_dsa_ms": 1e3 * pp("dsa_s", "decode")})
            row["dsa_vs_pytorch"] = row["pytorch_dsa_s"] / row["myriad_dsa_s"]
            if "myriad_dsa_other_s" in row:
                row["dsa_other_vs_pytorch"] = row["pytorch_dsa_s"] / row["myriad_dsa_other_s"]
            row["decode_dsa_vs_pytorch"] = row["pytorch_decode_dsa_ms"] / row["myriad_decode_dsa_ms"]
            if "myriad_decode_dsa_1thread_ms" in row:
                row["decode_dsa_1thread_vs_pytorch"] = row["pytorch_decode_dsa_ms"] / row["myriad_decode_dsa_1thread_ms"]
        row["rounds"] = {n: [x["prefill"]["dsa_s"] for x in res[n]] for n in res}
        rows.append(row)
        sys.stderr.write(
            f"  T={T} medians: Myriad DSA {row['myriad_dsa_s']:.3f} s (indexer {a.index_precision} "
            f"{row['myriad_indexer_s']:.3f}, share {100 * row['indexer_share']:.0f}%"
            + (f"; with the {row['other_precision']} indexer {row['myriad_dsa_other_s']:.3f} s" if "other_precision" in row else "")
            + f"), dense {mp(dkey):.3f} s"
            f"{'' if row['dense_measured'] else ' (EXTRAPOLATED)'} -> {row['dsa_vs_dense']:.2f}x"
            + (f"; PyTorch DSA {row['pytorch_dsa_s']:.3f} s -> {row['dsa_vs_pytorch']:.2f}x" if "pytorch" in res else "")
            + f"; decode DSA {row['myriad_decode_dsa_ms']:.2f} ms vs dense {row['myriad_decode_dense_ms']:.2f} ms"
            + (f" (one thread: {row['myriad_decode_dsa_1thread_ms']:.2f} vs {row['myriad_decode_dense_1thread_ms']:.2f})"
               if "myriad_decode_dsa_1thread_ms" in row else "")
            + (f", PyTorch DSA {row['pytorch_decode_dsa_ms']:.2f} ms" if "pytorch" in res else "") + "\n")

    # Headline: the largest T with a PyTorch peer; targets reported, not asserted.
    with_peer = [r for r in rows if "dsa_vs_pytorch" in r]
    head = max(with_peer, key=lambda r: r["T"]) if with_peer else max(rows, key=lambda r: r["T"])
    targets = {}
    for r in rows:
        if r["T"] == 16384 and "dsa_vs_pytorch" in r:
            targets["dsa_vs_pytorch_16k"] = {"value": r["dsa_vs_pytorch"], "goal": 3.5,
                                             "met": r["dsa_vs_pytorch"] >= 3.5}
        if r["T"] == 65536:
            targets["dsa_vs_dense_64k"] = {"value": r["dsa_vs_dense"], "goal": 4.0, "met": r["dsa_vs_dense"] >= 4.0,
                                           "dense_measured": r["dense_measured"]}
        if "shared" in r:
            targets[f"shared_indexer_T{r['T']}"] = {
                "indexer_share": r["indexer_share"], "indexer_time_removed": r["shared"]["indexer_time_removed"],
                "goal": 0.7, "dsa_time_removed": r["shared"]["dsa_time_removed"]}
    rec = {"bench": "sparse_attention",
           "config": dict(SHAPE, Ts=Ts, rounds=a.rounds, reps=a.reps, precision="fp32", causal=True,
                          index_precision=a.index_precision,
                          peer="PyTorch " + "(torch_threads=%d, OPENBLAS_CORETYPE=%s)" % (
                              a.torch_threads, common.peer_env()["OPENBLAS_CORETYPE"]),
                          headline_T=head["T"]),
           "rows": rows, "targets": targets,
           "myriad": head["T"] / head["myriad_dsa_s"],
           "peer": head["T"] / head["pytorch_dsa_s"] if "pytorch_dsa_s" in head else None,
           "unit": "prefill tokens/s (DSA: indexer + top-k + sparse attention)",
           "ratio": head.get("dsa_vs_pytorch"),
           "roofline_fraction": head.get("dsa_roofline_fraction")}
    common.emit(rec, a.json_out)


if __name__ == "__main__":
    main()
