#!/usr/bin/python3
"""Checks of hf_reference.py that cannot share a bug with it (the ctest
hf_reference_selfcheck): identities between families and paths, hand-computed
routers and RoPE tables, float64 and finite differences, file-format checks and
the CLI contract. Every check asserts; the script exits non-zero on the first
failure and prints one line per check with its time.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "golden"))
import hf_reference as ref  # noqa: E402
import make_tiny  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

TMP = tempfile.mkdtemp(prefix="hf_ref_check_")
TOKENS = ref.default_tokens(256, 0)
_built = {}


class CheckFailed(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def maxdiff(a, b):
    return float((a - b).abs().max())


def tiny_cfg(family, *argv):
    args = make_tiny.parser().parse_args(["--family", family, "--out", "-"] + list(argv))
    return make_tiny.make_config(args)


def folder(family, *argv, shards=1, seed=0, mtp_distinct=False):
    """A built folder (cached by its arguments)."""
    key = (family, argv, shards, seed, mtp_distinct)
    if key not in _built:
        out = os.path.join(TMP, f"m{len(_built)}_{family}")
        make_tiny.build(tiny_cfg(family, *argv), out, seed, shards, mtp_distinct)
        _built[key] = out
    return _built[key]


def model(family, *argv, dtype=torch.float32, **kw):
    return ref.Model(folder(family, *argv, **kw), dtype=dtype)


def m64(cfg, tensors):
    """A float64 model: identities below hold to rounding of float64 (1e-9)."""
    return ref.Model(cfg=cfg, tensors=tensors, dtype=torch.float64)


def logits_of(m, tokens=TOKENS, **kw):
    with torch.no_grad():
        return m.forward(tokens, **kw)[0]


FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")


# ----------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------

def check_safetensors_dtypes():
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(3))
    p = os.path.join(TMP, "dt.safetensors")
    write_safetensors(p, {"b": x.to(torch.bfloat16), "h": x.half(), "f": x})
    t, _ = read_safetensors(p)
    expect(t["b"].dtype == torch.bfloat16 and torch.equal(t["b"], x.to(torch.bfloat16)), "BF16 round trip")
    expect(t["h"].dtype == torch.float16 and torch.equal(t["h"], x.half()), "F16 round trip")
    with open(p, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    expect(hdr["b"]["dtype"] == "BF16" and hdr["h"]["dtype"] == "F16", "header dtype names")
    # BF16 bytes are the upper halves of the float32 bit patterns of the rounded values.
    b0 = raw[8 + n + hdr["b"]["data_offsets"][0]:][:2]
    f32 = x.to(torch.bfloat16).float()[0, 0].numpy().tobytes()
    expect(b0 == f32[2:4], "BF16 bytes are the high 16 bits of the float32 pattern (little-endian)")
    for dt, name in (("bf16", "bfloat16"), ("fp16", "float16")):
        d = folder("deepseek_v3", "--dtype", dt)
        cfg, tens = ref.load_folder(d)
        expect(cfg["torch_dtype"] == name, f"torch_dtype {cfg['torch_dtype']} for --dtype {dt}")
        ref32 = make_tiny.make_weights(cfg, 0, 0)
        for k, v in tens.items():
            if k.endswith("e_score_correction_bias"):
                expect(v.dtype == torch.float32, f"{k} must stay F32")
            else:
                expect(v.dtype == make_tiny.DTYPES[dt][0], f"{k} stored as {v.dtype}")
                # (router tensors may have been redrawn for the margin)
                expect(k.endswith("mlp.gate.weight") or torch.equal(v, ref32[k].to(v.dtype)),
                       f"{k}: stored values are not the rounded draw")


def check_sharding():
    one = folder("deepseek_v3")
    three = folder("deepseek_v3", shards=3)
    _, a = ref.load_folder(one)
    _, b = ref.load_folder(three)
    expect(set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), "sharded tensors differ from one file")
    with open(os.path.join(three, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    expect(files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)], f"shard names {files}")
    expect(not os.path.exists(os.path.join(three, "model.safetensors")), "a sharded folder has no model.safetensors")
    total = sum(t.numel() * t.element_size() for t in b.values())
    expect(index["metadata"]["total_size"] == total, "metadata.total_size is the tensor bytes")
    for fn in files:
        t, meta = read_safetensors(os.path.join(three, fn))
        expect(meta == {"format": "pt"}, f"{fn}: metadata {meta}")
        expect(all(index["weight_map"][k] == fn for k in t), f"{fn} holds tensors mapped elsewhere")
    # A wrong total_size is refused.
    bad = os.path.join(TMP, "bad_index")
    os.makedirs(bad, exist_ok=True)
    for fn in files + ["config.json"]:
        with open(os.path.join(three, fn), "rb") as s, open(os.path.join(bad, fn), "wb") as d:
            d.write(s.read())
    index["metadata"]["total_size"] += 2
    with open(os.path.join(bad, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    try:
        ref.load_folder(bad)
        raise CheckFailed("a wrong total_size was accepted")
    except ref.ReferenceError:
        pass


def check_config_files():
    need = {
        "llama": ["head_dim", "attention_bias", "mlp_bias", "rope_theta", "rope_scaling", "pretraining_tp",
                  "tie_word_embeddings", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings"],
        "qwen2": ["use_sliding_window", "sliding_window", "max_window_layers", "tie_word_embeddings", "rope_theta"],
        "qwen3": ["head_dim", "attention_bias", "use_sliding_window", "max_window_layers"],
        "qwen3_moe": ["head_dim", "decoder_sparse_step", "moe_intermediate_size", "num_experts_per_tok",
                      "num_experts", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef",
                      "mlp_only_layers"],
        "deepseek_v3": ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "n_routed_experts", "n_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
                        "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq", "norm_topk_prob",
                        "scoring_func", "topk_method", "num_nextn_predict_layers", "rope_scaling",
                        "rope_interleave"],
    }
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
    for fam in FAMILIES:
        d = folder(fam)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        expect(cfg["architectures"] == [arch[fam]] and cfg["model_type"] == fam, f"{fam}: architectures/model_type")
        missing = [k for k in need[fam] if k not in cfg]
        expect(not missing, f"{fam}: config.json lacks {missing}")
        expect(cfg["torch_dtype"] == "float32", f"{fam}: torch_dtype")
        with open(os.path.join(d, "generation_config.json")) as f:
            gen = json.load(f)
        expect(gen["bos_token_id"] == cfg["bos_token_id"] and gen["eos_token_id"] == cfg["eos_token_id"],
               f"{fam}: generation_config ids")
    q3 = tiny_cfg("qwen3")
    expect(q3["num_attention_heads"] * q3["head_dim"] != q3["hidden_size"], "qwen3 tiny must have H*hd != hidden")
    ll = tiny_cfg("llama", "--rope-scaling", "llama3")["rope_scaling"]
    expect(set(ll) == {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                       "original_max_position_embeddings"}, f"llama3 rope_scaling keys {ll}")
    ya = tiny_cfg("llama", "--rope-scaling", "yarn")
    expect(ya["max_position_embeddings"] == ya["rope_scaling"]["factor"] *
           ya["rope_scaling"]["original_max_position_embeddings"], "yarn: factor = max_pos / original")


def check_weight_names():
    """Names and shapes written by hand from HF's module trees."""
    def names(family, *argv):
        return ref.weight_shapes(tiny_cfg(family, *argv))

    ll = names("llama")
    expect("lm_head.weight" in ll and ll["lm_head.weight"] == [256, 64], "llama untied lm_head")
    expect(ll["model.layers.1.self_attn.k_proj.weight"] == [32, 64], "llama GQA k_proj [kv*hd, hidden]")
    expect(not any(k.endswith(".bias") for k in ll), "llama: no biases by default")
    expect(len(ll) == 1 + 2 * 9 + 2, f"llama tensor count {len(ll)}")
    llb = names("llama", "--attention-bias", "--mlp-bias", "--tie")
    expect("lm_head.weight" not in llb, "tied llama has no lm_head.weight")
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        expect(f"model.layers.0.self_attn.{n}.bias" in llb, f"llama attention_bias: {n}.bias")
    for n in ("gate_proj", "up_proj", "down_proj"):
        expect(f"model.layers.0.mlp.{n}.bias" in llb, f"llama mlp_bias: {n}.bias")
    q2 = names("qwen2")
    expect("lm_head.weight" not in q2, "qwen2 tiny is tied")
    expect(q2["model.layers.0.self_attn.v_proj.bias"] == [32], "qwen2 v bias")
    expect("model.layers.0.self_attn.o_proj.bias" not in q2, "qwen2 has no o_proj bias")
    q3 = names("qwen3")
    expect(q3["model.layers.0.self_attn.q_proj.weight"] == [128, 64], "qwen3 q_proj [H*hd, hidden]")
    expect(q3["model.layers.0.self_attn.o_proj.weight"] == [64, 128], "qwen3 o_proj [hidden, H*hd]")
    expect(q3["model.layers.0.self_attn.q_norm.weight"] == [32] and
           q3["model.layers.0.self_attn.k_norm.weight"] == [32], "qwen3 q_norm/k_norm [head_dim]")
    qm = names("qwen3_moe")
    expect(qm["model.layers.1.mlp.gate_proj.weight"] == [128, 64], "qwen3_moe mlp_only layer 1 is dense")
    expect(qm["model.layers.0.mlp.gate.weight"] == [8, 64], "qwen3_moe router [E, hidden]")
    expect(qm["model.layers.2.mlp.experts.7.down_proj.weight"] == [64, 32], "qwen3_moe expert down_proj")
    expect(not any("shared_expert" in k or "e_score" in k for k in qm), "qwen3_moe: no shared experts/bias")
    qs = names("qwen3_moe", "--mlp-only-layers", "", "--decoder-sparse-step", "2")
    expect("model.layers.1.mlp.gate.weight" in qs and "model.layers.0.mlp.gate_proj.weight" in qs and
           "model.layers.2.mlp.gate_proj.weight" in qs, "decoder_sparse_step 2: layers (i+1)%2==0 sparse")
    ds = names("deepseek_v3")
    expect(len(ds) == 207, f"deepseek tensor count {len(ds)} (hand count 207)")
    a = "model.layers.1.self_attn."
    want = {a + "q_a_proj.weight": [32, 64], a + "q_a_layernorm.weight": [32], a + "q_b_proj.weight": [96, 32],
            a + "kv_a_proj_with_mqa.weight": [40, 64], a + "kv_a_layernorm.weight": [32],
            a + "kv_b_proj.weight": [112, 32], a + "o_proj.weight": [64, 48],
            "model.layers.1.mlp.gate.weight": [16, 64], "model.layers.1.mlp.gate.e_score_correction_bias": [16],
            "model.layers.1.mlp.experts.15.gate_proj.weight": [32, 64],
            "model.layers.1.mlp.shared_experts.down_proj.weight": [64, 32],
            "model.layers.0.mlp.up_proj.weight": [128, 64],
            "model.layers.3.embed_tokens.weight": [256, 64], "model.layers.3.enorm.weight": [64],
            "model.layers.3.hnorm.weight": [64], "model.layers.3.eh_proj.weight": [64, 128],
            "model.layers.3.shared_head.norm.weight": [64], "model.layers.3.shared_head.head.weight": [256, 64],
            "model.layers.3.self_attn.kv_b_proj.weight": [112, 32],
            "model.layers.3.mlp.experts.0.up_proj.weight": [32, 64]}
    for k, v in want.items():
        expect(ds.get(k) == v, f"deepseek {k}: {ds.get(k)} != {v}")
    expect("model.layers.1.self_attn.q_proj.weight" not in ds, "q_lora_rank set: no q_proj")
    dn = names("deepseek_v3", "--q-lora-rank", "0", "--shared-experts", "2")
    expect(dn["model.layers.1.self_attn.q_proj.weight"] == [96, 64] and
           "model.layers.1.self_attn.q_a_proj.weight" not in dn, "q_lora_rank null: q_proj only")
    expect(dn["model.layers.2.mlp.shared_experts.gate_proj.weight"] == [64, 64],
           "shared_experts intermediate = moe_intermediate_size * n_shared_experts")
    df = names("deepseek_v3", "--layers", "4", "--moe-layer-freq", "2", "--mtp", "0")
    expect("model.layers.1.mlp.gate_proj.weight" in df and "model.layers.2.mlp.gate.weight" in df and
           "model.layers.3.mlp.gate_proj.weight" in df, "moe_layer_freq 2: MoE where i >= k and i % 2 == 0")
    with open(os.path.join(folder("deepseek_v3"), "config.json")) as f:
        cfg = json.load(f)
    _, t = ref.load_folder(folder("deepseek_v3"))
    expect(torch.equal(t["model.layers.3.embed_tokens.weight"], t["model.embed_tokens.weight"]) and
           torch.equal(t["model.layers.3.shared_head.head.weight"], t["lm_head.weight"]),
           "MTP embed/head are copies of the main ones by default")
    wrong = dict(t)
    wrong["model.layers.0.mlp.up_proj.weight"] = wrong["model.layers.0.mlp.up_proj.weight"][:-1]
    try:
        ref.Model(cfg=cfg, tensors=wrong)
        raise CheckFailed("a wrong shape was accepted")
    except ref.ReferenceError:
        pass


