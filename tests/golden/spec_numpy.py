#!/usr/bin/python3
"""A second, deliberately naive implementation of docs/model.md in float64 numpy.

It shares no code with reference.py: one token and one head at a time, plain
Python loops, formulas transcribed from the contract. check_reference.py
compares the two on tiny configs, so a misreading of the contract in the
vectorised reference (an index off by one in MTP, a wrong GQA mapping, the
balance loss normalisation, the optimizer) shows up as a mismatch.
"""
import math

import numpy as np


def _rms(h, w, eps):
    return h / math.sqrt(float(np.mean(h * h)) + eps) * w


def _silu(z):
    return z / (1.0 + np.exp(-z))


def _swiglu(x, g, u, d):
    return d @ (_silu(g @ x) * (u @ x))


def _rope(x, pos, theta):
    """Rotate pairs (x_i, x_{i+D/2}) by pos * theta^(-2i/D)."""
    D = x.shape[0]
    y = x.copy()
    for i in range(D // 2):
        ang = pos * theta ** (-2.0 * i / D)
        c, s = math.cos(ang), math.sin(ang)
        y[i] = x[i] * c - x[i + D // 2] * s
        y[i + D // 2] = x[i] * s + x[i + D // 2] * c
    return y


def _log_softmax_at(z, target):
    m = float(np.max(z))
    return float(z[target] - m - math.log(float(np.sum(np.exp(z - m)))))


def _moe_token(cfg, P, bias, prefix, f):
    """Returns (output, scores s, selected set) for one token."""
    E, K = cfg["n_routed_experts"], cfg["top_k"]
    logits = P[prefix + "mlp.gate.weight"] @ f
    if cfg["score_func"] == "softmax":
        e = np.exp(logits - np.max(logits))
        s = e / np.sum(e)
    else:
        s = 1.0 / (1.0 + np.exp(-logits))
    ranked = sorted(range(E), key=lambda i: -(s[i] + bias[i]))
    chosen = ranked[:K]
    denom = sum(s[j] for j in chosen)
    out = np.zeros_like(f)
    for j in chosen:
        ep = f"{prefix}mlp.experts.{j}."
        out += (s[j] / denom) * _swiglu(f, P[ep + "gate_proj.weight"], P[ep + "up_proj.weight"],
                                        P[ep + "down_proj.weight"])
    if cfg["n_shared_experts"] > 0:
        sp = prefix + "mlp.shared_experts."
        out += _swiglu(f, P[sp + "gate_proj.weight"], P[sp + "up_proj.weight"], P[sp + "down_proj.weight"])
    return out, s, set(chosen)


def _block_sequence(cfg, P, bufs, prefix, hs, moe, aux_terms, loads):
    """One block over one sequence hs (list of [C] vectors); positions 0..len-1."""
    C, H, Hkv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    D, eps, theta = C // H, cfg["norm_eps"], cfg["rope_theta"]
    N = len(hs)
    qs, ks, vs = [], [], []
    for t, h in enumerate(hs):
        a = _rms(h, P[prefix + "input_layernorm.weight"], eps)
        q = P[prefix + "self_attn.q_proj.weight"] @ a
        k = P[prefix + "self_attn.k_proj.weight"] @ a
        v = P[prefix + "self_attn.v_proj.weight"] @ a
        qs.append([_rope(q[j * D:(j + 1) * D], t, theta) for j in range(H)])
        ks.append([_rope(k[j * D:(j + 1) * D], t, theta) for j in range(Hkv)])
        vs.append([v[j * D:(j + 1) * D] for j in range(Hkv)])
    out = []
    fs = []
    for t in range(N):
        heads = []
        for j in range(H):
            g = j // (H // Hkv)
            sc = np.array([float(qs[t][j] @ ks[u][g]) / math.sqrt(D) for u in range(t + 1)])
            p = np.exp(sc - sc.max())
            p /= p.sum()
            heads.append(sum(p[u] * vs[u][g] for u in range(t + 1)))
        h = hs[t] + P[prefix + "self_attn.o_proj.weight"] @ np.concatenate(heads)
        out.append(h)
        fs.append(_rms(h, P[prefix + "post_attention_layernorm.weight"], eps))
    if not moe:
        return [h + _swiglu(f, P[prefix + "mlp.gate_proj.weight"], P[prefix + "mlp.up_proj.weight"],
                            P[prefix + "mlp.down_proj.weight"]) for h, f in zip(out, fs)]
    E, K = cfg["n_routed_experts"], cfg["top_k"]
    bias_name = prefix + "mlp.gate.e_score_correction_bias"
    res, scores, chosen = [], [], []
    for h, f in zip(out, fs):
        y, s, S = _moe_token(cfg, P, bufs[bias_name], prefix, f)
        res.append(h + y)
        scores.append(s)
        chosen.append(S)
    load = loads.setdefault(bias_name, np.zeros(E, dtype=np.int64))
    for S in chosen:
        for i in S:
            load[i] += 1
    total = 0.0
    for i in range(E):
        f_i = E / (K * N) * sum(1 for S in chosen if i in S)
        P_i = sum(s[i] / np.sum(s) for s in scores) / N
        total += f_i * P_i
    aux_terms.setdefault(prefix, []).append(cfg["aux_loss_weight"] * total)
    return res


def spec_forward(cfg, P, bufs, tokens):
    """Losses of docs/model.md for int tokens [B, T+1].

    cfg: [model] dict; P, bufs: name -> float64 numpy arrays.
    Returns dict(loss, loss_main, loss_mtp, loss_aux, logits [B,T,V], loads).
    """
    B, T = tokens.shape[0], tokens.shape[1] - 1
    L, nd, eps = cfg["n_layers"], cfg["n_dense_layers"], cfg["norm_eps"]
    Dm = cfg["mtp_depth"]
    head = P["model.embed_tokens.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    aux_terms, loads = {}, {}
    ce_main, ce_mtp = [], [[] for _ in range(Dm)]
    logits_all = np.zeros((B, T, cfg["vocab_size"]))
    for b in range(B):
        x = [int(v) for v in tokens[b]]
        emb = [P["model.embed_tokens.weight"][x[i]].copy() for i in range(T)]
        hs = list(emb)
        for l in range(L):
            hs = _block_sequence(cfg, P, bufs, f"model.layers.{l}.", hs, l >= nd, aux_terms, loads)
        for i in range(T):
            z = head @ _rms(hs[i], P["model.norm.weight"], eps)
            logits_all[b, i] = z
            ce_main.append(-_log_softmax_at(z, x[i + 1]))
        prev = hs
        for k in range(1, Dm + 1):
            pre = f"model.mtp.{k - 1}."
            hp = []
            for i in range(T - k):
                cat = np.concatenate([_rms(prev[i], P[pre + "hnorm.weight"], eps),
                                      _rms(emb[i + k], P[pre + "enorm.weight"], eps)])
                hp.append(P[pre + "eh_proj.weight"] @ cat)
            hk = _block_sequence(cfg, P, bufs, pre + "block.", hp, L > nd, aux_terms, loads)
            for i in range(T - k):
                z = head @ _rms(hk[i], P[pre + "norm.weight"], eps)
                ce_mtp[k - 1].append(-_log_softmax_at(z, x[i + k + 1]))
            prev = hk
    loss_main = float(np.mean(ce_main))
    loss_mtp = cfg["mtp_loss_weight"] / Dm * sum(float(np.mean(c)) for c in ce_mtp) if Dm else 0.0
    loss_aux = sum(float(np.mean(v)) for v in aux_terms.values()) if cfg["aux_loss_weight"] > 0 else 0.0
    return {"loss": loss_main + loss_mtp + loss_aux, "loss_main": loss_main, "loss_mtp": loss_mtp,
            "loss_aux": loss_aux, "logits": logits_all, "loads": loads}


def spec_lr(step, t):
    """Warmup + cosine, transcribed from docs/model.md (t: [train] dict)."""
    W, S = t["warmup_steps"], t["steps"]
    if step <= W:
        return t["lr"] * step / W
    p = (step - W) / max(1, S - W)
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * p))


def spec_adamw_step(P, M, V, G, step, t, loads, bufs, gamma, E):
    """One training-step update in float64 from averaged grads G; mutates P, M, V, bufs."""
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in G.values()))
    scale = min(1.0, t["grad_clip"] / (norm + 1e-6))
    lr = spec_lr(step, t)
    b1, b2 = t["beta1"], t["beta2"]
    for n in P:
        g = G[n] * scale
        M[n] = b1 * M[n] + (1 - b1) * g
        V[n] = b2 * V[n] + (1 - b2) * g * g
        mh = M[n] / (1 - b1 ** step)
        vh = V[n] / (1 - b2 ** step)
        wd = t["weight_decay"] if P[n].ndim == 2 else 0.0
        P[n] = P[n] - lr * (mh / (np.sqrt(vh) + t["adam_eps"]) + wd * P[n])
    for n, load in loads.items():
        mean = np.sum(load) / E
        bufs[n] = bufs[n] + gamma * np.sign(mean - load)
    return lr, norm
