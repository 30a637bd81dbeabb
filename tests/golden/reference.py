#!/usr/bin/python3
"""PyTorch reference of the Myriad model (docs/model.md) and the golden-file writer.

This file is the executable twin of docs/model.md: the C++ model is held to
the tensors it writes. It is plain fp32 PyTorch on the CPU, written for
clarity first (explicit loops over experts) and kept fast enough to serve as
the benchmark peer (bench/torch_peer.py imports it).

The model is functional: parameters and buffers live in ordered dicts keyed
by the exact tensor names of docs/model.md, so autograd, the hand-written
AdamW and the golden dump all see the same names in the same order.

Usage:
  /usr/bin/python3 tests/golden/reference.py --config tests/golden/tiny.toml \
      [--set section.key=value ...] [--seed N] --out DIR/golden.safetensors

Choices the contract leaves open (the C++ side must make the same ones):
  * RoPE cos/sin tables are computed in float64 (angle = pos * theta^(-2i/D))
    and rounded to fp32 once.
  * Top-K selection is on (s + bias) in fp32; the bias never enters w_j.
  * The balance loss is computed for every MoE block, MTP blocks included
    (N = T-k there), and is added to the total loss unweighted by lambda;
    "loss_aux" is the sum over all of them, alpha included.
  * Bias update: sign(mean - load_i) is evaluated exactly on integers as
    sign(sum_j load_j - E * load_i); MTP MoE blocks update their own bias.
  * lr(s) exactly as docs/model.md now states it (p = (s-W)/max(1, steps-W)),
    computed in float64 and used as a Python scalar; stored as F32 in step_lr.
  * Parameter order (init draws, optimizer loop, golden file order) is the
    order the tensor list of docs/model.md is written in: per block
    input_layernorm, q, k, v, o, post_attention_layernorm, then the FFN (gate,
    experts 0..E-1 each gate/up/down, shared); per MTP module enorm, hnorm,
    eh_proj, norm, then the block. Nothing numeric depends on it beyond the
    summation order of the global grad norm.
  * MTP does not detach h^{k-1}: L_mtp trains the main model too.
  * grad_clip <= 0 disables clipping. Adam bias corrections use t = step.
    Weight decay is lr*wd*p with the pre-update p, on every 2-D tensor
    (embedding, projections, router gate, eh_proj, lm_head).
"""
import argparse
import json
import math
import os
import sys
import tomllib
from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_safetensors  # noqa: E402

GOLDEN_FORMAT = "myriad-golden-1"

# ----------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------

MODEL_KEYS = {
    "vocab_size": int, "d_model": int, "n_layers": int, "n_heads": int, "n_kv_heads": int,
    "d_ff": int, "n_dense_layers": int, "n_routed_experts": int, "n_shared_experts": int,
    "top_k": int, "d_expert": int, "score_func": str, "aux_loss_weight": float,
    "bias_update_rate": float, "mtp_depth": int, "mtp_loss_weight": float,
    "tie_embeddings": bool, "rope_theta": float, "norm_eps": float, "max_seq_len": int,
    "init_std": float,
}
TRAIN_KEYS = {
    "seq_len": int, "batch_size": int, "grad_accum": int, "steps": int, "lr": float,
    "min_lr": float, "warmup_steps": int, "weight_decay": float, "beta1": float,
    "beta2": float, "adam_eps": float, "grad_clip": float, "seed": int,
}


@dataclass
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    n_dense_layers: int
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    d_expert: int
    score_func: str
    aux_loss_weight: float
    bias_update_rate: float
    mtp_depth: int
    mtp_loss_weight: float
    tie_embeddings: bool
    rope_theta: float
    norm_eps: float
    max_seq_len: int
    init_std: float

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def has_moe(self):
        return self.n_layers > self.n_dense_layers

    def validate(self):
        c = self
        errs = []
        if c.d_model % c.n_heads:
            errs.append("d_model must be divisible by n_heads")
        elif c.head_dim % 2:
            errs.append("head_dim = d_model / n_heads must be even (rotate-half RoPE)")
        if c.n_kv_heads <= 0 or c.n_heads % c.n_kv_heads:
            errs.append("n_heads must be a multiple of n_kv_heads")
        if not 0 <= c.n_dense_layers <= c.n_layers:
            errs.append("n_dense_layers must be in 0..n_layers")
        if c.has_moe and not 1 <= c.top_k <= c.n_routed_experts:
            errs.append("MoE blocks need 1 <= top_k <= n_routed_experts")
        if c.score_func not in ("softmax", "sigmoid"):
            errs.append('score_func must be "softmax" or "sigmoid"')
        if c.mtp_depth < 0:
            errs.append("mtp_depth must be >= 0")
        if errs:
            raise ValueError("[config] " + "; ".join(errs))


