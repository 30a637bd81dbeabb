#!/usr/bin/python3
"""Independent PyTorch reference of five Hugging Face causal-LM families.

Reads a Hugging Face model folder (config.json + model.safetensors, or shards
with model.safetensors.index.json; F32/BF16/F16 weights) and computes, in
float32 (or float64 with --float64):

  * logits [B, T, V] and the mean next-token cross-entropy loss of a batch,
  * greedy generation with a KV cache,
  * for DeepSeek-V3: both MLA paths (unabsorbed: c_kv expanded through
    kv_b_proj; absorbed: compressed cache of c_kv and k_pe, W_UK folded into
    the query, W_UV applied after attention), checked equal within 1e-5, and
    the multi-token-prediction (MTP) logits,
  * gradients of the losses with respect to every weight (autograd).

Families: LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM
(qwen3), Qwen3MoeForCausalLM (qwen3_moe), DeepseekV3ForCausalLM (deepseek_v3).
Written from the published equations and Hugging Face's config/weight
conventions; tests/hf/README.md states every convention this file follows.

CLI:
  hf_reference.py --model DIR --tokens FILE_OR_SEED --out OUT.safetensors
                  [--batch B --seq T] [--greedy N [--prompt 1,2,3]]
                  [--grads] [--float64] [--mla unabsorbed|absorbed]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
# The eps of DeepSeek's low-rank norms (q_a_layernorm, kv_a_layernorm) is the
# RMSNorm default, not config.rms_norm_eps (HF builds them without an eps).
MLA_LOWRANK_EPS = 1e-6
# Default token batch of the CLI (and the batch make_tiny.py checks routing
# margins on): torch.randint(0, vocab, (2, 16)) from torch.Generator seeded 0.
DEFAULT_BATCH, DEFAULT_SEQ = 2, 16
DEFAULT_GREEDY, DEFAULT_PROMPT_LEN = 8, 4
ROUTER_MARGIN_MIN = 1e-4
_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


class ReferenceError(Exception):
    pass


def _fail(msg):
    raise ReferenceError(msg)


# ----------------------------------------------------------------------------
# Folder I/O
# ----------------------------------------------------------------------------

def load_folder(folder):
    """(config dict, {name: tensor as stored}) of an HF folder; checks the index."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    index_path = os.path.join(folder, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        for shard in sorted(set(weight_map.values())):
            part, _ = read_safetensors(os.path.join(folder, shard))
            for name, t in part.items():
                if weight_map.get(name) != shard:
                    _fail(f"{shard}: tensor {name} is not mapped to this shard by the index")
                if name in tensors:
                    _fail(f"{name} stored twice")
                tensors[name] = t
        missing = set(weight_map) - set(tensors)
        if missing:
            _fail(f"index names tensors absent from the shards: {sorted(missing)[:5]}")
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        declared = int(index.get("metadata", {}).get("total_size", -1))
        if declared != total:
            _fail(f"index metadata.total_size {declared} != {total} bytes of tensor data")
    else:
        tensors, _ = read_safetensors(os.path.join(folder, "model.safetensors"))
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES.values():
            _fail(f"{name}: unsupported weight dtype {t.dtype}")
    return cfg, tensors


# ----------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------