# ----------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------

def check_rope_layouts():
    ang = torch.tensor([[0.3, 0.7]], dtype=torch.float64)
    c, s = ang.cos(), ang.sin()
    e = torch.eye(4, dtype=torch.float64)
    h = ref.rope_half(e, c, s)          # row j = image of unit vector j
    expect(abs(h[0, 0] - math.cos(0.3)) < 1e-15 and abs(h[0, 2] - math.sin(0.3)) < 1e-15,
           "half layout: e0 -> cos at 0, sin at d/2")
    expect(abs(h[2, 0] + math.sin(0.3)) < 1e-15 and abs(h[2, 2] - math.cos(0.3)) < 1e-15,
           "half layout: e_{d/2} -> -sin at 0, cos at d/2")
    expect(abs(h[1, 1] - math.cos(0.7)) < 1e-15 and abs(h[1, 3] - math.sin(0.7)) < 1e-15, "half layout pair 1")
    r = ref.rope_interleaved(e, c, s)
    expect(abs(r[0, 0] - math.cos(0.3)) < 1e-15 and abs(r[0, 1] - math.sin(0.3)) < 1e-15,
           "interleaved: e0 -> cos at 0, sin at 1")
    expect(abs(r[1, 0] + math.sin(0.3)) < 1e-15 and abs(r[1, 1] - math.cos(0.3)) < 1e-15,
           "interleaved: e1 -> -sin at 0, cos at 1")
    expect(abs(r[2, 2] - math.cos(0.7)) < 1e-15 and abs(r[2, 3] - math.sin(0.7)) < 1e-15, "interleaved pair 1")
    sp = ref.Spec(tiny_cfg("llama"))
    inv = sp.rope["inv_freq"]
    expect(inv.numel() == 8 and abs(float(inv[1]) - 10000 ** (-2 / 16)) < 1e-15, "default inv_freq theta^(-2i/d)")
    # HF's interleaved form (de-interleave, then rotate_half) gives the same scores.
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(3, 8, generator=g, dtype=torch.float64)
    a = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64) * torch.arange(3.0, dtype=torch.float64)[:, None]
    perm = torch.cat((torch.arange(0, 8, 2), torch.arange(1, 8, 2)))
    hf_q, hf_k = ref.rope_half(q[:, perm], a.cos(), a.sin()), ref.rope_half(k[:, perm], a.cos(), a.sin())
    mine = ref.rope_interleaved(q, a.cos(), a.sin()) @ ref.rope_interleaved(k, a.cos(), a.sin()).T
    expect(maxdiff(mine, hf_q @ hf_k.T) < 1e-12, "interleaved RoPE scores != HF de-interleave + rotate_half")