@dataclass
class TrainConfig:
    seq_len: int
    batch_size: int
    grad_accum: int
    steps: int
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float
    beta1: float
    beta2: float
    adam_eps: float
    grad_clip: float
    seed: int


def parse_set_value(text):
    """Parses the value of --set key=value as a TOML literal, else a bare string."""
    try:
        return tomllib.loads("v = " + text)["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(doc, sets):
    """Applies "a.b=value" overrides to the nested dict `doc` in place."""
    for kv in sets or []:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise ValueError(f"--set {kv}: expected key=value (hint: --set train.lr=3e-4)")
        parts = key.split(".")
        t = doc
        for part in parts[:-1]:
            t = t.setdefault(part, {})
            if not isinstance(t, dict):
                raise ValueError(f"--set {kv}: {part} is not a table")
        t[parts[-1]] = parse_set_value(value)


# Keys of the C++ trainer loop (logging, checkpoints, threads) that do not
# change the model or the optimizer: the reference accepts and ignores them.
LOOP_ONLY_TRAIN_KEYS = {"log_every", "eval_every", "eval_batches", "ckpt_every", "keep_last",
                        "threads", "out_dir", "metrics_file", "precision"}


def _typed_section(doc, section, keys, required):
    table = doc.get(section)
    if table is not None and section == "train":
        table = {k: v for k, v in table.items() if k not in LOOP_ONLY_TRAIN_KEYS}
    if table is None:
        if required:
            raise ValueError(f"[config] missing [{section}] section")
        return None
    unknown = sorted(set(table) - set(keys))
    missing = sorted(set(keys) - set(table))
    if unknown:
        raise ValueError(f"[config] unknown key(s) in [{section}]: {unknown}")
    if missing:
        raise ValueError(f"[config] missing key(s) in [{section}]: {missing} (the reference has no defaults)")
    out = {}
    for k, ty in keys.items():
        v = table[k]
        if ty is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, ty) or (ty is int and isinstance(v, bool)):
            raise ValueError(f"[config] {section}.{k}: expected {ty.__name__}, got {v!r}")
        out[k] = v
    return out


def load_config(path, sets=None, seed=None, need_train=True):
    """Reads a TOML config, applies --set overrides and an optional seed override.

    Returns (ModelConfig, TrainConfig or None, resolved dict). Sections other
    than [model] and [train] are ignored (they belong to the C++ tools).
    """
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    apply_overrides(doc, sets)
    if seed is not None:
        doc.setdefault("train", {})["seed"] = seed
    mcfg = ModelConfig(**_typed_section(doc, "model", MODEL_KEYS, True))
    mcfg.validate()
    tdict = _typed_section(doc, "train", TRAIN_KEYS, need_train)
    tcfg = TrainConfig(**tdict) if tdict is not None else None
    resolved = {"model": asdict(mcfg)}
    if tcfg is not None:
        resolved["train"] = asdict(tcfg)
        if tcfg.seq_len > mcfg.max_seq_len:
            raise ValueError("[config] train.seq_len exceeds model.max_seq_len")
        if tcfg.seq_len - mcfg.mtp_depth < 1:
            raise ValueError("[config] MTP needs seq_len > mtp_depth")
    return mcfg, tcfg, resolved


# ----------------------------------------------------------------------------
# Building blocks (shapes: B batch, T sequence, C d_model, H heads, D head_dim)
# ----------------------------------------------------------------------------