class Spec:
    """The config.json of one family, read with HF's meanings and defaults."""

    def __init__(self, cfg):
        self.cfg = cfg
        mt = cfg.get("model_type")
        if mt not in ARCHITECTURES:
            _fail(f"model_type {mt!r} is not one of {sorted(ARCHITECTURES)}")
        arch = cfg.get("architectures") or [ARCHITECTURES[mt]]
        if arch[0] != ARCHITECTURES[mt]:
            _fail(f"architectures {arch} do not match model_type {mt}")
        self.family = mt
        g = cfg.get
        self.vocab = g("vocab_size")
        self.hidden = g("hidden_size")
        self.layers = g("num_hidden_layers")
        self.heads = g("num_attention_heads")
        self.kv_heads = g("num_key_value_heads") or self.heads
        self.eps = g("rms_norm_eps", 1e-6)
        self.tie = bool(g("tie_word_embeddings", False))
        self.intermediate = g("intermediate_size")
        if g("hidden_act", "silu") != "silu":
            _fail(f"hidden_act {g('hidden_act')} unsupported (only silu)")
        if g("use_sliding_window", False):
            _fail("use_sliding_window=true is not supported by this reference")
        if g("partial_rotary_factor", 1.0) != 1.0:
            _fail("partial_rotary_factor != 1 is not used by these families")
        # Attention projections' biases, per family as HF builds them.
        ab = bool(g("attention_bias", False))
        if mt == "qwen2":      # Qwen2: q/k/v always biased, o_proj never
            self.qkv_bias, self.o_bias = True, False
        else:                  # llama, qwen3, qwen3_moe: attention_bias for q/k/v/o
            self.qkv_bias, self.o_bias = ab, ab
        self.mlp_bias = bool(g("mlp_bias", False)) if mt == "llama" else False
        self.qk_norm = mt in ("qwen3", "qwen3_moe")
        self.mla = mt == "deepseek_v3"
        if self.mla:
            self.q_lora_rank = g("q_lora_rank")
            self.kv_lora_rank = g("kv_lora_rank")
            self.qk_nope = g("qk_nope_head_dim")
            self.qk_rope = g("qk_rope_head_dim")
            self.v_head = g("v_head_dim")
            self.mla_bias = ab
            self.rope_dim = self.qk_rope
            self.rope_interleave = bool(g("rope_interleave", True))
        else:
            self.head_dim = g("head_dim") or self.hidden // self.heads
            self.rope_dim = self.head_dim
            self.rope_interleave = False
            if self.heads % self.kv_heads:
                _fail("num_attention_heads must be a multiple of num_key_value_heads")
        self.rope = rope_setup(cfg, self.rope_dim)
        # MoE
        self.moe = None
        if mt == "qwen3_moe":
            self.moe = dict(kind="softmax", experts=g("num_experts"), top_k=g("num_experts_per_tok"),
                            norm=bool(g("norm_topk_prob", False)), inter=g("moe_intermediate_size"),
                            shared=0, sparse_step=g("decoder_sparse_step", 1),
                            mlp_only=list(g("mlp_only_layers") or []))
        elif mt == "deepseek_v3":
            if g("scoring_func", "sigmoid") != "sigmoid":
                _fail(f"scoring_func {g('scoring_func')} unsupported (DeepSeek-V3 uses sigmoid)")
            if g("topk_method", "noaux_tc") != "noaux_tc":
                _fail(f"topk_method {g('topk_method')} unsupported (DeepSeek-V3 uses noaux_tc)")
            self.moe = dict(kind="sigmoid", experts=g("n_routed_experts"), top_k=g("num_experts_per_tok"),
                            norm=bool(g("norm_topk_prob", True)), inter=g("moe_intermediate_size"),
                            shared=g("n_shared_experts") or 0, n_group=g("n_group", 1),
                            topk_group=g("topk_group", 1), scale=float(g("routed_scaling_factor", 1.0)),
                            first_dense=g("first_k_dense_replace", 0), freq=g("moe_layer_freq", 1))
            if self.moe["experts"] and self.moe["experts"] % self.moe["n_group"]:
                _fail("n_routed_experts must be a multiple of n_group")
            if self.moe["experts"] and self.moe["experts"] // self.moe["n_group"] < 2:
                _fail("group scores take the top 2 experts of a group: need >= 2 experts per group")
        self.mtp_layers = int(g("num_nextn_predict_layers", 0) or 0) if mt == "deepseek_v3" else 0
        self.scale = self._softmax_scale()

    def is_moe_layer(self, i):
        m = self.moe
        if m is None or not m["experts"]:
            return False
        if m["kind"] == "softmax":   # Qwen3-MoE
            return i not in m["mlp_only"] and (i + 1) % m["sparse_step"] == 0
        # DeepSeek: layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0
        return i >= m["first_dense"] and i % m["freq"] == 0

    def _softmax_scale(self):
        if not self.mla:
            return self.head_dim ** -0.5
        s = (self.qk_nope + self.qk_rope) ** -0.5
        rp = self.rope["params"]
        if self.rope["type"] != "default":
            mad = rp.get("mscale_all_dim", 0)
            if mad:
                m = yarn_mscale(rp["factor"], mad)
                s = s * m * m
        return s