def check_rope_tables():
    # YaRN, llama tiny: dim 16, theta 1e4, factor 4, original 64, beta 32/1.
    # Hand: low = floor(16 ln(64/(64 pi)) / (2 ln 1e4)) = floor(-0.994) -> 0;
    #       high = ceil(16 ln(64/(2 pi)) / (2 ln 1e4)) = ceil(2.016) = 3;
    # ramp_i = clamp(i/3); inv_i = 10^(-i/2) * (ramp_i/4 + 1 - ramp_i).
    sp = ref.Spec(tiny_cfg("llama", "--rope-scaling", "yarn"))
    want = [1.0, 10 ** -0.5 * 0.75, 0.1 * 0.5] + [10 ** (-i / 2) / 4 for i in range(3, 8)]
    got = sp.rope["inv_freq"].tolist()
    expect(all(abs(g - w) < 1e-15 * max(1, w) for g, w in zip(got, want)), f"llama yarn inv_freq {got}")
    expect(abs(sp.rope["attention_factor"] - (1 + 0.1 * math.log(4))) < 1e-15, "yarn default attention_factor")
    expect(abs(sp.scale - 16 ** -0.5) < 1e-15, "llama softmax scale ignores mscale")
    spa = ref.Spec(tiny_cfg("llama", "--rope-scaling", "yarn", "--yarn-attention-factor", "0.5"))
    expect(spa.rope["attention_factor"] == 0.5, "explicit attention_factor wins")
    # YaRN, deepseek tiny: dim 8 -> low 0, high 2, ramp [0, .5, 1, 1]; inv [1, .1(.5/4+.5), .01/4, .001/4].
    sd = ref.Spec(tiny_cfg("deepseek_v3"))
    want = [1.0, 0.0625, 0.0025, 0.00025]
    got = sd.rope["inv_freq"].tolist()
    expect(all(abs(g - w) < 1e-16 for g, w in zip(got, want)), f"deepseek yarn inv_freq {got}")
    expect(sd.rope["attention_factor"] == 1.0, "mscale == mscale_all_dim: cos/sin unscaled")
    m = 1 + 0.1 * 1.0 * 1.3862943611198906
    expect(abs(sd.scale - 24 ** -0.5 * m * m) < 1e-15, f"deepseek softmax scale {sd.scale}")
    s2 = ref.Spec(tiny_cfg("deepseek_v3", "--yarn-mscale", "0.5", "--yarn-mscale-all-dim", "1.0"))
    expect(abs(s2.rope["attention_factor"] - (1 + 0.05 * math.log(4)) / m) < 1e-15, "mscale/mscale_all_dim ratio")
    s3 = ref.Spec(tiny_cfg("deepseek_v3", "--set", 'rope_scaling={"type":"yarn","factor":4.0,'
                           '"original_max_position_embeddings":64}'))
    expect(abs(s3.scale - 24 ** -0.5) < 1e-15 and abs(s3.rope["attention_factor"] - m) < 1e-15,
           "yarn without mscale keys: no softmax mscale, cos/sin times 1 + 0.1 ln f")
    # Llama 3.1 scaling, llama tiny: dim 16, factor 8, low 1, high 4, original 64.
    sl = ref.Spec(tiny_cfg("llama", "--rope-scaling", "llama3"))
    base = [10 ** (-i / 2) for i in range(8)]
    got = sl.rope["inv_freq"].tolist()
    expect(got[0] == base[0], "llama3: the high-frequency dim (wavelength 2 pi < 16) is unchanged")
    for i in range(3, 8):
        expect(abs(got[i] - base[i] / 8) < 1e-18, f"llama3: low-frequency dim {i} divided by 8")
    for i in (1, 2):  # wavelengths 19.9 and 62.8: smooth = (64 / wavelength - 1) / 3
        sm = (64 / (2 * math.pi / base[i]) - 1) / 3
        w = (1 - sm) * base[i] / 8 + sm * base[i]
        expect(abs(got[i] - w) < 1e-15, f"llama3 medium dim {i}: {got[i]} != {w}")
    lin = ref.Spec(tiny_cfg("llama", "--rope-scaling", "linear")).rope["inv_freq"].tolist()
    expect(all(abs(g - b / 2) < 1e-16 for g, b in zip(lin, base)), "linear: inv_freq / factor")


