#!/usr/bin/python3
"""PyTorch reference of the post-training objectives (docs/rl.md).

Writes one safetensors file with a tiny model's init (reference.py's
MyriadRef), a batch of token sequences with per-token weights, behaviour and
reference logprobs, per-sequence advantages and a teacher's logits, and for
each objective its loss and the gradient of every parameter by autograd:

  grpo: sum_t c_t * (-min(r_t A, clip(r_t, 1-eps_lo, 1+eps_hi) A) + beta * k3_t)
        r_t = exp(logp_t - old_t), k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
  rkl:  sum_t c_t * KL(p_student || p_teacher)   (full next-token distributions)
  fkl:  sum_t c_t * KL(p_teacher || p_student)
  jsd:  sum_t c_t * (KL(p_s || m) + KL(p_t || m)) / 2,  m = (p_s + p_t) / 2

each plus the balance loss of the main MoE blocks (MTP modules are not part
of a post-training step). Written from the equations, independently of the
C++ objectives (src/rl/objective.cc).

Usage:
  /usr/bin/python3 tests/golden/rl_reference.py --config tests/golden/tiny.toml --out F
"""
import argparse
import os
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import MyriadRef, as_leaves, load_config  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

EPS_LO, EPS_HI, BETA = 0.2, 0.28, 0.05


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    mcfg, tcfg, _ = load_config(args.config, args.set, None)
    gen = torch.Generator().manual_seed(tcfg.seed + 7)
    model = MyriadRef(mcfg)
    params0 = model.init_params(gen)
    buffers0 = model.init_buffers(gen, std=0.02)
    model.cfg.mtp_depth = 0  # a post-training step runs the main head only
    B, T, V = 3, tcfg.seq_len, mcfg.vocab_size
    tokens = torch.randint(0, V, (B, T + 1), generator=gen)
    # Per-token weights: a prompt of P_b tokens (weight 0), then the response
    # (token-level normalisation over all response tokens), padding at the end.
    coef = torch.zeros(B, T)
    plen = [3, 5, 2]
    rlen = [T - 3, T - 8, T - 2]
    total = sum(rlen)
    for b in range(B):
        # position t predicts token t+1: the response tokens are t+1 in [plen, plen+rlen)
        coef[b, plen[b] - 1:plen[b] - 1 + rlen[b]] = 1.0 / total
    adv = torch.tensor([1.3, -0.7, 0.4])
    with torch.no_grad():
        logits0 = model.forward(params0, buffers0, tokens).logits
        lp0 = torch.log_softmax(logits0, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    # Behaviour logprobs away from the current ones, so both clip sides and
    # the unclipped middle occur.
    old = lp0 + 0.5 * torch.randn(B, T, generator=gen)
    ref = lp0 + 0.3 * torch.randn(B, T, generator=gen)
    teacher = logits0 + 1.5 * torch.randn(B, T, V, generator=gen)

    out = OrderedDict()
    for n, x in params0.items():
        out["param/" + n] = x
    for n, x in buffers0.items():
        out["buffer/" + n] = x
    out["tokens"] = tokens.to(torch.int32)
    out["coef"] = coef
    out["old_logp"] = old
    out["ref_logp"] = ref
    out["adv"] = adv
    out["teacher_logits"] = teacher
    out["hyper"] = torch.tensor([EPS_LO, EPS_HI, BETA])

    lt = torch.log_softmax(teacher, -1)
    pt = lt.exp()

    def objective(kind, logits):
        ls = torch.log_softmax(logits, -1)
        if kind == "grpo":
            lp = ls.gather(-1, tokens[:, 1:, None]).squeeze(-1)
            r = torch.exp(lp - old)
            a = adv[:, None]
            pg = -torch.minimum(r * a, torch.clamp(r, 1 - EPS_LO, 1 + EPS_HI) * a)
            d = ref - lp
            k3 = torch.exp(d) - d - 1
            per = pg + BETA * k3
        elif kind == "rkl":
            per = (ls.exp() * (ls - lt)).sum(-1)
        elif kind == "fkl":
            per = (pt * (lt - ls)).sum(-1)
        elif kind == "jsd":
            ps = ls.exp()
            lm = torch.log((ps + pt) / 2)
            per = 0.5 * (ps * (ls - lm)).sum(-1) + 0.5 * (pt * (lt - lm)).sum(-1)
        else:
            raise ValueError(kind)
        return (coef * per).sum()

    for kind in ("grpo", "rkl", "fkl", "jsd"):
        params = as_leaves(params0)
        fwd = model.forward(params, buffers0, tokens)
        loss = objective(kind, fwd.logits) + fwd.loss_aux
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        out[kind + "/loss"] = loss.detach().reshape(1)
        out[kind + "/aux"] = fwd.loss_aux.detach().reshape(1)
        for (n, p), g in zip(params.items(), grads):
            out[kind + "/grad/" + n] = torch.zeros_like(p) if g is None else g
        print(f"{kind}: loss {loss.item():.6f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_safetensors(args.out, out, {"format": "myriad-rl-golden-1"})


if __name__ == "__main__":
    main()
