#!/usr/bin/python3
"""Independent checks of tests/golden/reference.py (exits non-zero on failure).

  /usr/bin/python3 tests/golden/check_reference.py [-v]

Oracles, none of them the reference's own captured output:
  1. spec: a naive float64 numpy transcription of docs/model.md (spec_numpy.py)
     gives the same logits and losses (main, MTP, balance) and expert loads.
  2. gradients: central finite differences of the total loss in float64,
     per sampled element of every tensor and along random directions, on
     configs covering GQA, MoE with both score functions, shared experts,
     the aux loss, MTP depth 1-2, tied and untied heads.
  3. attention: RoPE + causal GQA attention equals an explicit per-head,
     per-query softmax(q k^T / sqrt(D)) v loop.
  4. MoE: with top_k = n_routed_experts and zero bias, the layer equals the
     dense weighted sum of all experts (+ shared).
  5. optimizer: one and two steps of Trainer equal the numpy AdamW / clipping /
     lr schedule / bias update of spec_numpy.py; the lr schedule hits its ends.
  6. accumulation: 2 micro-batches of B equal 1 micro-batch of 2B.
  7. training on a fixed batch lowers the loss.
  8. KV-cached decode (bench/torch_peer.py) equals the full forward.
  9. golden file: names, shapes, dtypes, metadata, round trip, determinism.
"""
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import reference as ref  # noqa: E402
import spec_numpy  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

VERBOSE = "-v" in sys.argv
FAILURES = []


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        print("FAIL", what)
    elif VERBOSE:
        print("ok  ", what)


BASE = dict(vocab_size=11, d_model=8, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=12, n_dense_layers=1,
            n_routed_experts=4, n_shared_experts=1, top_k=2, d_expert=4, score_func="sigmoid",
            aux_loss_weight=0.1, bias_update_rate=0.01, mtp_depth=2, mtp_loss_weight=0.3,
            tie_embeddings=False, rope_theta=10000.0, norm_eps=1e-5, max_seq_len=16, init_std=0.4)
TRAIN = dict(seq_len=6, batch_size=2, grad_accum=1, steps=5, lr=1e-2, min_lr=1e-3, warmup_steps=2,
             weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8, grad_clip=1.0, seed=7)

VARIANTS = {
    "sigmoid/untied/gqa/shared/mtp2": {},
    "softmax/tied/mtp1": dict(score_func="softmax", tie_embeddings=True, mtp_depth=1),
    "softmax/untied/no-shared/mha/k3": dict(score_func="softmax", n_shared_experts=0, n_kv_heads=4, top_k=3,
                                            n_layers=3),
    "sigmoid/tied/all-dense/mqa": dict(n_dense_layers=2, n_kv_heads=1, tie_embeddings=True, mtp_depth=1),
}