def check_linear_positions():
    base = model("llama", dtype=torch.float64)
    lin = model("llama", "--rope-scaling", "linear", dtype=torch.float64)
    T = TOKENS.shape[1]
    a = logits_of(lin, positions=torch.arange(T) * 2)
    b = logits_of(base, positions=torch.arange(T))
    expect(maxdiff(a, b) < 1e-9, f"linear f=2 at 2p != unscaled at p ({maxdiff(a, b):.2e})")
    expect(maxdiff(logits_of(lin), b) > 1e-3, "linear scaling has no effect at positions p")
    l3 = model("llama", "--rope-scaling", "llama3")
    ya = model("llama", "--rope-scaling", "yarn")
    expect(maxdiff(logits_of(l3), b) > 1e-3 and maxdiff(logits_of(ya), b) > 1e-3, "llama3/yarn have no effect")
    # Identical weights across rope variants (they only change config keys).
    expect(all(torch.equal(base.w[k], l3.w[k]) for k in base.w), "rope variants must share weights")


# ----------------------------------------------------------------------------
# Paths that must agree
# ----------------------------------------------------------------------------

def _incremental(m, tokens, cut, **kw):
    cache = ref.Cache()
    with torch.no_grad():
        parts = [m.forward(tokens[:, :cut], cache=cache, **kw)[0]]
        for j in range(cut, tokens.shape[1]):
            parts.append(m.forward(tokens[:, j:j + 1], cache=cache, **kw)[0])
    return torch.cat(parts, dim=1)


def check_kv_cache():
    variants = [(f, ()) for f in FAMILIES] + [("deepseek_v3", ("--q-lora-rank", "0")),
                                              ("llama", ("--rope-scaling", "llama3"))]
    for fam, argv in variants:
        m = model(fam, *argv)
        full = logits_of(m)
        for kw in ({}, {"absorbed": True}) if m.spec.mla else ({},):
            inc = _incremental(m, TOKENS, 5, **kw)
            d = maxdiff(inc, full)
            expect(d < 1e-5 * max(1, float(full.abs().max())),
                   f"{fam}{argv} {kw}: incremental decode differs by {d:.2e}")


def check_mla_paths():
    for argv in ((), ("--q-lora-rank", "0"), ("--no-rope-interleave",), ("--yarn-mscale", "0.5")):
        m = model("deepseek_v3", *argv)
        with torch.no_grad():
            full = logits_of(m)
            d = ref.mla_check(m, TOKENS, full)
            ab = logits_of(m, absorbed=True)
        expect(d < 1e-5 and maxdiff(ab, full) < 1e-5, f"MLA absorbed != unabsorbed {argv}: {d:.2e}")
        # The absorbed cache holds only r + rope numbers per token and layer.
        cache = ref.Cache()
        with torch.no_grad():
            m.forward(TOKENS[:, :6], cache=cache, absorbed=True)
        slot = cache.layers[0]
        expect(set(slot) == {"c", "k_pe"} and list(slot["c"].shape) == [2, 6, 32] and
               list(slot["k_pe"].shape) == [2, 6, 8], "absorbed cache = c_kv [B,T,r] and k_pe [B,T,rope]")


def check_position_shift():
    """RoPE scores depend on relative positions only: shifting every position by 37
    leaves the logits unchanged (catches q/k norms after RoPE, mismatched q/k angles)."""
    T = TOKENS.shape[1]
    for fam, argv in [(f, ()) for f in FAMILIES] + [("llama", ("--rope-scaling", "llama3")),
                                                    ("deepseek_v3", ("--no-rope-interleave",))]:
        m = model(fam, *argv, dtype=torch.float64)
        a = logits_of(m, positions=torch.arange(T))
        b = logits_of(m, positions=torch.arange(T) + 37)
        expect(maxdiff(a, b) < 1e-9, f"{fam}{argv}: logits depend on absolute position ({maxdiff(a, b):.2e})")
    m = model("qwen3", dtype=torch.float64)
    expect(maxdiff(logits_of(m), logits_of(m, positions=torch.arange(T) * 2)) > 1e-3, "positions have no effect")


def check_mla_splits():
    """Invariances that pin how MLA splits its projections (float64)."""
    m = model("deepseek_v3", "--mtp", "0", dtype=torch.float64)
    s = m.spec
    H, dn, dr, dv, r = s.heads, s.qk_nope, s.qk_rope, s.v_head, s.kv_lora_rank
    base = logits_of(m)
    a = "model.layers.1.self_attn."

    def with_(changes, fn=logits_of):
        keep = {k: m.w[k] for k in changes}
        m.w.update(changes)
        try:
            return fn(m)
        finally:
            m.w.update(keep)

    kva = m.w[a + "kv_a_proj_with_mqa.weight"]
    sc = kva.clone()
    sc[:r] *= 2.5      # c_kv rows: kv_a_layernorm cancels a uniform scale
    # (1e-5, not 1e-9: the norms' eps makes the scale invariance inexact)
    expect(maxdiff(with_({a + "kv_a_proj_with_mqa.weight": sc}), base) < 1e-5,
           "kv_a_proj_with_mqa rows [0, kv_lora_rank) must be c_kv (normalised by kv_a_layernorm)")
    sc = kva.clone()
    sc[r:] *= 2.5      # k_pe rows are not normalised
    expect(maxdiff(with_({a + "kv_a_proj_with_mqa.weight": sc}), base) > 1e-3, "k_pe rows must follow c_kv")
    qa = m.w[a + "q_a_proj.weight"]
    expect(maxdiff(with_({a + "q_a_proj.weight": qa * 3.0}), base) < 1e-5, "q_a_layernorm must normalise q_a_proj")
    # With k_pe zeroed, the rope part of every query head is irrelevant, its nope part is not.
    zpe = kva.clone()
    zpe[r:] = 0
    qb = m.w[a + "q_b_proj.weight"].view(H, dn + dr, -1)
    ref0 = with_({a + "kv_a_proj_with_mqa.weight": zpe})
    for part, should in ((slice(dn, dn + dr), False), (slice(0, dn), True)):
        q2 = qb.clone()
        q2[:, part] *= -1.7
        d = maxdiff(with_({a + "kv_a_proj_with_mqa.weight": zpe,
                           a + "q_b_proj.weight": q2.reshape(H * (dn + dr), -1)}), ref0)
        expect((d > 1e-3) == should, "q_b_proj rows per head: [0, nope) nope, [nope, nope + rope) rope")
    # With the nope part of the queries zeroed, k_nope rows of kv_b_proj are irrelevant, v rows are not.
    q0 = qb.clone()
    q0[:, :dn] = 0
    q0 = q0.reshape(H * (dn + dr), -1)
    kvb = m.w[a + "kv_b_proj.weight"].view(H, dn + dv, -1)
    ref1 = with_({a + "q_b_proj.weight": q0})
    for part, should in ((slice(0, dn), False), (slice(dn, dn + dv), True)):
        k2 = kvb.clone()
        k2[:, part] *= -1.7
        d = maxdiff(with_({a + "q_b_proj.weight": q0, a + "kv_b_proj.weight": k2.reshape(H * (dn + dv), -1)}), ref1)
        expect((d > 1e-3) == should, "kv_b_proj rows per head: [0, nope) k_nope, [nope, nope + v) value")