def yarn_mscale(scale, mscale=1.0):
    """0.1 * mscale * ln(scale) + 1 for scale > 1, else 1 (YaRN's attention temperature)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_setup(cfg, dim):
    """inv_freq (float64, [dim/2]) and the attention factor multiplying cos and sin.

    Reads `rope_scaling` (hub configs) or `rope_parameters` (transformers v5);
    `type` is an older spelling of `rope_type`.
    """
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rp = dict(rp)
    theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rtype = rp.get("rope_type", rp.get("type", "default"))
    half = torch.arange(0, dim, 2, dtype=torch.float64)
    inv = 1.0 / theta ** (half / dim)
    attn = 1.0
    if rtype == "default":
        pass
    elif rtype == "linear":
        inv = inv / float(rp["factor"])
    elif rtype == "llama3":
        inv = llama3_inv_freq(inv, float(rp["factor"]), float(rp["low_freq_factor"]),
                              float(rp["high_freq_factor"]), float(rp["original_max_position_embeddings"]))
    elif rtype == "yarn":
        inv, attn = yarn_inv_freq(cfg, rp, inv, theta, dim)
        rp["factor"] = _yarn_factor(cfg, rp)
    else:
        _fail(f"rope_type {rtype!r} unsupported (default, linear, llama3, yarn)")
    return {"inv_freq": inv, "attention_factor": float(attn), "type": rtype, "params": rp, "theta": theta}


def llama3_inv_freq(inv, factor, low_ff, high_ff, old_ctx):
    """Llama 3.1: wavelengths under old_ctx/high_ff kept, over old_ctx/low_ff divided by
    factor, and in between a linear blend in old_ctx/wavelength."""
    wavelen = 2.0 * math.pi / inv
    out = inv.clone()
    for i in range(inv.numel()):
        w = float(wavelen[i])
        if w < old_ctx / high_ff:
            continue
        if w > old_ctx / low_ff:
            out[i] = inv[i] / factor
        else:
            s = (old_ctx / w - low_ff) / (high_ff - low_ff)
            out[i] = (1.0 - s) * inv[i] / factor + s * inv[i]
    return out


def _yarn_factor(cfg, rp):
    f = rp.get("factor")
    if f is None:
        f = cfg["max_position_embeddings"] / rp["original_max_position_embeddings"]
    return float(f)


def yarn_inv_freq(cfg, rp, inv, theta, dim):
    """YaRN as HF computes it: ramp between extrapolation (original frequencies) and
    interpolation (divided by factor) over the dimension range found from beta_fast /
    beta_slow rotations in original_max_position_embeddings."""
    factor = _yarn_factor(cfg, rp)
    orig = float(rp.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
    attn = rp.get("attention_factor")
    if attn is None:
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
        if ms and msa:
            attn = yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
        else:
            attn = yarn_mscale(factor)
    beta_fast = rp.get("beta_fast") or 32
    beta_slow = rp.get("beta_slow") or 1

    def dim_of(rotations):  # the dimension whose wavelength fits `rotations` times in orig
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if rp.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    keep = 1.0 - ramp          # weight of the original (extrapolated) frequency
    out = (inv / factor) * ramp + inv * keep
    return out, attn


# ----------------------------------------------------------------------------
# Weight names and shapes (one enumeration, used by the loader and make_tiny.py)
# ----------------------------------------------------------------------------

def weight_shapes(cfg):
    """{HF weight name: shape} of the folder a config describes, in file order."""
    s = Spec(cfg)
    out = {"model.embed_tokens.weight": [s.vocab, s.hidden]}
    for i in range(s.layers):
        out.update(_layer_shapes(s, i))
    out["model.norm.weight"] = [s.hidden]
    if not s.tie:
        out["lm_head.weight"] = [s.vocab, s.hidden]
    for k in range(s.mtp_layers):
        L = s.layers + k
        p = f"model.layers.{L}."
        out[p + "embed_tokens.weight"] = [s.vocab, s.hidden]
        out[p + "enorm.weight"] = [s.hidden]
        out[p + "hnorm.weight"] = [s.hidden]
        out[p + "eh_proj.weight"] = [s.hidden, 2 * s.hidden]
        out.update(_layer_shapes(s, L))
        out[p + "shared_head.norm.weight"] = [s.hidden]
        out[p + "shared_head.head.weight"] = [s.vocab, s.hidden]
    return out


def _mlp_shapes(prefix, hidden, inter, bias):
    out = {}
    for n, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]), ("down_proj", [hidden, inter])):
        out[f"{prefix}{n}.weight"] = shape
        if bias:
            out[f"{prefix}{n}.bias"] = [shape[0]]
    return out


def _layer_shapes(s, i):
    p = f"model.layers.{i}."
    a = p + "self_attn."
    out = {p + "input_layernorm.weight": [s.hidden]}
    if s.mla:
        qk = s.qk_nope + s.qk_rope
        if s.q_lora_rank:
            out[a + "q_a_proj.weight"] = [s.q_lora_rank, s.hidden]
            if s.mla_bias:
                out[a + "q_a_proj.bias"] = [s.q_lora_rank]
            out[a + "q_a_layernorm.weight"] = [s.q_lora_rank]
            out[a + "q_b_proj.weight"] = [s.heads * qk, s.q_lora_rank]
        else:
            out[a + "q_proj.weight"] = [s.heads * qk, s.hidden]
        out[a + "kv_a_proj_with_mqa.weight"] = [s.kv_lora_rank + s.qk_rope, s.hidden]
        if s.mla_bias:
            out[a + "kv_a_proj_with_mqa.bias"] = [s.kv_lora_rank + s.qk_rope]
        out[a + "kv_a_layernorm.weight"] = [s.kv_lora_rank]
        out[a + "kv_b_proj.weight"] = [s.heads * (s.qk_nope + s.v_head), s.kv_lora_rank]
        out[a + "o_proj.weight"] = [s.hidden, s.heads * s.v_head]
        if s.mla_bias:
            out[a + "o_proj.bias"] = [s.hidden]
    else:
        d = s.head_dim
        for n, rows in (("q_proj", s.heads * d), ("k_proj", s.kv_heads * d), ("v_proj", s.kv_heads * d)):
            out[a + n + ".weight"] = [rows, s.hidden]
            if s.qkv_bias:
                out[a + n + ".bias"] = [rows]
        out[a + "o_proj.weight"] = [s.hidden, s.heads * d]
        if s.o_bias:
            out[a + "o_proj.bias"] = [s.hidden]
        if s.qk_norm:
            out[a + "q_norm.weight"] = [d]
            out[a + "k_norm.weight"] = [d]
    out[p + "post_attention_layernorm.weight"] = [s.hidden]
    m = p + "mlp."
    if s.is_moe_layer(i):
        e, inter = s.moe["experts"], s.moe["inter"]
        out[m + "gate.weight"] = [e, s.hidden]
        if s.moe["kind"] == "sigmoid":
            out[m + "gate.e_score_correction_bias"] = [e]
        for j in range(e):
            out.update(_mlp_shapes(f"{m}experts.{j}.", s.hidden, inter, False))
        if s.moe["shared"]:
            out.update(_mlp_shapes(m + "shared_experts.", s.hidden, inter * s.moe["shared"], False))
    else:
        out.update(_mlp_shapes(m, s.hidden, s.intermediate, s.mlp_bias))
    return out


# ----------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_half(x, cos, sin):
    """Rotates pairs (x[i], x[i + d/2]) by angle[i] (HF's rotate_half layout)."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def rope_interleaved(x, cos, sin):
    """Rotates pairs (x[2i], x[2i + 1]) by angle[i] (DeepSeek's complex layout); the
    result keeps the interleaved layout."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


def first_argmax(v):
    """Index of the largest entry of a 1-D tensor, the lowest index on exact ties."""
    m = v.max()
    return int(torch.nonzero(v == m)[0, 0])


class Cache:
    """Per-layer KV cache: standard attention keeps k (after norm and RoPE) and v per
    KV head; unabsorbed MLA keeps the expanded per-head k and v; absorbed MLA keeps
    only c_kv (after kv_a_layernorm) and k_pe (after RoPE)."""

    def __init__(self):
        self.layers = {}
        self.length = 0

    def extend(self, layer, **parts):
        slot = self.layers.setdefault(layer, {})
        for name, t in parts.items():
            slot[name] = t if name not in slot else torch.cat((slot[name], t), dim=-2)
        return slot


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class Model:
    def __init__(self, folder=None, dtype=torch.float32, cfg=None, tensors=None, config_overrides=None):
        if folder is not None:
            cfg, tensors = load_folder(folder)
        cfg = dict(cfg)
        if config_overrides:
            cfg.update(config_overrides)
        self.cfg = cfg
        self.spec = Spec(cfg)
        self.dtype = dtype
        want = weight_shapes(cfg)
        have = {n: list(t.shape) for n, t in tensors.items()}
        if set(want) != set(have):
            extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
            _fail(f"weights do not match config: unexpected {extra[:6]}, missing {missing[:6]}")
        for n in want:
            if want[n] != have[n]:
                _fail(f"{n}: shape {have[n]} in the file, {want[n]} from config.json")
        self.w = {n: t.to(dtype) for n, t in tensors.items()}
        self.margins = []     # (what, margin) of every routing decision made
        self.record_margins = True

    # -- parameters -----------------------------------------------------------
    def trainable(self):
        """Names gradients are taken for: every weight except the router's score-correction
        bias, a buffer in HF (its effect is through the top-k choice only)."""
        return [n for n in self.w if not n.endswith("e_score_correction_bias")]

    def lin(self, x, name):
        b = self.w.get(name + ".bias")
        return F.linear(x, self.w[name + ".weight"], b)

    def cos_sin(self, positions):
        """cos, sin [T, rope_dim/2] of the given positions (angles in float64)."""
        r = self.spec.rope
        ang = positions.to(torch.float64)[:, None] * r["inv_freq"][None, :]
        f = r["attention_factor"]
        return (ang.cos() * f).to(self.dtype), (ang.sin() * f).to(self.dtype)

    def rope(self, x, cs):
        cos, sin = cs
        if self.spec.rope_interleave:
            return rope_interleaved(x, cos, sin)
        return rope_half(x, cos, sin)

    # -- attention -------------------------------------------------------------
    def _attend(self, q, k, v, past):
        """softmax(q k^T * scale, causal) v; query j sits at cache index past + j."""
        T, S = q.shape[-2], k.shape[-2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.spec.scale
        qi = torch.arange(T)[:, None] + past
        kj = torch.arange(S)[None, :]
        scores = scores.masked_fill(kj > qi, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def attention(self, i, x, cs, cache, past, absorbed):
        if self.spec.mla:
            return self.mla_attention(i, x, cs, cache, past, absorbed)
        s = self.spec
        B, T, _ = x.shape
        a = f"model.layers.{i}.self_attn."
        q = self.lin(x, a + "q_proj").view(B, T, s.heads, s.head_dim)
        k = self.lin(x, a + "k_proj").view(B, T, s.kv_heads, s.head_dim)
        v = self.lin(x, a + "v_proj").view(B, T, s.kv_heads, s.head_dim)
        if s.qk_norm:  # per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, self.w[a + "q_norm.weight"], s.eps)
            k = rms_norm(k, self.w[a + "k_norm.weight"], s.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = self.rope(q, cs), self.rope(k, cs)
        if cache is not None:
            slot = cache.extend(i, k=k, v=v)
            k, v = slot["k"], slot["v"]
        rep = s.heads // s.kv_heads   # query head h reads KV head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = self._attend(q, k, v, past)
        return self.lin(o.transpose(1, 2).reshape(B, T, s.heads * s.head_dim), a + "o_proj")

    def mla_attention(self, i, x, cs, cache, past, absorbed):
        s = self.spec
        B, T, _ = x.shape
        H, dn, dr, dv, r = s.heads, s.qk_nope, s.qk_rope, s.v_head, s.kv_lora_rank
        a = f"model.layers.{i}.self_attn."
        if s.q_lora_rank:
            cq = rms_norm(self.lin(x, a + "q_a_proj"), self.w[a + "q_a_layernorm.weight"], MLA_LOWRANK_EPS)
            q = self.lin(cq, a + "q_b_proj")
        else:
            q = self.lin(x, a + "q_proj")
        q = q.view(B, T, H, dn + dr).transpose(1, 2)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        kv = self.lin(x, a + "kv_a_proj_with_mqa")
        c = rms_norm(kv[..., :r], self.w[a + "kv_a_layernorm.weight"], MLA_LOWRANK_EPS)   # [B, T, r]
        k_pe = self.rope(kv[..., r:].unsqueeze(1), cs)                                     # [B, 1, T, dr]
        q_pe = self.rope(q_pe, cs)
        wkv = self.w[a + "kv_b_proj.weight"].view(H, dn + dv, r)
        if not absorbed:
            kvh = torch.einsum("btr,hjr->bhtj", c, wkv)
            k = torch.cat((kvh[..., :dn], k_pe.expand(B, H, T, dr)), dim=-1)
            v = kvh[..., dn:]
            if cache is not None:
                slot = cache.extend(i, k=k, v=v)
                k, v = slot["k"], slot["v"]
            o = self._attend(torch.cat((q_nope, q_pe), dim=-1), k, v, past)
        else:
            if cache is None:
                cache_c, cache_pe = c, k_pe[:, 0]
            else:
                slot = cache.extend(i, c=c, k_pe=k_pe[:, 0])
                cache_c, cache_pe = slot["c"], slot["k_pe"]
            w_uk, w_uv = wkv[:, :dn, :], wkv[:, dn:, :]
            q_abs = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)       # W_UK folded into q
            scores = (torch.einsum("bhtr,bsr->bhts", q_abs, cache_c)
                      + torch.einsum("bhtd,bsd->bhts", q_pe, cache_pe)) * s.scale
            S = cache_c.shape[1]
            mask = torch.arange(S)[None, :] > (torch.arange(T)[:, None] + past)
            p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            o_c = torch.einsum("bhts,bsr->bhtr", p, cache_c)
            o = torch.einsum("bhtr,hvr->bhtv", o_c, w_uv)               # W_UV after attention
        return self.lin(o.transpose(1, 2).reshape(B, T, H * dv), a + "o_proj")

    # -- feed-forward ------------------------------------------------------------
    def mlp(self, x, prefix):
        return self.lin(F.silu(self.lin(x, prefix + "gate_proj")) * self.lin(x, prefix + "up_proj"),
                        prefix + "down_proj")

    def _note(self, what, margin):
        if self.record_margins:
            self.margins.append((what, float(margin)))

    def route_softmax(self, logits, i):
        """Qwen3-MoE: softmax over all experts, top-k, optional renormalisation."""
        m = self.spec.moe
        k = m["top_k"]
        probs = torch.softmax(logits, dim=-1)
        top, idx = probs.topk(k, dim=-1)
        if probs.shape[-1] > k:
            srt = probs.sort(dim=-1, descending=True).values
            self._note(f"layer {i} top-{k}", (srt[:, k - 1] - srt[:, k]).min())
        if m["norm"]:
            top = top / top.sum(dim=-1, keepdim=True)
        return idx, top

    def route_sigmoid(self, logits, i):
        """DeepSeek-V3: sigmoid scores; choice on scores + e_score_correction_bias limited
        to the topk_group groups with the largest sum of their two best biased scores;
        weights are the unbiased scores of the chosen experts, renormalised when
        norm_topk_prob, times routed_scaling_factor."""
        m = self.spec.moe
        k, G, tg = m["top_k"], m["n_group"], m["topk_group"]
        N, E = logits.shape
        scores = torch.sigmoid(logits)
        biased = scores + self.w[f"model.layers.{i}.mlp.gate.e_score_correction_bias"]
        grp = biased.view(N, G, E // G).topk(2, dim=-1).values.sum(dim=-1)          # [N, G]
        gsel = grp.topk(tg, dim=-1).indices
        if G > tg:
            gs = grp.sort(dim=-1, descending=True).values
            self._note(f"layer {i} group top-{tg}", (gs[:, tg - 1] - gs[:, tg]).min())
        gmask = torch.zeros(N, G, dtype=torch.bool)
        gmask[torch.arange(N)[:, None], gsel] = True
        eligible = gmask[:, :, None].expand(N, G, E // G).reshape(N, E)
        cand = biased.masked_fill(~eligible, float("-inf"))
        idx = cand.topk(k, dim=-1).indices
        srt = cand.sort(dim=-1, descending=True).values
        if tg * (E // G) > k:
            self._note(f"layer {i} expert top-{k}", (srt[:, k - 1] - srt[:, k]).min())
        # HF fills ineligible experts with 0 instead of -inf; the two agree while the
        # k-th chosen biased score stays above 0, so that is part of the margin too.
        self._note(f"layer {i} k-th biased score above 0", srt[:, k - 1].min())
        wts = scores.gather(1, idx)
        if m["norm"]:
            wts = wts / (wts.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, wts * m["scale"]

    def moe(self, x, i):
        m = self.spec.moe
        B, T, Hd = x.shape
        xf = x.reshape(B * T, Hd)
        p = f"model.layers.{i}.mlp."
        logits = F.linear(xf, self.w[p + "gate.weight"])
        if m["kind"] == "softmax":
            idx, wts = self.route_softmax(logits, i)
        else:
            idx, wts = self.route_sigmoid(logits, i)
        out = torch.zeros_like(xf)
        for e in range(m["experts"]):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            y = self.mlp(xf[rows], f"{p}experts.{e}.")
            out = out.index_add(0, rows, y * wts[rows, slot][:, None])
        if m["shared"]:
            out = out + self.mlp(xf, p + "shared_experts.")
        return out.view(B, T, Hd)

    # -- decoder -----------------------------------------------------------------
    def layer(self, i, h, cs, cache, past, absorbed):
        p = f"model.layers.{i}."
        x = rms_norm(h, self.w[p + "input_layernorm.weight"], self.spec.eps)
        h = h + self.attention(i, x, cs, cache, past, absorbed)
        x = rms_norm(h, self.w[p + "post_attention_layernorm.weight"], self.spec.eps)
        y = self.moe(x, i) if self.spec.is_moe_layer(i) else self.mlp(x, p + "mlp.")
        return h + y

    def forward(self, tokens, positions=None, cache=None, absorbed=False):
        """(logits [B,T,V], final hidden after model.norm [B,T,H]); with a cache the
        tokens continue the cached sequence."""
        s = self.spec
        B, T = tokens.shape
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + T)
        cs = self.cos_sin(positions)
        h = self.w["model.embed_tokens.weight"][tokens]
        for i in range(s.layers):
            h = self.layer(i, h, cs, cache, past, absorbed)
        if cache is not None:
            cache.length += T
        hn = rms_norm(h, self.w["model.norm.weight"], s.eps)
        head = self.w["model.embed_tokens.weight"] if s.tie else self.w["lm_head.weight"]
        return F.linear(hn, head), hn

    def mtp(self, tokens, hidden, absorbed=False):
        """Logits of each MTP depth k = 1..D: row i combines the depth-(k-1) state of
        position i with the embedding of token i+k and predicts token i+k+1.
        eh_proj input = concat(enorm(Emb_L(t_{i+k})), hnorm(h_i)) (embedding first);
        depth 1 takes h = the main model's output after model.norm."""
        s = self.spec
        outs = []
        h = hidden
        T = tokens.shape[1]
        for k in range(1, s.mtp_layers + 1):
            L = s.layers + k - 1
            p = f"model.layers.{L}."
            n = T - k
            if n <= 0:
                break
            e = self.w[p + "embed_tokens.weight"][tokens[:, k:]]
            x = torch.cat((rms_norm(e, self.w[p + "enorm.weight"], s.eps),
                           rms_norm(h[:, :n], self.w[p + "hnorm.weight"], s.eps)), dim=-1)
            x = F.linear(x, self.w[p + "eh_proj.weight"])
            x = self.layer(L, x, self.cos_sin(torch.arange(n)), None, 0, absorbed)
            logits = F.linear(rms_norm(x, self.w[p + "shared_head.norm.weight"], s.eps),
                              self.w[p + "shared_head.head.weight"])
            outs.append(logits)
            h = x
        return outs

    # -- losses, generation --------------------------------------------------------
    @staticmethod
    def next_token_loss(logits, tokens, shift=1):
        """Mean cross-entropy of logits[:, j] against tokens[:, j + shift], every valid j."""
        n = tokens.shape[1] - shift
        lg = logits[:, :n]
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tokens[:, shift:shift + n].reshape(-1))

    def losses(self, tokens, absorbed=False):
        logits, hidden = self.forward(tokens, absorbed=absorbed)
        out = {"logits": logits, "hidden": hidden, "loss": self.next_token_loss(logits, tokens)}
        if self.spec.mtp_layers:
            mtp = self.mtp(tokens, hidden, absorbed=absorbed)
            out["mtp_logits"] = mtp
            per_depth = [self.next_token_loss(lg, tokens, shift=k + 2) for k, lg in enumerate(mtp)
                         if tokens.shape[1] - (k + 2) > 0]
            out["mtp_losses"] = per_depth
            if per_depth:
                out["mtp_loss"] = sum(per_depth) / len(per_depth)
        return out

    def generate(self, prompt, n, absorbed=False):
        """Greedy decoding of n tokens after `prompt` (a list of ids) with a KV cache.
        Returns (ids, logits [n, V] each id was chosen from, top1 - top2 margins)."""
        cache = Cache()
        logits, _ = self.forward(torch.tensor([prompt]), cache=cache, absorbed=absorbed)
        ids, rows, margins = [], [], []
        for step in range(n):
            last = logits[0, -1]
            t = first_argmax(last)
            top2 = last.topk(2).values
            ids.append(t)
            rows.append(last)
            margins.append(float(top2[0] - top2[1]))
            if step + 1 < n:
                logits, _ = self.forward(torch.tensor([[t]]), cache=cache, absorbed=absorbed)
        return ids, torch.stack(rows), margins

    def min_margin(self):
        return min((m for _, m in self.margins), default=float("inf"))