def build(overrides, dtype, seed=0, bias_std=0.3):
    cfg = ref.ModelConfig(**{**BASE, **overrides})
    model = ref.MyriadRef(cfg, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    params = model.init_params(gen)
    # Norm weights away from 1 so their gradients are not special.
    for n, p in params.items():
        if p.dim() == 1:
            p.add_(torch.empty_like(p).normal_(0, 0.3, generator=gen))
    buffers = model.init_buffers(gen, std=bias_std)
    tokens = torch.randint(0, cfg.vocab_size, (TRAIN["batch_size"], TRAIN["seq_len"] + 1), generator=gen)
    return model, params, buffers, tokens


def to_np(d):
    return {n: x.detach().double().numpy().copy() for n, x in d.items()}


# 1 ---------------------------------------------------------------------------
def check_against_spec():
    for name, ov in VARIANTS.items():
        model, params, buffers, tokens = build(ov, torch.float64)
        out = model.forward(params, buffers, tokens)
        spec = spec_numpy.spec_forward(ref.asdict(model.cfg), to_np(params),
                                        to_np(buffers), tokens.numpy())
        for key in ("loss", "loss_main", "loss_mtp", "loss_aux"):
            a, b = float(getattr(out, key)), spec[key]
            check(abs(a - b) <= 1e-10 * max(1.0, abs(b)), f"spec {name}: {key} {a!r} vs {b!r}")
        err = float(np.max(np.abs(out.logits.numpy() - spec["logits"])))
        check(err < 1e-10, f"spec {name}: logits max err {err:.3g}")
        same = set(out.loads) == set(spec["loads"]) and all(
            np.array_equal(out.loads[k].numpy(), spec["loads"][k]) for k in spec["loads"])
        check(same, f"spec {name}: expert loads")
        check(float(out.loss_aux) > 0 or model.cfg.n_layers == model.cfg.n_dense_layers,
              f"spec {name}: aux loss exercised")


# 2 ---------------------------------------------------------------------------
def check_gradients():
    eps = 1e-6
    for name, ov in VARIANTS.items():
        model, params, buffers, tokens = build(ov, torch.float64, seed=1)
        leaves = ref.as_leaves(params)
        loss = model.forward(leaves, buffers, tokens).loss
        grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)))
        grads = {n: torch.zeros_like(params[n]) if g is None else g for n, g in grads.items()}

        def f(p):
            with torch.no_grad():
                return float(model.forward(p, buffers, tokens).loss)

        gen = torch.Generator().manual_seed(2)
        bad, worst, count = [], 0.0, 0
        for n, p in params.items():
            flat = p.view(-1)
            for i in torch.randperm(flat.numel(), generator=gen)[:2].tolist():
                old = flat[i].item()
                flat[i] = old + eps
                up = f(params)
                flat[i] = old - eps
                down = f(params)
                flat[i] = old
                fd, g = (up - down) / (2 * eps), grads[n].view(-1)[i].item()
                worst, count = max(worst, abs(fd - g)), count + 1
                if abs(fd - g) > 1e-7 + 1e-5 * abs(g):
                    bad.append(f"{n}[{i}] fd {fd:.9g} vs autograd {g:.9g}")
        check(not bad, f"grad {name}: {count} sampled elements of {len(params)} tensors, "
                       f"worst |fd - autograd| {worst:.2g}" + (f"; bad: {bad}" if bad else ""))
        for r in range(3):
            dirs = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in params.items()}
            plus = {n: p + eps * dirs[n] for n, p in params.items()}
            minus = {n: p - eps * dirs[n] for n, p in params.items()}
            fd = (f(plus) - f(minus)) / (2 * eps)
            an = sum(float((grads[n] * dirs[n]).sum()) for n in params)
            check(abs(fd - an) <= 1e-6 + 1e-6 * abs(an), f"grad {name}: direction {r} fd {fd:.9g} vs {an:.9g}")