def check_qwen2_is_llama_without_bias():
    d = folder("qwen2")
    cfg, t = ref.load_folder(d)
    q = m64(cfg=cfg, tensors=t)
    zero = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in t.items()}
    qz = m64(cfg=cfg, tensors=zero)
    lcfg = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                                "max_position_embeddings", "tie_word_embeddings", "hidden_act")}
    lcfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False})
    ll = m64(cfg=lcfg, tensors={k: v for k, v in t.items() if not k.endswith(".bias")})
    d0 = maxdiff(logits_of(qz), logits_of(ll))
    expect(d0 < 1e-9, f"qwen2 with zero biases != llama ({d0:.2e})")
    expect(maxdiff(logits_of(q), logits_of(ll)) > 1e-2, "qwen2 biases have no effect")
    for n in ("q_proj", "k_proj", "v_proj"):
        one = dict(zero)
        key = f"model.layers.0.self_attn.{n}.bias"
        one[key] = t[key]
        expect(maxdiff(logits_of(m64(cfg=cfg, tensors=one)), logits_of(ll)) > 1e-4, f"{n}.bias has no effect")


def _moe_to_dense(cfg, t, copies=1):
    """A Qwen3 config/weights whose MLPs are expert 0 of a Qwen3-MoE model."""
    dcfg = {k: v for k, v in cfg.items() if k not in ("decoder_sparse_step", "moe_intermediate_size",
                                                      "num_experts_per_tok", "num_experts", "norm_topk_prob",
                                                      "output_router_logits", "router_aux_loss_coef",
                                                      "mlp_only_layers")}
    dcfg.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                 "intermediate_size": cfg["moe_intermediate_size"]})
    dt = {}
    for k, v in t.items():
        if ".mlp.gate.weight" in k or (".mlp.experts." in k and ".mlp.experts.0." not in k):
            continue
        dt[k.replace(".mlp.experts.0.", ".mlp.")] = v
    return dcfg, dt


def check_moe_reductions():
    # One expert, top-1 (either norm_topk_prob): exactly the dense Qwen3 with that MLP.
    for norm in ("0", "1"):
        cfg = tiny_cfg("qwen3_moe", "--experts", "1", "--top-k", "1", "--mlp-only-layers", "",
                       "--norm-topk-prob", norm)
        t = make_tiny.make_weights(cfg, 0)
        dcfg, dt = _moe_to_dense(cfg, t)
        a, b = logits_of(m64(cfg=cfg, tensors=t)), logits_of(m64(cfg=dcfg, tensors=dt))
        expect(maxdiff(a, b) < 1e-9, f"qwen3_moe 1 expert top-1 (norm {norm}) != dense qwen3 ({maxdiff(a, b):.2e})")
    # Four identical experts, top-2, renormalised: the weights sum to 1 -> dense again.
    cfg = tiny_cfg("qwen3_moe", "--experts", "4", "--top-k", "2", "--mlp-only-layers", "", "--norm-topk-prob", "1")
    t = make_tiny.make_weights(cfg, 0)
    for k in list(t):
        if ".mlp.experts." in k:
            prefix, rest = k.split(".mlp.experts.")
            t[k] = t[f"{prefix}.mlp.experts.0.{rest.split('.', 1)[1]}"].clone()
    dcfg, dt = _moe_to_dense(cfg, t)
    a, b = logits_of(m64(cfg=cfg, tensors=t)), logits_of(m64(cfg=dcfg, tensors=dt))
    expect(maxdiff(a, b) < 1e-9, f"qwen3_moe identical experts, renormalised top-2 != dense ({maxdiff(a, b):.2e})")
    tn = dict(t)
    un = m64(cfg=dict(cfg, norm_topk_prob=False), tensors=tn)
    expect(maxdiff(logits_of(un), b) > 1e-3, "norm_topk_prob=false must differ (weights sum < 1)")
    # DeepSeek: identical routed experts, renormalised, scale 1: routed + shared = one dense MLP
    # whose gate/up rows stack [expert; shared] and whose down columns concatenate.
    # intermediate_size = moe_intermediate_size * (1 + n_shared_experts): one dense width for all layers.
    cfg = tiny_cfg("deepseek_v3", "--mtp", "0", "--intermediate", "64", "--set", "routed_scaling_factor=1.0")
    t = make_tiny.make_weights(cfg, 0)
    dcfg = dict(cfg, first_k_dense_replace=cfg["num_hidden_layers"],
                intermediate_size=cfg["moe_intermediate_size"] * (1 + cfg["n_shared_experts"]))
    dt = {}
    for k, v in t.items():
        if ".mlp." not in k:
            dt[k] = v
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp."
        if i < cfg["first_k_dense_replace"]:
            for n in ("gate_proj", "up_proj", "down_proj"):
                dt[p + n + ".weight"] = t[p + n + ".weight"]
            continue
        for e in range(cfg["n_routed_experts"]):
            for n in ("gate_proj", "up_proj", "down_proj"):
                t[f"{p}experts.{e}.{n}.weight"] = t[f"{p}experts.0.{n}.weight"]
        for n in ("gate_proj", "up_proj"):
            dt[p + n + ".weight"] = torch.cat((t[f"{p}experts.0.{n}.weight"], t[f"{p}shared_experts.{n}.weight"]))
        dt[p + "down_proj.weight"] = torch.cat((t[f"{p}experts.0.down_proj.weight"],
                                                t[f"{p}shared_experts.down_proj.weight"]), dim=1)
    a = logits_of(m64(cfg=cfg, tensors=t))
    b = logits_of(m64(cfg=dcfg, tensors=dt))
    expect(maxdiff(a, b) < 1e-9, f"deepseek identical experts + shared != stacked dense MLP ({maxdiff(a, b):.2e})")
    c2 = m64(cfg=dict(cfg, routed_scaling_factor=2.5), tensors=t)
    expect(maxdiff(logits_of(c2), b) > 1e-3, "routed_scaling_factor has no effect")