def grads_of(model, loss, names):
    """{name: d loss / d weight} for `names` (weights must require grad)."""
    params = [model.w[n] for n in names]
    gs = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g) for n, p, g in zip(names, params, gs)}


def mla_check(model, tokens, logits, tol=1e-5):
    """max |absorbed - unabsorbed| logits (full prefill and one-token decode); raises
    above tol * max(1, max |logits|)."""
    la, _ = model.forward(tokens, absorbed=True)
    diff = float((la - logits).abs().max())
    cu, ca = Cache(), Cache()
    T = tokens.shape[1]
    cut = max(1, T // 2)
    model.forward(tokens[:, :cut], cache=cu)
    model.forward(tokens[:, :cut], cache=ca, absorbed=True)
    for j in range(cut, T):
        lu, _ = model.forward(tokens[:, j:j + 1], cache=cu)
        la, _ = model.forward(tokens[:, j:j + 1], cache=ca, absorbed=True)
        diff = max(diff, float((lu - la).abs().max()))
    bound = tol * max(1.0, float(logits.abs().max()))
    if diff > bound:
        _fail(f"MLA absorbed and unabsorbed paths differ by {diff:.3e} (> {bound:.3e})")
    return diff


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def default_tokens(vocab, seed, batch=DEFAULT_BATCH, seq=DEFAULT_SEQ):
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, vocab, (batch, seq), generator=g)