# 3 ---------------------------------------------------------------------------
def check_attention():
    gen = torch.Generator().manual_seed(3)
    B, H, Hkv, T, D, theta = 2, 6, 2, 7, 4, 500.0
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, T, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hkv, T, D, generator=gen, dtype=torch.float64)
    cos, sin = ref.rope_tables(T, D, theta, torch.float64)
    got = ref.causal_attention(ref.apply_rope(q, cos, sin), ref.apply_rope(k, cos, sin), v)

    def rot(x, pos):   # rotate-half as a complex multiply: (x_i + i x_{i+D/2}) e^{i angle}
        z = torch.complex(x[:D // 2], x[D // 2:])
        ang = pos * theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
        z = z * torch.polar(torch.ones_like(ang), ang)
        return torch.cat([z.real, z.imag])

    want = torch.zeros_like(got)
    for b in range(B):
        for j in range(H):
            g = j // (H // Hkv)
            for t in range(T):
                qr = rot(q[b, j, t], t)
                sc = torch.stack([qr @ rot(k[b, g, u], u) for u in range(t + 1)]) / math.sqrt(D)
                want[b, j, t] = torch.softmax(sc, 0) @ v[b, g, :t + 1]
    err = float((got - want).abs().max())
    check(err < 1e-12, f"attention: RoPE+GQA causal attention vs naive loop, max err {err:.3g}")


# 4 ---------------------------------------------------------------------------
def check_moe_dense_equivalence():
    for sf in ("softmax", "sigmoid"):
        for shared in (0, 2):
            cfg = dict(score_func=sf, top_k=BASE["n_routed_experts"], n_shared_experts=shared)
            model, params, _, _ = build(cfg, torch.float64, seed=4)
            buffers = model.init_buffers()    # zero bias
            gen = torch.Generator().manual_seed(5)
            f = torch.randn(2, 5, BASE["d_model"], generator=gen, dtype=torch.float64)
            pre = "model.layers.1."
            got = model.moe(params, buffers, pre, f, {}, [])
            x = f.reshape(-1, BASE["d_model"])
            logits = x @ params[pre + "mlp.gate.weight"].T
            s = torch.softmax(logits, -1) if sf == "softmax" else torch.sigmoid(logits)
            w = s / s.sum(-1, keepdim=True)
            want = torch.zeros_like(x)
            for e in range(BASE["n_routed_experts"]):
                ep = f"{pre}mlp.experts.{e}."
                hid = torch.nn.functional.silu(x @ params[ep + "gate_proj.weight"].T) * (x @ params[ep + "up_proj.weight"].T)
                want += w[:, e:e + 1] * (hid @ params[ep + "down_proj.weight"].T)
            if shared:
                sp = pre + "mlp.shared_experts."
                hid = torch.nn.functional.silu(x @ params[sp + "gate_proj.weight"].T) * (x @ params[sp + "up_proj.weight"].T)
                want += hid @ params[sp + "down_proj.weight"].T
            err = float((got.reshape(-1, BASE["d_model"]) - want).abs().max())
            check(err < 1e-12, f"moe {sf} shared={shared}: top_k=E equals dense weighted sum, max err {err:.3g}")


# 5 ---------------------------------------------------------------------------
def check_optimizer():
    for clip in (0.05, 100.0):
        t = dict(TRAIN, grad_clip=clip)
        tcfg = ref.TrainConfig(**t)
        model, params, buffers, tokens = build({}, torch.float64, seed=6)
        leaves = ref.as_leaves(params)
        bufs = {n: b.clone() for n, b in buffers.items()}
        trainer = ref.Trainer(model, leaves, bufs, tcfg)
        P, B_ = to_np(params), to_np(buffers)
        M = {n: np.zeros_like(x) for n, x in P.items()}
        V = {n: np.zeros_like(x) for n, x in P.items()}
        for step in (1, 2):
            batch = [tokens, torch.roll(tokens, step, 0)]
            grads, _, loads = trainer.gradients(batch)
            G = to_np(grads)
            lr_ref, norm_ref = trainer.apply(grads, loads)
            lr_np, norm_np = spec_numpy.spec_adamw_step(P, M, V, G, step, t, to_np(loads), B_,
                                                        model.cfg.bias_update_rate, model.cfg.n_routed_experts)
            check(abs(lr_ref - lr_np) < 1e-15 and abs(float(norm_ref) - norm_np) < 1e-12 * norm_np,
                  f"optimizer clip={clip} step {step}: lr/grad norm")
            err = max(float(np.max(np.abs(leaves[n].detach().numpy() - P[n]))) for n in P)
            check(err < 1e-12, f"optimizer clip={clip} step {step}: params vs numpy AdamW, max err {err:.3g}")
            berr = max(float(np.max(np.abs(bufs[n].numpy() - B_[n]))) for n in B_)
            moved = any(float(np.max(np.abs(B_[n] - to_np(buffers)[n]))) > 0 for n in B_)
            check(berr < 1e-15 and moved, f"optimizer clip={clip} step {step}: bias update")
    t = ref.TrainConfig(**dict(TRAIN, steps=11, warmup_steps=3, lr=1.0, min_lr=0.1))
    lrs = [ref.lr_at(s, t) for s in range(1, 12)]
    check(abs(lrs[0] - 1 / 3) < 1e-15 and lrs[2] == 1.0 and abs(lrs[6] - 0.55) < 1e-12 and abs(lrs[10] - 0.1) < 1e-15
          and all(a > b for a, b in zip(lrs[2:], lrs[3:])), f"lr schedule ends/midpoint/monotone: {lrs}")
    worst = 0.0
    for W, S in ((0, 10), (3, 10), (5, 5), (7, 3), (1, 2)):
        td = dict(TRAIN, steps=S, warmup_steps=W, lr=3e-3, min_lr=1e-4)
        t = ref.TrainConfig(**td)
        for step in range(1, S + 4):
            worst = max(worst, abs(ref.lr_at(step, t) - spec_numpy.spec_lr(step, td)))
    check(worst == 0.0, f"lr schedule matches the docs formula incl. W=0, steps<=W, s>steps (err {worst})")


# 6 ---------------------------------------------------------------------------
def check_accumulation():
    model, params, buffers, tokens = build({}, torch.float64, seed=8)
    other = torch.roll(tokens, 1, 1)
    t = ref.TrainConfig(**TRAIN)
    g2, l2, loads2 = ref.Trainer(model, ref.as_leaves(params), buffers, t).gradients([tokens, other])
    g1, l1, loads1 = ref.Trainer(model, ref.as_leaves(params), buffers, t).gradients([torch.cat([tokens, other])])
    err = max(float((g2[n] - g1[n]).abs().max()) for n in g1)
    same_loads = all(torch.equal(loads1[n], loads2[n]) for n in loads1)
    check(err < 1e-12 and abs(float(l1 - l2)) < 1e-12 and same_loads,
          f"accumulation: 2 micro-batches == 1 double batch (grad err {err:.3g})")


# 7 ---------------------------------------------------------------------------
def check_training_decreases():
    for ov in ({}, dict(score_func="softmax", tie_embeddings=True)):
        cfg = ref.ModelConfig(**{**BASE, **ov, "init_std": 0.1})
        model = ref.MyriadRef(cfg)
        gen = torch.Generator().manual_seed(9)
        params = ref.as_leaves(model.init_params(gen))
        buffers = model.init_buffers()
        tokens = torch.randint(0, cfg.vocab_size, (4, 9), generator=gen)
        trainer = ref.Trainer(model, params, buffers, ref.TrainConfig(**dict(TRAIN, steps=40, warmup_steps=5,
                                                                             lr=2e-2)))
        losses = [float(trainer.step([tokens])[0]) for _ in range(40)]
        check(losses[-1] < 0.5 * losses[0], f"training {ov or 'base'}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")


# 8 ---------------------------------------------------------------------------
def check_decode():
    import torch_peer
    for ov in ({}, dict(score_func="softmax", tie_embeddings=True, n_kv_heads=1, n_shared_experts=0)):
        model, params, buffers, tokens = build(ov, torch.float32, seed=10, bias_std=0.02)
        seq = tokens[0]
        full = model.forward(params, buffers, seq[None]).logits[0]             # [T, V]
        dec = torch_peer.KVCacheDecoder(model, params, buffers, seq.shape[0])
        got = [dec.feed(seq[:3], 0, all_logits=True)]
        for pos in range(3, seq.shape[0] - 1):
            got.append(dec.feed(seq[pos:pos + 1], pos, all_logits=True))
        err = float((torch.cat(got) - full).abs().max())
        check(err < 1e-5, f"decode {ov or 'base'}: KV-cached logits vs full forward, max err {err:.3g}")


# 9 ---------------------------------------------------------------------------
def check_golden_file():
    tiny = os.path.join(HERE, "tiny.toml")
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i in range(2):
            path = os.path.join(d, f"g{i}.safetensors")
            ref.main(["--config", tiny, "--set", "train.steps=2", "--out", path, "--quiet"])
            paths.append(path)
        with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
            raw = a.read()
            check(raw == b.read(), "golden: two runs give identical bytes")
        n = int.from_bytes(raw[:8], "little")
        check((8 + n) % 8 == 0, "golden: data section 8-byte aligned")
        tensors, meta = read_safetensors(paths[0])
    mcfg, tcfg, _ = ref.load_config(tiny, ["train.steps=2"])
    model = ref.MyriadRef(mcfg)
    cfg = json.loads(meta["config"])
    check(meta.get("format") == ref.GOLDEN_FORMAT and cfg["model"]["d_model"] == mcfg.d_model
          and cfg["train"]["steps"] == 2, "golden: metadata")
    B, T, V, S, A = tcfg.batch_size, tcfg.seq_len, mcfg.vocab_size, tcfg.steps, tcfg.grad_accum
    want = {"tokens": ([B, T + 1], torch.int32), "logits": ([B, T, V], torch.float32),
            "train_tokens": ([S, A, B, T + 1], torch.int32)}
    for k in ("loss", "loss_main", "loss_mtp", "loss_aux"):
        want[k] = ([1], torch.float32)
    for k in ("step_losses", "step_lr", "step_grad_norm"):
        want[k] = ([S], torch.float32)
    for n, shape in model.param_specs():
        for pre in ("param/", "grad/", "final/param/"):
            want[pre + n] = (shape, torch.float32)
    for n, shape in model.buffer_specs():
        for pre in ("buffer/", "final/buffer/"):
            want[pre + n] = (shape, torch.float32)
    got = {k: (list(v.shape), v.dtype) for k, v in tensors.items()}
    check(got == want, f"golden: tensor set/shapes/dtypes (extra {sorted(set(got) - set(want))[:5]}, "
                       f"missing {sorted(set(want) - set(got))[:5]})")
    total = float(tensors["loss_main"] + tensors["loss_mtp"] + tensors["loss_aux"])
    check(abs(total - float(tensors["loss"])) < 1e-6, "golden: loss = main + mtp + aux")
    # Round trip of the writer with an odd-sized tensor and metadata.
    with tempfile.TemporaryDirectory() as d:
        x = {"a": torch.arange(3, dtype=torch.int32), "b": torch.randn(2, 3)}
        write_safetensors(os.path.join(d, "x"), x, {"k": "v"})
        y, m = read_safetensors(os.path.join(d, "x"))
        check(m == {"k": "v"} and all(torch.equal(x[k], y[k]) for k in x), "safetensors round trip")


def report_fp32_error():
    """How far the fp32 golden forward is from float64 on tiny.toml (sizes C++ tolerances)."""
    mcfg, tcfg, _ = ref.load_config(os.path.join(HERE, "tiny.toml"))
    model32 = ref.MyriadRef(mcfg)
    gen = torch.Generator().manual_seed(tcfg.seed)
    params32 = model32.init_params(gen)
    buffers32 = model32.init_buffers(gen, std=0.02)
    tokens = torch.randint(0, mcfg.vocab_size, (tcfg.batch_size, tcfg.seq_len + 1), generator=gen)
    outs = {}
    for dtype in (torch.float32, torch.float64):
        model = ref.MyriadRef(mcfg, dtype=dtype)
        params = ref.as_leaves({n: x.to(dtype) for n, x in params32.items()})
        buffers = {n: x.to(dtype).clone() for n, x in buffers32.items()}
        out = model.forward(params, buffers, tokens)
        grads = torch.autograd.grad(out.loss, list(params.values()), allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params.values(), grads)]
        outs[dtype] = (out, grads)
    (o32, g32), (o64, g64) = outs[torch.float32], outs[torch.float64]
    lerr = abs(float(o32.loss) - float(o64.loss))
    gerr = max(float((a.double() - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(g32, g64))
    check(lerr < 1e-5 and gerr < 1e-4, f"fp32 vs fp64 on tiny.toml: |dloss| {lerr:.2g}, max rel grad err {gerr:.2g}")
    print(f"info: tiny.toml fp32 vs fp64 forward: |dloss| = {lerr:.2g}, "
          f"max over tensors of max|dgrad| / max|grad| = {gerr:.2g}")
    # The same training run in both precisions: how far fp32 rounding alone drifts.
    tokens_train = torch.randint(0, mcfg.vocab_size, (tcfg.steps, tcfg.grad_accum, tcfg.batch_size,
                                                      tcfg.seq_len + 1), generator=gen)
    runs = {}
    for dtype in (torch.float32, torch.float64):
        model = ref.MyriadRef(mcfg, dtype=dtype)
        model.route_margins = []
        params = ref.as_leaves({n: x.to(dtype) for n, x in params32.items()})
        buffers = {n: x.to(dtype).clone() for n, x in buffers32.items()}
        trainer = ref.Trainer(model, params, buffers, tcfg)
        losses = [float(trainer.step(list(tokens_train[s]))[0]) for s in range(tcfg.steps)]
        runs[dtype] = (losses, params, buffers, min(model.route_margins))
    (l32, p32, b32, m32), (l64, p64, b64, _) = runs[torch.float32], runs[torch.float64]
    dl = max(abs(a - b) for a, b in zip(l32, l64))
    dp = max(float((p32[n].detach().double() - p64[n].detach()).abs().max()) for n in p32)
    same_bias = all(torch.equal(b32[n].double(), b64[n].double()) or
                    float((b32[n].double() - b64[n]).abs().max()) < 1e-6 for n in b32)
    check(dl < 1e-4 and dp < 1e-3 and same_bias,
          f"fp32 vs fp64 training on tiny.toml: max |dloss| {dl:.2g}, max |dparam| {dp:.2g}, biases agree")
    print(f"info: tiny.toml {tcfg.steps}-step training fp32 vs fp64: max |d step_loss| = {dl:.2g}, "
          f"max |d final param| = {dp:.2g}, smallest routing margin (fp32) = {m32:.2g}")


def main():
    torch.set_num_threads(1)
    t0 = time.time()
    for fn in (check_against_spec, check_gradients, check_attention, check_moe_dense_equivalence,
               check_optimizer, check_accumulation, check_training_decreases, check_decode,
               check_golden_file, report_fp32_error):
        t1 = time.time()
        fn()
        if VERBOSE:
            print(f"     {fn.__name__}: {time.time() - t1:.2f} s")
    if FAILURES:
        print(f"{len(FAILURES)} check(s) FAILED")
        sys.exit(1)
    print(f"all reference checks passed ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