def check_routers_by_hand():
    # Softmax router: logits [1, 3, 2, 0], top-2 -> experts 1, 2.
    cfg = tiny_cfg("qwen3_moe", "--experts", "4", "--top-k", "2", "--norm-topk-prob", "0")
    m = ref.Model(cfg=cfg, tensors=make_tiny.make_weights(cfg, 0))
    idx, w = m.route_softmax(torch.tensor([[1.0, 3.0, 2.0, 0.0]], dtype=torch.float64), 0)
    expect(idx.tolist() == [[1, 2]], f"softmax top-2 experts {idx.tolist()}")
    expect(abs(float(w[0, 0]) - 0.6439142598879722) < 1e-12 and abs(float(w[0, 1]) - 0.23688281808991013) < 1e-12,
           f"softmax weights {w.tolist()} (e^3/S, e^2/S with S = 1 + e + e^2 + e^3)")
    m.spec.moe["norm"] = True
    _, w = m.route_softmax(torch.tensor([[1.0, 3.0, 2.0, 0.0]], dtype=torch.float64), 0)
    expect(abs(float(w[0, 0]) - 0.7310585786300049) < 1e-12 and abs(float(w[0, 1]) - 0.2689414213699951) < 1e-12,
           f"renormalised softmax weights {w.tolist()} (sigmoid(1), sigmoid(-1))")
    # Sigmoid group-limited router: 8 experts, 4 groups of 2, topk_group 2, top-3, scale 2.
    cfg = tiny_cfg("deepseek_v3", "--experts", "8", "--n-group", "4", "--topk-group", "2", "--top-k", "3",
                   "--routed-scaling-factor", "2.0", "--mtp", "0")
    m = ref.Model(cfg=cfg, tensors=make_tiny.make_weights(cfg, 0), dtype=torch.float64)
    s = torch.tensor([0.90, 0.10, 0.60, 0.55, 0.80, 0.05, 0.50, 0.45], dtype=torch.float64)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, -0.5, 0.0, 0.12, 0.12], dtype=torch.float64)
    # biased = [.90 .10 | .60 .55 | .30 .05 | .62 .57]; group sums [1.00, 1.15, 0.35, 1.19]
    # -> groups 3 and 1 (group 0, holding the best expert 0, is excluded);
    # eligible biased: e2 .60, e3 .55, e6 .62, e7 .57 -> experts {6, 2, 7};
    # weights s2, s6, s7 = .60, .50, .45, / 1.55, * 2.
    m.w["model.layers.1.mlp.gate.e_score_correction_bias"] = bias
    logits = torch.log(s / (1 - s))[None]
    idx, w = m.route_sigmoid(logits, 1)
    got = dict(zip(idx[0].tolist(), w[0].tolist()))
    want = {2: 1.2 / 1.55, 6: 1.0 / 1.55, 7: 0.9 / 1.55}
    expect(set(got) == set(want), f"group-limited experts {sorted(got)} != {sorted(want)}")
    expect(all(abs(got[e] - want[e]) < 1e-12 for e in want), f"group-limited weights {got}")
    m.spec.moe["norm"] = False
    idx, w = m.route_sigmoid(logits, 1)
    got = dict(zip(idx[0].tolist(), w[0].tolist()))
    expect(all(abs(got[e] - v) < 1e-12 for e, v in {2: 1.2, 6: 1.0, 7: 0.9}.items()),
           f"unnormalised weights = 2 * sigmoid scores: {got}")
    # Without the bias: group sums [1.00, 1.15, 0.85, 0.95] -> groups 1, 0 -> experts {0, 2, 3}.
    m.w["model.layers.1.mlp.gate.e_score_correction_bias"] = torch.zeros(8, dtype=torch.float64)
    idx, _ = m.route_sigmoid(logits, 1)
    expect(sorted(idx[0].tolist()) == [0, 2, 3], f"unbiased choice {sorted(idx[0].tolist())} != [0, 2, 3]")


def check_gqa_mapping():
    """GQA == MHA with each KV head repeated for its rep consecutive query heads."""
    d = folder("llama")
    cfg, t = ref.load_folder(d)
    hd, kv, rep = cfg["head_dim"], cfg["num_key_value_heads"], cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    mt = dict(t)
    for i in range(cfg["num_hidden_layers"]):
        for n in ("k_proj", "v_proj"):
            k = f"model.layers.{i}.self_attn.{n}.weight"
            w = t[k].view(kv, hd, -1)
            mt[k] = torch.cat([w[j:j + 1] for j in range(kv) for _ in range(rep)]).reshape(kv * rep * hd, -1)
    a = logits_of(m64(cfg=cfg, tensors=t))
    b = logits_of(m64(cfg=dict(cfg, num_key_value_heads=cfg["num_attention_heads"]), tensors=mt))
    expect(maxdiff(a, b) < 1e-9, f"GQA != MHA with KV heads repeated consecutively ({maxdiff(a, b):.2e})")


def check_qk_norm_per_head():
    """Qwen3's per-head RMSNorm makes logits invariant to scaling one head's q or k rows."""
    d = folder("qwen3")
    cfg, t = ref.load_folder(d)
    base = logits_of(m64(cfg=cfg, tensors=t))
    hd = cfg["head_dim"]
    for n, head in (("q_proj", 1), ("k_proj", 0)):
        s = dict(t)
        k = f"model.layers.0.self_attn.{n}.weight"
        w = t[k].clone()
        w[head * hd:(head + 1) * hd] *= 3.0
        s[k] = w
        expect(maxdiff(logits_of(m64(cfg=cfg, tensors=s)), base) < 1e-4,
               f"qwen3: scaling {n} head {head} changed logits")
    s = dict(t)
    k = "model.layers.0.self_attn.q_norm.weight"
    s[k] = t[k] * torch.linspace(0.5, 1.5, hd)
    expect(maxdiff(logits_of(m64(cfg=cfg, tensors=s)), base) > 1e-3, "q_norm weight has no effect")
    # The same scaling changes a model without q/k norm (llama).
    lc, lt = ref.load_folder(folder("llama"))
    s = dict(lt)
    k = "model.layers.0.self_attn.q_proj.weight"
    w = lt[k].clone()
    w[:16] *= 3.0
    s[k] = w
    expect(maxdiff(logits_of(m64(cfg=lc, tensors=s)), logits_of(m64(cfg=lc, tensors=lt))) > 1e-3,
           "llama logits should depend on q scale")


def check_float64():
    for fam in FAMILIES:
        m32, m64 = model(fam), model(fam, dtype=torch.float64)
        with torch.no_grad():
            r32, r64 = m32.losses(TOKENS), m64.losses(TOKENS)
        scale = max(1.0, float(r64["logits"].abs().max()))
        d = maxdiff(r32["logits"].double(), r64["logits"])
        expect(d < 1e-5 * scale, f"{fam}: fp32 vs float64 logits {d:.2e}")
        expect(abs(float(r32["loss"]) - float(r64["loss"])) < 1e-5, f"{fam}: loss fp32 vs float64")
        for a, b in zip(r32.get("mtp_logits", []), r64.get("mtp_logits", [])):
            expect(maxdiff(a.double(), b) < 1e-5 * scale, f"{fam}: mtp logits fp32 vs float64")