def read_tokens(arg, vocab, batch, seq):
    """A seed (a non-negative integer), a .safetensors file with I32/I64 `tokens` [B, T], or a
    .json file holding a list of equal-length lists of ids."""
    if arg.isdigit():
        return default_tokens(vocab, int(arg), batch, seq)
    if arg.endswith(".json"):
        with open(arg) as f:
            toks = torch.tensor(json.load(f), dtype=torch.int64)
    else:
        t, _ = read_safetensors(arg)
        toks = t["tokens"].to(torch.int64)
    if toks.dim() != 2:
        _fail("tokens must be [B, T]")
    if int(toks.min()) < 0 or int(toks.max()) >= vocab:
        _fail("token id outside the vocabulary")
    return toks


def run(args):
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    dtype = torch.float64 if args.float64 else torch.float32
    model = Model(args.model, dtype=dtype)
    s = model.spec
    tokens = read_tokens(args.tokens, s.vocab, args.batch, args.seq)
    absorbed = args.mla == "absorbed"
    if absorbed and not s.mla:
        _fail("--mla absorbed needs a DeepSeek-V3 (MLA) model")
    if args.grads:
        for n in model.trainable():
            model.w[n].requires_grad_(True)
    res = model.losses(tokens, absorbed=absorbed)
    out = {"tokens": tokens.to(torch.int32)}
    f32 = lambda t: t.detach().to(torch.float32).contiguous()  # noqa: E731
    out["logits"] = f32(res["logits"])
    out["loss"] = f32(res["loss"]).reshape(1)
    out["final_hidden"] = f32(res["hidden"])
    for k, lg in enumerate(res.get("mtp_logits", [])):
        out["mtp_logits" if k == 0 else f"mtp_logits_d{k + 1}"] = f32(lg)
    if "mtp_loss" in res:
        out["mtp_loss"] = f32(res["mtp_loss"]).reshape(1)
    if args.grads:
        names = model.trainable()
        for n, g in grads_of(model, res["loss"], names).items():
            out["grad." + n] = f32(g)
        if "mtp_loss" in res:
            for n, g in grads_of(model, res["mtp_loss"], names).items():
                out["mtp_grad." + n] = f32(g)
        for n in names:
            model.w[n].requires_grad_(False)
    meta = {"family": s.family, "compute_dtype": str(dtype).replace("torch.", ""),
            "mla_path": args.mla if s.mla else "none"}
    with torch.no_grad():
        if s.mla:
            diff = mla_check(model, tokens, res["logits"].detach())
            out["mla_max_abs_diff"] = torch.tensor([diff], dtype=torch.float32)
        if args.greedy:
            prompt = [int(v) for v in args.prompt.split(",")] if args.prompt else \
                tokens[0, :DEFAULT_PROMPT_LEN].tolist()
            ids, rows, margins = model.generate(prompt, args.greedy, absorbed=absorbed)
            if s.mla:
                ids_other, _, _ = model.generate(prompt, args.greedy, absorbed=not absorbed)
                if ids_other != ids:
                    _fail(f"greedy ids differ between MLA paths: {ids} vs {ids_other}")
            out["greedy_prompt"] = torch.tensor(prompt, dtype=torch.int32)
            out["greedy_ids"] = torch.tensor(ids, dtype=torch.int32)
            out["greedy_logits"] = f32(rows)
            out["greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
            if min(margins) < ROUTER_MARGIN_MIN:
                print(f"[hf_reference] warning: greedy top1-top2 logit margin {min(margins):.2e} "
                      f"< {ROUTER_MARGIN_MIN}: argmax parity may be flaky", file=sys.stderr)
    if s.moe is not None:
        mm = model.min_margin()
        out["router_min_margin"] = torch.tensor([mm], dtype=torch.float32)
        meta["router_min_margin"] = repr(mm)
        if mm < ROUTER_MARGIN_MIN:
            print(f"[hf_reference] warning: router margin {mm:.2e} < {ROUTER_MARGIN_MIN}: "
                  "expert choice is near a tie on this batch", file=sys.stderr)
    write_safetensors(args.out, out, meta)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--tokens", default="0", help="seed (integer), tokens .safetensors, or .json")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="B when --tokens is a seed")
    ap.add_argument("--seq", type=int, default=DEFAULT_SEQ, help="T when --tokens is a seed")
    ap.add_argument("--out", required=True, help="output .safetensors")
    ap.add_argument("--greedy", type=int, default=0, help="greedy-generate N tokens")
    ap.add_argument("--prompt", default="", help="comma-separated prompt ids (default tokens[0, :4])")
    ap.add_argument("--grads", action="store_true", help="write grad.<weight> (and mtp_grad.<weight>)")
    ap.add_argument("--float64", action="store_true", help="compute in float64 (outputs stay F32)")
    ap.add_argument("--mla", choices=("unabsorbed", "absorbed"), default="unabsorbed",
                    help="DeepSeek-V3 attention path of the written logits and greedy ids")
    args = ap.parse_args(argv)
    try:
        run(args)
    except ReferenceError as e:
        print(f"[hf_reference] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