def rms_norm(h, w, eps):
    """h / sqrt(mean(h^2) + eps) * w over the last dim."""
    return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(max_len, head_dim, theta, dtype):
    """cos, sin of pos * theta^(-2i/D), [max_len, D/2]; computed in float64, rounded once."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / head_dim)
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE. x: [..., T, D]; cos, sin: [T, D/2]. Pair (x_i, x_{i+D/2})."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(D) + causal mask) v with GQA.

    q: [B, H, T, D]; k, v: [B, Hkv, T, D]; query head j reads kv head j // (H/Hkv).
    Returns [B, H, T, D]. Written with 3-D bmm so neither direction copies a
    transposed [T, T] tensor; the 1/sqrt(D) scale is applied inside baddbmm
    (alpha), i.e. as a multiply by 1/sqrt(D), together with the additive mask.
    """
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    mask = torch.full((T, T), float("-inf"), dtype=q.dtype).triu_(1)
    scores = torch.baddbmm(mask, q.reshape(B * H, T, D), k.reshape(B * H, T, D).transpose(1, 2),
                           alpha=1.0 / math.sqrt(D))
    return torch.bmm(torch.softmax(scores, dim=-1), v.reshape(B * H, T, D)).view(B, H, T, D)


def swiglu(x, w_gate, w_up, w_down):
    """down( silu(gate x) * (up x) ); y = W x means x @ W^T."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def router_scores(x, w_gate, score_func):
    """s = softmax|sigmoid(gate x). x: [N, C] -> [N, E]."""
    logits = F.linear(x, w_gate)
    return torch.softmax(logits, dim=-1) if score_func == "softmax" else torch.sigmoid(logits)


def select_experts(s, bias, k):
    """Indices [N, K] of the top-K of (s + bias); the bias only steers selection."""
    with torch.no_grad():
        return torch.topk(s.detach() + bias, k, dim=-1).indices


def combine_weights(s, sel):
    """w_j = s_j / sum_{m in S} s_m for the selected experts, [N, K]."""
    s_sel = s.gather(1, sel)
    return s_sel / s_sel.sum(-1, keepdim=True)


class ForwardResult:
    """Outputs of one forward pass; losses are 0-d tensors."""

    def __init__(self, loss, loss_main, loss_mtp, loss_aux, logits, loads):
        self.loss = loss
        self.loss_main = loss_main
        self.loss_mtp = loss_mtp
        self.loss_aux = loss_aux
        self.logits = logits    # main head, [B, T, V]
        self.loads = loads      # bias buffer name -> int64 [E], (token, expert) assignments


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class MyriadRef:
    """Functional Myriad model: holds the config and RoPE tables, not the weights."""

    def __init__(self, cfg: ModelConfig, dtype=torch.float32):
        cfg.validate()
        self.cfg = cfg
        self.dtype = dtype
        self.cos, self.sin = rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta, dtype)
        # When a list, every MoE call appends its smallest gap between the K-th and
        # (K+1)-th of (s + bias): a near tie there could route differently in C++.
        self.route_margins = None

    # --- names and shapes -------------------------------------------------
    def _block_specs(self, prefix, moe):
        c = self.cfg
        C, D = c.d_model, c.head_dim
        specs = [
            (prefix + "input_layernorm.weight", [C]),
            (prefix + "self_attn.q_proj.weight", [c.n_heads * D, C]),
            (prefix + "self_attn.k_proj.weight", [c.n_kv_heads * D, C]),
            (prefix + "self_attn.v_proj.weight", [c.n_kv_heads * D, C]),
            (prefix + "self_attn.o_proj.weight", [C, c.n_heads * D]),
            (prefix + "post_attention_layernorm.weight", [C]),
        ]
        if moe:
            specs.append((prefix + "mlp.gate.weight", [c.n_routed_experts, C]))
            for e in range(c.n_routed_experts):
                ep = f"{prefix}mlp.experts.{e}."
                specs += [(ep + "gate_proj.weight", [c.d_expert, C]),
                          (ep + "up_proj.weight", [c.d_expert, C]),
                          (ep + "down_proj.weight", [C, c.d_expert])]
            if c.n_shared_experts > 0:
                F_ = c.n_shared_experts * c.d_expert
                sp = prefix + "mlp.shared_experts."
                specs += [(sp + "gate_proj.weight", [F_, C]),
                          (sp + "up_proj.weight", [F_, C]),
                          (sp + "down_proj.weight", [C, F_])]
        else:
            specs += [(prefix + "mlp.gate_proj.weight", [c.d_ff, C]),
                      (prefix + "mlp.up_proj.weight", [c.d_ff, C]),
                      (prefix + "mlp.down_proj.weight", [C, c.d_ff])]
        return specs

    def _blocks(self):
        """(prefix, is_moe) of every block: main layers, then MTP blocks."""
        c = self.cfg
        out = [(f"model.layers.{l}.", l >= c.n_dense_layers) for l in range(c.n_layers)]
        out += [(f"model.mtp.{j}.block.", c.has_moe) for j in range(c.mtp_depth)]
        return out

    def param_specs(self):
        """[(name, shape)] in the contract's order."""
        c = self.cfg
        specs = [("model.embed_tokens.weight", [c.vocab_size, c.d_model])]
        for l in range(c.n_layers):
            specs += self._block_specs(f"model.layers.{l}.", l >= c.n_dense_layers)
        specs.append(("model.norm.weight", [c.d_model]))
        if not c.tie_embeddings:
            specs.append(("lm_head.weight", [c.vocab_size, c.d_model]))
        for j in range(c.mtp_depth):
            p = f"model.mtp.{j}."
            specs += [(p + "enorm.weight", [c.d_model]), (p + "hnorm.weight", [c.d_model]),
                      (p + "eh_proj.weight", [c.d_model, 2 * c.d_model]), (p + "norm.weight", [c.d_model])]
            specs += self._block_specs(p + "block.", c.has_moe)
        return specs

    def buffer_specs(self):
        """[(name, shape)] of the e_score_correction_bias buffers, block order."""
        return [(p + "mlp.gate.e_score_correction_bias", [self.cfg.n_routed_experts])
                for p, moe in self._blocks() if moe]

    def init_params(self, gen):
        """normal(0, init_std) for matrices, ones for norm weights; drawn in order."""
        out = OrderedDict()
        for name, shape in self.param_specs():
            if len(shape) == 1:
                out[name] = torch.ones(shape, dtype=self.dtype)
            else:
                out[name] = torch.empty(shape, dtype=self.dtype).normal_(0.0, self.cfg.init_std, generator=gen)
        return out

    def init_buffers(self, gen=None, std=0.0):
        """Correction biases: zeros, or normal(0, std) draws (the golden test uses 0.02)."""
        out = OrderedDict()
        for name, shape in self.buffer_specs():
            t = torch.zeros(shape, dtype=self.dtype)
            if std > 0:
                t.normal_(0.0, std, generator=gen)
            out[name] = t
        return out

    # --- forward ----------------------------------------------------------
    def moe(self, p, bufs, prefix, f, loads, aux_losses):
        """Dropless MoE of f [B, N, C]; appends this block's balance loss and loads."""
        c = self.cfg
        B, N, C = f.shape
        E, K = c.n_routed_experts, c.top_k
        x = f.reshape(B * N, C)
        s = router_scores(x, p[prefix + "mlp.gate.weight"], c.score_func)      # [BN, E]
        bias_name = prefix + "mlp.gate.e_score_correction_bias"
        sel = select_experts(s, bufs[bias_name], K)                             # [BN, K]
        if self.route_margins is not None and K < E:
            top = torch.topk(s.detach() + bufs[bias_name], K + 1, dim=-1).values
            self.route_margins.append(float((top[:, K - 1] - top[:, K]).min()))
        w = combine_weights(s, sel)                                             # [BN, K]
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = (sel == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            ep = f"{prefix}mlp.experts.{e}."
            y = swiglu(x.index_select(0, tok), p[ep + "gate_proj.weight"], p[ep + "up_proj.weight"],
                       p[ep + "down_proj.weight"])
            out = out.index_add(0, tok, (y * w[tok, slot].unsqueeze(-1)).to(out.dtype))
        if c.n_shared_experts > 0:
            sp = prefix + "mlp.shared_experts."
            out = out + swiglu(x, p[sp + "gate_proj.weight"], p[sp + "up_proj.weight"], p[sp + "down_proj.weight"])
        with torch.no_grad():
            counts = torch.zeros(B * N, E, dtype=torch.int64).scatter_(1, sel, 1).view(B, N, E).sum(1)  # [B, E]
        loads[bias_name] = loads.get(bias_name, 0) + counts.sum(0)
        if c.aux_loss_weight > 0:
            s_norm = s / s.sum(-1, keepdim=True)
            P = s_norm.view(B, N, E).mean(1)                                   # [B, E]
            f_i = counts.to(s.dtype) * (E / (K * N))                           # constant
            aux_losses.append(c.aux_loss_weight * (f_i * P).sum(-1).mean())
        return out.view(B, N, C)

    def block(self, p, bufs, prefix, h, moe, loads, aux_losses):
        """One transformer block on h [B, T, C] (RoPE positions 0..T-1)."""
        c = self.cfg
        B, T, C = h.shape
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        a = rms_norm(h, p[prefix + "input_layernorm.weight"], c.norm_eps)
        q = F.linear(a, p[prefix + "self_attn.q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
        k = F.linear(a, p[prefix + "self_attn.k_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
        v = F.linear(a, p[prefix + "self_attn.v_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        att = causal_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        h = h + F.linear(att.transpose(1, 2).reshape(B, T, H * D), p[prefix + "self_attn.o_proj.weight"])
        f = rms_norm(h, p[prefix + "post_attention_layernorm.weight"], c.norm_eps)
        if moe:
            y = self.moe(p, bufs, prefix, f, loads, aux_losses)
        else:
            y = swiglu(f, p[prefix + "mlp.gate_proj.weight"], p[prefix + "mlp.up_proj.weight"],
                       p[prefix + "mlp.down_proj.weight"])
        return h + y

    def head_weight(self, p):
        return p["model.embed_tokens.weight"] if self.cfg.tie_embeddings else p["lm_head.weight"]

    def forward(self, p, bufs, tokens):
        """Full forward of tokens [B, T+1] (int64): main loss, MTP, balance losses."""
        c = self.cfg
        T = tokens.shape[1] - 1
        emb = F.embedding(tokens[:, :T], p["model.embed_tokens.weight"])       # [B, T, C]
        loads, aux_losses = OrderedDict(), []
        h = emb
        for l in range(c.n_layers):
            h = self.block(p, bufs, f"model.layers.{l}.", h, l >= c.n_dense_layers, loads, aux_losses)
        head = self.head_weight(p)
        logits = F.linear(rms_norm(h, p["model.norm.weight"], c.norm_eps), head)  # [B, T, V]
        loss_main = F.cross_entropy(logits.reshape(-1, c.vocab_size), tokens[:, 1:].reshape(-1))
        loss_mtp = torch.zeros((), dtype=self.dtype)
        if c.mtp_depth > 0:
            h_prev, mtp_losses = h, []
            for k in range(1, c.mtp_depth + 1):
                pre, n = f"model.mtp.{k - 1}.", T - k
                h_cat = torch.cat([rms_norm(h_prev[:, :n], p[pre + "hnorm.weight"], c.norm_eps),
                                   rms_norm(emb[:, k:k + n], p[pre + "enorm.weight"], c.norm_eps)], dim=-1)
                hk = F.linear(h_cat, p[pre + "eh_proj.weight"])
                hk = self.block(p, bufs, pre + "block.", hk, c.has_moe, loads, aux_losses)
                lk = F.linear(rms_norm(hk, p[pre + "norm.weight"], c.norm_eps), head)
                mtp_losses.append(F.cross_entropy(lk.reshape(-1, c.vocab_size),
                                                  tokens[:, k + 1:k + 1 + n].reshape(-1)))
                h_prev = hk
            loss_mtp = (c.mtp_loss_weight / c.mtp_depth) * sum(mtp_losses[1:], mtp_losses[0])
        loss_aux = sum(aux_losses[1:], aux_losses[0]) if aux_losses else torch.zeros((), dtype=self.dtype)
        loss = loss_main + loss_mtp + loss_aux
        return ForwardResult(loss, loss_main, loss_mtp, loss_aux, logits, loads)


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------

def lr_at(step, t: TrainConfig):
    """Learning rate of 1-based step s (docs/model.md, verbatim):
    lr*s/W while s <= W; then min_lr + (lr-min_lr)/2 * (1 + cos(pi*p)),
    p = (s - W) / max(1, steps - W) (not clamped: p > 1 past `steps`)."""
    W = t.warmup_steps
    if step <= W:
        return t.lr * step / W
    p = (step - W) / max(1, t.steps - W)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + math.cos(math.pi * p))


class Trainer:
    """Hand-written AdamW + global-norm clipping + aux-loss-free bias update.

    `params` (leaf tensors, requires_grad) and `buffers` are updated in place.
    """

    def __init__(self, model: MyriadRef, params, buffers, tcfg: TrainConfig):
        self.model, self.params, self.buffers, self.t = model, params, buffers, tcfg
        self.m = OrderedDict((n, torch.zeros_like(x)) for n, x in params.items())
        self.v = OrderedDict((n, torch.zeros_like(x)) for n, x in params.items())
        self.step_count = 0

    def gradients(self, micro_batches):
        """Mean over micro-batches of the total-loss gradients; also mean loss and summed loads."""
        names = list(self.params)
        plist = [self.params[n] for n in names]
        grads, loss_sum, loads = None, None, OrderedDict()
        for tokens in micro_batches:
            out = self.model.forward(self.params, self.buffers, tokens)
            g = torch.autograd.grad(out.loss, plist, allow_unused=True)
            g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(plist, g)]
            if grads is None:
                grads = g
            else:
                for acc, gi in zip(grads, g):
                    acc.add_(gi)
            loss_sum = out.loss.detach() if loss_sum is None else loss_sum + out.loss.detach()
            for k, v in out.loads.items():
                loads[k] = loads.get(k, 0) + v
        A = len(micro_batches)
        if A > 1:
            for g in grads:
                g.div_(A)
        grads = OrderedDict(zip(names, grads))
        return grads, loss_sum / A, loads

    @torch.no_grad()
    def apply(self, grads, loads):
        """One optimizer step from averaged grads (clipped in place); returns (lr, norm before clipping)."""
        t = self.t
        self.step_count += 1
        step = self.step_count
        # Global L2 norm = norm of the per-tensor norms (no squared temporaries).
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
        scale = min(1.0, t.grad_clip / (float(norm) + 1e-6)) if t.grad_clip > 0 else 1.0
        lr = lr_at(step, t)
        bc1, bc2 = 1.0 - t.beta1 ** step, 1.0 - t.beta2 ** step
        for name, p in self.params.items():
            g = grads[name].mul_(scale) if scale != 1.0 else grads[name]   # clips in place
            m, v = self.m[name], self.v[name]
            m.mul_(t.beta1).add_(g, alpha=1.0 - t.beta1)
            v.mul_(t.beta2).addcmul_(g, g, value=1.0 - t.beta2)
            # update = (m / bc1) / (sqrt(v / bc2) + eps) [+ wd * p]; p -= lr * update
            update = torch.div(m, bc1).div_(torch.div(v, bc2).sqrt_().add_(t.adam_eps))
            if p.dim() == 2 and t.weight_decay != 0:
                update.add_(p, alpha=t.weight_decay)
            p.add_(update.mul_(lr), alpha=-1.0)
        gamma = self.model.cfg.bias_update_rate
        if gamma != 0:
            E = self.model.cfg.n_routed_experts
            for name, load in loads.items():
                direction = torch.sign(load.sum() - E * load)     # sign(mean - load_i), exact
                self.buffers[name].add_(direction.to(self.buffers[name].dtype), alpha=gamma)
        return lr, norm

    def step(self, micro_batches):
        """Gradients of the micro-batches, then the update. Returns (loss, lr, grad_norm)."""
        grads, loss, loads = self.gradients(micro_batches)
        lr, norm = self.apply(grads, loads)
        return loss, lr, norm


# ----------------------------------------------------------------------------
# Golden file
# ----------------------------------------------------------------------------

def as_leaves(tensors):
    return OrderedDict((n, x.detach().clone().requires_grad_(True)) for n, x in tensors.items())


def make_golden(mcfg, tcfg, resolved, log=print):
    """Builds every tensor of the golden file; returns (tensors, metadata)."""
    gen = torch.Generator().manual_seed(tcfg.seed)
    model = MyriadRef(mcfg)
    model.route_margins = []
    params0 = model.init_params(gen)
    buffers0 = model.init_buffers(gen, std=0.02)
    B, T, V = tcfg.batch_size, tcfg.seq_len, mcfg.vocab_size
    tokens = torch.randint(0, V, (B, T + 1), generator=gen)
    train_tokens = torch.randint(0, V, (tcfg.steps, tcfg.grad_accum, B, T + 1), generator=gen)

    out = OrderedDict()
    for n, x in params0.items():
        out["param/" + n] = x
    for n, x in buffers0.items():
        out["buffer/" + n] = x
    out["tokens"] = tokens.to(torch.int32)

    # One forward/backward on `tokens`.
    params = as_leaves(params0)
    fwd = model.forward(params, buffers0, tokens)
    grads = torch.autograd.grad(fwd.loss, list(params.values()), allow_unused=True)
    out["logits"] = fwd.logits.detach()
    for key in ("loss", "loss_main", "loss_mtp", "loss_aux"):
        out[key] = getattr(fwd, key).detach().reshape(1)
    for (n, p), g in zip(params.items(), grads):
        out["grad/" + n] = torch.zeros_like(p) if g is None else g
    log(f"forward: loss {fwd.loss.item():.6f} main {fwd.loss_main.item():.6f} "
        f"mtp {fwd.loss_mtp.item():.6f} aux {fwd.loss_aux.item():.6f}")

    # `steps` optimizer steps from the same init.
    params = as_leaves(params0)
    buffers = OrderedDict((n, x.clone()) for n, x in buffers0.items())
    trainer = Trainer(model, params, buffers, tcfg)
    losses, lrs, norms = [], [], []
    for s in range(tcfg.steps):
        loss, lr, norm = trainer.step([train_tokens[s, a] for a in range(tcfg.grad_accum)])
        losses.append(float(loss))
        lrs.append(lr)
        norms.append(float(norm))
        log(f"step {s + 1}: loss {float(loss):.6f} lr {lr:.6g} grad_norm {float(norm):.6f}")
    out["train_tokens"] = train_tokens.to(torch.int32)
    out["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    out["step_lr"] = torch.tensor(lrs, dtype=torch.float32)
    out["step_grad_norm"] = torch.tensor(norms, dtype=torch.float32)
    for n, x in params.items():
        out["final/param/" + n] = x.detach()
    for n, x in buffers.items():
        out["final/buffer/" + n] = x
    if model.route_margins:
        margin = min(model.route_margins)
        log(f"smallest top-K routing margin over all MoE calls: {margin:.3g}"
            + ("  WARNING: near tie, an fp32 reimplementation may route differently" if margin < 1e-5 else ""))
    metadata = {"config": json.dumps(resolved, sort_keys=True), "format": GOLDEN_FORMAT}
    return out, metadata


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="TOML with [model] and [train]")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override, value parsed as a TOML literal (else a bare string)")
    ap.add_argument("--seed", type=int, default=None, help="overrides train.seed")
    ap.add_argument("--out", required=True, help="path of the .safetensors file to write")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)   # fixed reduction order: the same bits on every run
    torch.manual_seed(0)       # nothing should draw from the global RNG; pin it anyway
    mcfg, tcfg, resolved = load_config(args.config, args.set, args.seed)
    log = (lambda *a: None) if args.quiet else print
    tensors, metadata = make_golden(mcfg, tcfg, resolved, log)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_safetensors(args.out, tensors, metadata)
    log(f"wrote {args.out}: {len(tensors)} tensors")


if __name__ == "__main__":
    main()