def check_finite_differences():
    picks = {
        "qwen2": ["model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.bias",
                  "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"],
        "qwen3_moe": ["model.layers.0.self_attn.q_norm.weight", "model.layers.0.mlp.gate.weight",
                      "model.layers.2.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.up_proj.weight"],
        "deepseek_v3": ["model.layers.1.self_attn.kv_b_proj.weight", "model.layers.1.self_attn.q_a_layernorm.weight",
                        "model.layers.2.mlp.gate.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
                        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.3.eh_proj.weight"],
    }
    eps = 1e-5
    for fam, names in picks.items():
        m = model(fam, dtype=torch.float64)
        for n in m.trainable():
            m.w[n].requires_grad_(True)
        res = m.losses(TOKENS)
        losses = {"loss": res["loss"]}
        if "mtp_loss" in res:
            losses["mtp_loss"] = res["mtp_loss"]
        grads = {k: ref.grads_of(m, v, names) for k, v in losses.items()}
        for n in m.trainable():
            m.w[n].requires_grad_(False)
        for n in names:
            w = m.w[n]
            g = grads["loss"][n]
            flat = g.abs().flatten()
            entries = [int(flat.argmax()), int(torch.randint(0, flat.numel(), (1,),
                                                             generator=torch.Generator().manual_seed(1)))]
            for e in entries:
                idx = tuple(int(v) for v in np.unravel_index(e, tuple(w.shape)))
                old = float(w[idx])
                vals = {}
                for sgn in (1, -1):
                    w[idx] = old + sgn * eps
                    with torch.no_grad():
                        r = m.losses(TOKENS)
                    vals[sgn] = {k: float(r[k]) for k in losses}
                w[idx] = old
                for k in losses:
                    fd = (vals[1][k] - vals[-1][k]) / (2 * eps)
                    an = float(grads[k][n][idx])
                    expect(abs(fd - an) <= 1e-7 + 1e-5 * abs(an),
                           f"{fam} d{k}/d{n}{list(idx)}: autograd {an:.9e} vs central difference {fd:.9e}")
        expect(any(float(grads["loss"][n].abs().max()) > 0 for n in names), f"{fam}: all gradients zero")
        if "mtp_loss" in losses:
            expect(float(grads["loss"]["model.layers.3.eh_proj.weight"].abs().max()) == 0.0,
                   "main loss must not depend on MTP weights")
            expect(float(grads["mtp_loss"]["model.layers.1.self_attn.kv_b_proj.weight"].abs().max()) > 0,
                   "MTP loss gradient flows into the main model")


def check_loss():
    for fam in FAMILIES:
        m = model(fam, dtype=torch.float64)
        with torch.no_grad():
            res = m.losses(TOKENS)
        lp = torch.log_softmax(res["logits"][:, :-1], dim=-1)
        by_hand = -lp.gather(-1, TOKENS[:, 1:, None]).mean()
        expect(abs(float(by_hand) - float(res["loss"])) < 1e-12, f"{fam}: loss != mean CE(logits[:, j], t_(j+1))")


def check_greedy():
    for fam, argv in [(f, ()) for f in FAMILIES] + [("deepseek_v3", ("--q-lora-rank", "0"))]:
        m = model(fam, *argv)
        prompt = TOKENS[0, :4].tolist()
        with torch.no_grad():
            ids, rows, margins = m.generate(prompt, 8)
            full = m.forward(torch.tensor([prompt + ids]))[0][0]
        tf = [ref.first_argmax(full[j]) for j in range(3, 3 + 8)]
        expect(tf == ids, f"{fam}{argv}: greedy ids {ids} != argmax of the full forward {tf}")
        expect(maxdiff(rows, full[3:11]) < 1e-5 * max(1, float(full.abs().max())),
               f"{fam}: greedy logits differ from the full forward")
        if m.spec.mla:
            with torch.no_grad():
                ids_b, _, _ = m.generate(prompt, 8, absorbed=True)
            expect(ids_b == ids, f"{fam}: absorbed greedy ids {ids_b} != {ids}")
    expect(ref.first_argmax(torch.tensor([1.0, 3.0, 3.0, 2.0])) == 1, "argmax ties go to the lowest id")


def check_mtp():
    m = model("deepseek_v3", mtp_distinct=True)
    H = m.spec.hidden
    L = m.spec.layers

    def run(mm, toks):
        with torch.no_grad():
            logits, hidden = mm.forward(toks)
            return logits, mm.mtp(toks, hidden)[0]

    tok2 = TOKENS.clone()
    mpos = 9
    tok2[:, mpos] = (tok2[:, mpos] + 17) % 256
    logits, mtp = run(m, TOKENS)
    expect(list(mtp.shape) == [2, 15, 256], f"mtp logits shape {list(mtp.shape)}")
    _, mtp2 = run(m, tok2)
    # (not bit-exact: the expert matmuls gather different row sets)
    expect(maxdiff(mtp[:, :mpos - 1], mtp2[:, :mpos - 1]) < 1e-5, "MTP rows before m-1 depend on token m")
    expect(maxdiff(mtp[:, mpos - 1], mtp2[:, mpos - 1]) > 1e-3, "MTP row m-1 must use Emb(t_m)")
    w = m.w[f"model.layers.{L}.eh_proj.weight"]
    for half, should_change in ((slice(0, H), False), (slice(H, 2 * H), True)):
        z = w.clone()
        z[:, half] = 0
        m.w[f"model.layers.{L}.eh_proj.weight"] = z
        _, a = run(m, TOKENS)
        _, b = run(m, tok2)
        changed = maxdiff(a[:, mpos - 1], b[:, mpos - 1]) > 1e-3
        expect(changed == should_change, "eh_proj columns [0, H) must take enorm(Emb(t_{i+1})), [H, 2H) hnorm(h_i)")
    m.w[f"model.layers.{L}.eh_proj.weight"] = w
    for name in (f"model.layers.{L}.embed_tokens.weight", f"model.layers.{L}.shared_head.head.weight"):
        keep = m.w[name]
        m.w[name] = keep * 1.5 + 0.1
        lg, mt = run(m, TOKENS)
        m.w[name] = keep
        expect(maxdiff(lg, logits) == 0.0 and maxdiff(mt, mtp) > 1e-3, f"{name} must feed the MTP head only")
    keep = m.w["model.norm.weight"]
    m.w["model.norm.weight"] = keep * torch.linspace(0.5, 1.5, H)
    _, mt = run(m, TOKENS)
    m.w["model.norm.weight"] = keep
    expect(maxdiff(mt, mtp) > 1e-3, "MTP depth 1 must take h after model.norm")
    m.w["model.norm.weight"] = keep * 3.0
    _, mt = run(m, TOKENS)
    m.w["model.norm.weight"] = keep
    expect(maxdiff(mt, mtp) < 1e-4, "a uniform model.norm scale must cancel in hnorm")
    with torch.no_grad():
        res = m.losses(TOKENS)
    lp = torch.log_softmax(res["mtp_logits"][0][:, :-1].double(), dim=-1)
    by_hand = -lp.gather(-1, TOKENS[:, 2:, None]).mean()
    expect(abs(float(by_hand) - float(res["mtp_loss"])) < 1e-6, "mtp_loss = CE(mtp_logits[:, i], t_{i+2})")
    # Two depths: depth 2 rows predict t_{i+3} and have T-2 rows.
    m2 = model("deepseek_v3", "--mtp", "2")
    with torch.no_grad():
        r2 = m2.losses(TOKENS)
    expect([list(x.shape) for x in r2["mtp_logits"]] == [[2, 15, 256], [2, 14, 256]], "MTP depth shapes")
    expect(len(r2["mtp_losses"]) == 2, "one loss per MTP depth")
    # Depth 2 chains on depth 1's block output: depth-1 weights move depth-2 logits.
    name = f"model.layers.{L}.eh_proj.weight"
    keep = m2.w[name]
    m2.w[name] = keep * 1.3
    with torch.no_grad():
        r3 = m2.losses(TOKENS)
    m2.w[name] = keep
    expect(maxdiff(r3["mtp_logits"][1], r2["mtp_logits"][1]) > 1e-3, "MTP depth 2 must take depth 1's output")


def check_features_matter():
    """Every config feature the tiny models exercise moves the logits."""
    pairs = [
        (("deepseek_v3",), ("deepseek_v3", "--no-rope-interleave")),
        (("deepseek_v3",), ("deepseek_v3", "--yarn-mscale-all-dim", "0.5")),
        (("deepseek_v3",), ("deepseek_v3", "--yarn-mscale", "0.5")),
        (("qwen3_moe",), ("qwen3_moe", "--norm-topk-prob", "0")),
        (("llama",), ("llama", "--rope-theta", "500000")),
    ]
    for a, b in pairs:
        ma, mb = model(*a), model(*b)
        expect(all(torch.equal(ma.w[k], mb.w[k]) for k in ma.w if k in mb.w and ".mlp.gate" not in k),
               f"{a} / {b} should share weights")
        expect(maxdiff(logits_of(ma), logits_of(mb)) > 1e-3, f"{b[1:]} has no effect on the logits")
    m = model("deepseek_v3")
    base = logits_of(m)
    for name in ("model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.1.self_attn.kv_a_layernorm.weight",
                 "model.layers.1.self_attn.q_a_layernorm.weight", "model.layers.2.mlp.shared_experts.down_proj.weight"):
        keep = m.w[name]
        m.w[name] = torch.zeros_like(keep) if "bias" in name else keep * torch.linspace(0.5, 1.5, keep.shape[-1])
        d = maxdiff(logits_of(m), base)
        m.w[name] = keep
        expect(d > 1e-3, f"{name} has no effect ({d:.2e})")
    for fam in ("qwen3_moe", "deepseek_v3"):
        mm = model(fam)
        mm.margins = []
        with torch.no_grad():
            mm.losses(TOKENS)
            mm.generate(TOKENS[0, :4].tolist(), 8)
        expect(mm.min_margin() > ref.ROUTER_MARGIN_MIN, f"{fam}: default routing margin {mm.min_margin():.2e}")
        if fam == "deepseek_v3":
            w = mm.w["model.layers.1.mlp.gate.weight"]
            x = torch.randn(64, 64, generator=torch.Generator().manual_seed(2))
            idx, _ = mm.route_sigmoid(x @ w.T, 1)
            seen = set(idx.flatten().tolist())
            expect(len(seen) >= mm.cfg["n_routed_experts"] // 2, f"router uses only {len(seen)} experts")


def check_cli():
    d = folder("deepseek_v3", "--dtype", "bf16", shards=2)
    out = os.path.join(TMP, "cli.safetensors")
    cmd = [sys.executable, os.path.join(HERE, "hf_reference.py"), "--model", d, "--tokens", "7", "--out", out,
           "--greedy", "4", "--prompt", "3,1,4", "--grads"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    expect(r.returncode == 0, f"CLI failed: {r.stderr[-2000:]}")
    t, meta = read_safetensors(out)
    expect(meta["family"] == "deepseek_v3" and meta["compute_dtype"] == "float32", f"metadata {meta}")
    shapes = {"tokens": ([2, 16], torch.int32), "logits": ([2, 16, 256], torch.float32),
              "loss": ([1], torch.float32), "final_hidden": ([2, 16, 64], torch.float32),
              "mtp_logits": ([2, 15, 256], torch.float32), "mtp_loss": ([1], torch.float32),
              "mla_max_abs_diff": ([1], torch.float32), "greedy_prompt": ([3], torch.int32),
              "greedy_ids": ([4], torch.int32), "greedy_logits": ([4, 256], torch.float32),
              "greedy_margin": ([4], torch.float32), "router_min_margin": ([1], torch.float32)}
    for k, (shape, dt) in shapes.items():
        expect(k in t and list(t[k].shape) == shape and t[k].dtype == dt, f"CLI output {k}: "
               f"{(list(t[k].shape), t[k].dtype) if k in t else 'missing'}")
    expect(torch.equal(t["tokens"].long(), ref.default_tokens(256, 7)), "tokens of seed 7")
    expect(t["greedy_prompt"].tolist() == [3, 1, 4], "prompt ids")
    m = ref.Model(d)
    for n in m.trainable():
        m.w[n].requires_grad_(True)
    res = m.losses(ref.default_tokens(256, 7))
    g = ref.grads_of(m, res["loss"], m.trainable())
    expect(abs(float(t["loss"]) - float(res["loss"])) < 1e-6, "CLI loss")
    expect(maxdiff(t["logits"], res["logits"].detach()) < 1e-6, "CLI logits")
    names = set(m.trainable())
    expect({k[5:] for k in t if k.startswith("grad.")} == names, "grad.* names = every trainable weight")
    expect({k[9:] for k in t if k.startswith("mtp_grad.")} == names, "mtp_grad.* names")
    expect(all(t["grad." + n].dtype == torch.float32 and maxdiff(t["grad." + n], g[n]) < 1e-6 for n in names),
           "CLI gradients")
    expect(not any("e_score_correction_bias" in k for k in t if "grad" in k), "no gradient of the buffer")
    # A config that disagrees with the weights is an error, exit code 1.
    bad = os.path.join(TMP, "bad_cfg")
    os.makedirs(bad, exist_ok=True)
    cfg = tiny_cfg("llama")
    make_tiny.write_folder(bad, cfg, make_tiny.make_weights(cfg, 0))
    cfg["intermediate_size"] = 96
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(cfg, f)
    r = subprocess.run(cmd[:2] + ["--model", bad, "--out", out], capture_output=True, text=True)
    expect(r.returncode == 1 and "shape" in r.stderr, f"mismatched config must fail: {r.returncode} {r.stderr[-300:]}")


CHECKS = [check_safetensors_dtypes, check_sharding, check_config_files, check_weight_names, check_rope_layouts,
          check_rope_tables, check_linear_positions, check_position_shift, check_kv_cache, check_mla_paths,
          check_mla_splits,
          check_qwen2_is_llama_without_bias, check_moe_reductions, check_routers_by_hand, check_gqa_mapping,
          check_qk_norm_per_head, check_float64, check_finite_differences, check_loss, check_greedy, check_mtp,
          check_features_matter, check_cli]


def main():
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    t0 = time.time()
    try:
        for chk in CHECKS:
            t = time.time()
            try:
                chk()
            except (CheckFailed, ref.ReferenceError) as e:
                print(f"FAIL {chk.__name__}: {e}")
                return 1
            print(f"ok   {chk.__name__} ({time.time() - t:.2f} s)")
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"all {len(CHECKS)} checks passed in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
