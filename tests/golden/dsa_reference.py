#!/usr/bin/python3
"""PyTorch reference of DSA (DeepSeek-style sparse attention) and its golden-file writer.

Written from the math in the header comment of src/backend/cpu/dsa/dsa.h (not from the
C++ kernels), in float64 on fp32-rounded inputs, so that tests/dsa_golden_test.cc
can hold cpu::dsa::IndexerTopK, SparseAttention, SparseAttentionBackward and
IndexerLoss to it:

  pos(t)   = Tk - Tq + t; query t sees keys 0..pos(t)
  I(t, s)  = sum_j wi[t, j] * relu(qi[t, j, :] . ki[s, :])
  idx[t]   = the K visible keys with the highest I (ties: the lower s), sorted
             ascending, -1 pads (all visible keys when pos(t) + 1 <= K)
  attention: the dense score matrix scale * q[t, h] . k[s, h / g] masked to
             idx[t]; softmax; out = P @ v; lse = logsumexp of the kept scores
  backward: autograd of sum(out * dout) for a random dout
  indexer loss: p_t = mean over heads of P (detached), q_t = softmax of I over
             idx[t], loss = mean over b, t of KL(p_t || q_t); autograd to qi, ki, wi

Each case also carries dense causal attention computed without idx (the plain
causal mask), which sparse attention must equal when K >= Tk.

Usage:
  /usr/bin/python3 tests/golden/dsa_reference.py --out DIR [--seed N]
writes DIR/dsa_golden.safetensors; every tensor of case C is named "C/<name>":
  dims  I32 [9] = B, Tq, Tk, H, Hkv, D, Hi, Di, K      scale F32 [1]
  q k v qi ki wi dout (inputs, F32, the layouts of dsa.h, contiguous)
  idx I32 [B, Tq, K]; out F32 [B, Tq, H, D]; lse F32 [B, H, Tq]
  dq dk dv; loss F64 [1]; dqi dki dwi
  dense_out F32 [B, Tq, H, D], dense_lse F32 [B, H, Tq]
Metadata: "cases" (comma-separated names), "format" = "myriad-dsa-golden-1".

Inputs are drawn again (seed + 1000 * attempt) when the float64 reference
sits too close to a decision fp32 could take the other way: the K-th and
(K+1)-th indexer scores of a query within 1e-5 of the row's scale, or an
indexer dot product qi . ki within 1e-5 of zero (relu's kink). The "ties"
case is built so that many keys score exactly 0 (every qi . ki of those keys
is clearly negative) and the selection must fall back to the lower indices.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_safetensors  # noqa: E402

GOLDEN_FORMAT = "myriad-dsa-golden-1"

# name: (B, Tq, Tk, H, Hkv, D, Hi, Di, K, kind)
CASES = [
    ("prefill_k5", (2, 37, 37, 4, 2, 24, 3, 16, 5, "random")),
    ("prefill_k16", (2, 37, 37, 4, 2, 24, 3, 16, 16, "random")),
    ("prefill_k64", (2, 37, 37, 4, 2, 24, 3, 16, 64, "random")),  # K >= Tk: dense
    ("decode_k16", (2, 1, 50, 4, 2, 24, 3, 16, 16, "random")),
    ("chunk_k16", (2, 5, 40, 4, 1, 24, 2, 16, 16, "random")),     # Tq < Tk, MQA
    ("ties_k8", (1, 20, 20, 2, 2, 16, 2, 8, 8, "ties")),
]


def draw(gen, dims, kind):
    B, Tq, Tk, H, Hkv, D, Hi, Di, K = dims

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).float()

    x = {
        "q": randn(B, Tq, H, D),
        "k": randn(B, Tk, Hkv, D),
        "v": randn(B, Tk, Hkv, D),
        "qi": randn(B, Tq, Hi, Di, std=0.5),
        "ki": randn(B, Tk, Di, std=0.5),
        "wi": randn(B, Tq, Hi, std=0.5),
        "dout": randn(B, Tq, H, D),
    }
    if kind == "ties":
        # qi > 0 and wi > 0; keys with all-negative components score exactly 0
        # (relu of a clearly negative dot), the others clearly > 0. About a
        # third of the keys are positive, so most queries fill the rest of
        # their K slots from the zero-score keys: the lowest indices win.
        u = lambda *s: (0.5 + torch.rand(*s, generator=gen, dtype=torch.float64)).float()  # noqa: E731
        x["qi"] = u(B, Tq, Hi, Di) * 0.5
        x["wi"] = u(B, Tq, Hi)
        sign = torch.where(torch.rand(B, Tk, 1, generator=gen) < 0.35, 1.0, -1.0)
        x["ki"] = (u(B, Tk, Di) * 0.5 * sign).float()
    return x


def positions(Tq, Tk):
    return torch.arange(Tq) + (Tk - Tq)


def indexer_scores(qi, ki, wi):
    """I[b, t, s] (no mask), float64 autograd-friendly."""
    dots = torch.einsum("btjd,bsd->btjs", qi, ki)
    return (wi.unsqueeze(-1) * torch.relu(dots)).sum(dim=2), dots


def select_topk(I, Tq, Tk, K):
    """idx [B, Tq, K] int64: ascending, -1 pads; ties to the lower index."""
    B = I.shape[0]
    pos = positions(Tq, Tk)
    visible = torch.arange(Tk).view(1, 1, Tk) <= pos.view(1, Tq, 1)  # [1, Tq, Tk]
    key = torch.where(visible, -I, torch.full_like(I, math.inf))
    # Stable ascending sort of -I: equal scores keep index order (lower s first);
    # invisible keys (+inf) come last.
    _, order = torch.sort(key, dim=-1, stable=True)
    Kc = min(K, Tk)
    top = order[..., :Kc]
    ok = top <= pos.view(1, Tq, 1)
    top = torch.where(ok, top, torch.full_like(top, Tk))  # invalid -> Tk, sorted last
    top, _ = torch.sort(top, dim=-1)
    top = torch.where(top >= Tk, torch.full_like(top, -1), top)
    idx = torch.full((B, Tq, K), -1, dtype=torch.int64)
    idx[..., :Kc] = top
    return idx


def selection_mask(idx, Tk):
    B, Tq, K = idx.shape
    m = torch.zeros(B, Tq, Tk + 1, dtype=torch.bool)
    m.scatter_(2, torch.where(idx < 0, torch.full_like(idx, Tk), idx), True)
    return m[..., :Tk]


def masked_attention(q, k, v, mask, scale):
    """q [B,Tq,H,D], k/v [B,Tk,Hkv,D], mask [B,Tq,Tk] bool -> out, lse [B,H,Tq], P."""
    H, Hkv = q.shape[2], k.shape[2]
    g = H // Hkv
    kk = k.repeat_interleave(g, dim=2)
    vv = v.repeat_interleave(g, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, kk) * scale
    s = s.masked_fill(~mask.unsqueeze(1), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    P = torch.exp(s - lse.unsqueeze(-1))
    out = torch.einsum("bhts,bshd->bthd", P, vv)
    return out, lse, P


def near_decision(x, dims):
    """True when fp32 could plausibly decide differently from float64."""
    B, Tq, Tk, H, Hkv, D, Hi, Di, K = dims
    qi, ki, wi = (x[n].double() for n in ("qi", "ki", "wi"))
    I, dots = indexer_scores(qi, ki, wi)
    pos = positions(Tq, Tk)
    visible = torch.arange(Tk).view(1, 1, Tk) <= pos.view(1, Tq, 1)
    vis4 = visible.unsqueeze(2).expand_as(dots)
    d = dots.abs()[vis4]
    if d.numel() and bool((d < 1e-5).any()):
        return True
    for b in range(B):
        for t in range(Tq):
            n = int(pos[t]) + 1
            if n <= K:
                continue
            row = I[b, t, :n]
            srt, _ = torch.sort(row, descending=True)
            gap = float(srt[K - 1] - srt[K])
            scale = float(row.abs().max()) + 1e-30
            if 0 < gap < 1e-5 * scale:  # exact ties (gap 0) are decided by index: fine
                return True
    return False


def run_case(name, spec, seed):
    *dims, kind = spec
    dims = tuple(dims)
    B, Tq, Tk, H, Hkv, D, Hi, Di, K = dims
    assert H % Hkv == 0
    for attempt in range(50):
        gen = torch.Generator().manual_seed(seed + 1000 * attempt)
        x = draw(gen, dims, kind)
        if not near_decision(x, dims):
            seed = seed + 1000 * attempt
            break
    else:
        raise SystemExit(f"[dsa_reference] {name}: no draw without near-ties in 50 attempts")
    scale = 1.0 / math.sqrt(D)

    # Indexer and selection.
    qi = x["qi"].double().requires_grad_(True)
    ki = x["ki"].double().requires_grad_(True)
    wi = x["wi"].double().requires_grad_(True)
    I, _ = indexer_scores(qi, ki, wi)
    idx = select_topk(I.detach(), Tq, Tk, K)
    mask = selection_mask(idx, Tk)

    # Sparse attention (dense scores masked to idx) and its backward.
    q = x["q"].double().requires_grad_(True)
    k = x["k"].double().requires_grad_(True)
    v = x["v"].double().requires_grad_(True)
    out, lse, P = masked_attention(q, k, v, mask, scale)
    (out * x["dout"].double()).sum().backward()

    # Indexer loss: KL(p || q) over idx, p = head-mean of P (detached).
    p = P.detach().mean(dim=1)  # [B, Tq, Tk], 0 off idx
    logq = torch.log_softmax(I.masked_fill(~mask, -math.inf), dim=-1)
    kl = torch.where(mask, torch.xlogy(p, p) - p * logq.masked_fill(~mask, 0.0), torch.zeros_like(p))
    loss = kl.sum(dim=-1).mean()
    loss.backward()

    # Dense causal attention, from the causal mask alone (no idx).
    pos = positions(Tq, Tk)
    causal = (torch.arange(Tk).view(1, 1, Tk) <= pos.view(1, Tq, 1)).expand(B, Tq, Tk)
    with torch.no_grad():
        dense_out, dense_lse, _ = masked_attention(x["q"].double(), x["k"].double(), x["v"].double(), causal, scale)
    if K >= Tk:
        assert torch.equal(mask, causal), f"{name}: K >= Tk must select every visible key"
        err = float((dense_out - out.detach()).abs().max())
        assert err < 1e-12, f"{name}: sparse != dense ({err})"

    # Sanity of the selection itself.
    for b in range(B):
        for t in range(Tq):
            row = idx[b, t]
            sel = row[row >= 0]
            assert sel.numel() == min(K, int(pos[t]) + 1)
            assert bool((sel[1:] > sel[:-1]).all()) and bool((row[sel.numel():] == -1).all())
            scores = I.detach()[b, t].tolist()
            brute = sorted(sorted(range(int(pos[t]) + 1), key=lambda s_: (-scores[s_], s_))[:K])
            assert sel.tolist() == brute, f"{name}: top-k of ({b}, {t})"

    f32 = lambda t: t.detach().float().contiguous()  # noqa: E731
    tensors = {
        "dims": torch.tensor(list(dims), dtype=torch.int32),
        "scale": torch.tensor([scale], dtype=torch.float32),
    }
    for n in ("q", "k", "v", "qi", "ki", "wi", "dout"):
        tensors[n] = x[n].contiguous()
    tensors.update({
        "idx": idx.to(torch.int32).contiguous(),
        "out": f32(out),
        "lse": f32(lse),
        "dq": f32(q.grad), "dk": f32(k.grad), "dv": f32(v.grad),
        "loss": torch.tensor([float(loss)], dtype=torch.float64),
        "dqi": f32(qi.grad), "dki": f32(ki.grad), "dwi": f32(wi.grad),
        "dense_out": f32(dense_out), "dense_lse": f32(dense_lse),
    })
    n_tied = 0
    if kind == "ties":
        n_tied = int(((I.detach() == 0) & causal & mask).sum())
        assert n_tied > 0, "ties case selected no zero-score key"
    print(f"[dsa_reference] {name}: dims {dims} seed {seed} loss {float(loss):.6f}"
          + (f" zero-score keys selected {n_tied}" if kind == "ties" else ""))
    return {f"{name}/{k_}": t for k_, t in tensors.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    tensors = {}
    for i, (name, spec) in enumerate(CASES):
        tensors.update(run_case(name, spec, a.seed + 17 * i))
    path = os.path.join(a.out, "dsa_golden.safetensors")
    write_safetensors(path, tensors, {"cases": ",".join(n for n, _ in CASES), "format": GOLDEN_FORMAT})
    print(f"[dsa_reference] wrote {len(tensors)} tensors to {path}")


if __name__ == "__main__":
    main()
