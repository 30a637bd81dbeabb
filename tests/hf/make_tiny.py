#!/usr/bin/python3
"""Builds a tiny, seeded Hugging Face model folder of one of five families.

  make_tiny.py --family {llama,qwen2,qwen3,qwen3_moe,deepseek_v3} --out DIR
               [--dtype fp32|bf16|fp16] [--shards N] [--seed S] [--tie|--no-tie]
               [--rope-scaling none|linear|llama3|yarn] [size / feature knobs]
               [--set KEY=JSON ...]

Writes config.json (the family's HF config keys, torch_dtype set), model.safetensors
or model-0000k-of-0000n.safetensors + model.safetensors.index.json, and
generation_config.json. Weight names and shapes come from the config through
hf_reference.weight_shapes (HF's names; lm_head.weight absent when tied).

Weights (float32 draws from torch.Generator(seed), rounded to the stored dtype):
  * matrices [out, in]: N(0, 1/in)  (unit-variance activations, so that every
    feature moves the logits of a model this narrow; 0.02 would leave attention
    nearly uniform at hidden 64);
  * router matrices (mlp.gate.weight): N(0, 4/in), logits of std ~2;
  * embeddings: N(0, 1), or N(0, 1/hidden) when tied (it is then the output head);
  * RMSNorm weights: 1 + N(0, 0.1^2); biases: N(0, 0.2^2);
  * e_score_correction_bias: U(-0.1, 0.1), always stored F32 (HF keeps it fp32);
  * DeepSeek MTP layers: embed_tokens and shared_head.head are copies of the main
    embedding and output head, as DeepSeek's checkpoints store them
    (--mtp-distinct draws them independently instead).
For MoE families the folder is then run through hf_reference on its default batch
(seed 0, B=2, T=16), the default greedy run (prompt tokens[0, :4], 8 tokens) and the
MTP head; if any routing decision is within 1e-4 of a tie (k-th vs (k+1)-th score,
group choice, or DeepSeek's k-th biased score vs 0), the router tensors alone are
redrawn (attempt a uses seed + 1000 * a) and the check repeats.
"""
import argparse
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "golden"))
import hf_reference as ref  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

DTYPES = {"fp32": (torch.float32, "float32"), "bf16": (torch.bfloat16, "bfloat16"),
          "fp16": (torch.float16, "float16")}
MAX_ROUTER_ATTEMPTS = 20


def base_config(family):
    """The tiny default config of a family, with every key its HF config uses."""
    common = {
        "architectures": [ref.ARCHITECTURES[family]], "model_type": family,
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
        "max_position_embeddings": 256, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
        "use_cache": True, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    }
    c = dict(common)
    if family == "llama":
        c.update({"head_dim": 16, "rms_norm_eps": 1e-5, "pretraining_tp": 1,
                  "attention_bias": False, "mlp_bias": False})
    elif family == "qwen2":
        c.update({"tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 256,
                  "max_window_layers": 2})
    elif family in ("qwen3", "qwen3_moe"):
        # head_dim 32 with 4 heads: num_heads * head_dim = 128 != hidden_size 64.
        c.update({"head_dim": 32, "attention_bias": False, "use_sliding_window": False,
                  "sliding_window": None, "max_window_layers": 2})
        if family == "qwen3_moe":
            c.update({"num_hidden_layers": 3, "max_window_layers": 3, "decoder_sparse_step": 1,
                      "moe_intermediate_size": 32, "num_experts_per_tok": 2, "num_experts": 8,
                      "norm_topk_prob": True, "output_router_logits": False,
                      "router_aux_loss_coef": 0.001, "mlp_only_layers": [1]})
    elif family == "deepseek_v3":
        c.update({
            "num_hidden_layers": 3, "num_key_value_heads": 4, "bos_token_id": 0, "eos_token_id": 1,
            "moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 16,
            "routed_scaling_factor": 2.5, "kv_lora_rank": 32, "q_lora_rank": 32,
            "qk_rope_head_dim": 8, "v_head_dim": 12, "qk_nope_head_dim": 16,
            "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
            "moe_layer_freq": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc", "aux_loss_alpha": 0.001, "seq_aux": True, "ep_size": 1,
            "num_nextn_predict_layers": 1, "pretraining_tp": 1, "attention_bias": False,
            "rope_interleave": True,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        })
    else:
        raise SystemExit(f"unknown family {family}")
    return c


def rope_scaling(kind, args):
    """rope_scaling dict of --rope-scaling; max_position_embeddings is set to
    factor * original_max_position_embeddings so that HF versions that derive the
    YaRN factor from that ratio agree with those reading `factor`."""
    orig = args.original_max_pos
    if kind == "none":
        return None, None
    if kind == "linear":
        return {"rope_type": "linear", "factor": args.rope_factor or 2.0}, None
    if kind == "llama3":
        f = args.rope_factor or 8.0
        return ({"rope_type": "llama3", "factor": f, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": orig}, int(f * orig))
    if kind == "yarn":
        f = args.rope_factor or 4.0
        rs = {"rope_type": "yarn", "factor": f, "beta_fast": 32.0, "beta_slow": 1.0,
              "original_max_position_embeddings": orig}
        if args.yarn_attention_factor is not None:
            rs["attention_factor"] = args.yarn_attention_factor
        return rs, int(f * orig)
    raise SystemExit(f"unknown rope scaling {kind}")


def make_config(args):
    c = base_config(args.family)
    knobs = {"vocab_size": args.vocab, "hidden_size": args.hidden, "intermediate_size": args.intermediate,
             "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
             "num_key_value_heads": args.kv_heads, "rope_theta": args.rope_theta}
    if args.family in ("llama", "qwen3", "qwen3_moe"):
        knobs["head_dim"] = args.head_dim
    if args.family == "qwen3_moe":
        knobs.update({"num_experts": args.experts, "num_experts_per_tok": args.top_k,
                      "moe_intermediate_size": args.moe_intermediate,
                      "decoder_sparse_step": args.decoder_sparse_step})
        if args.mlp_only_layers is not None:
            knobs["mlp_only_layers"] = [int(v) for v in args.mlp_only_layers.split(",") if v != ""]
    if args.family == "deepseek_v3":
        knobs.update({"n_routed_experts": args.experts, "num_experts_per_tok": args.top_k,
                      "moe_intermediate_size": args.moe_intermediate, "n_group": args.n_group,
                      "topk_group": args.topk_group, "n_shared_experts": args.shared_experts,
                      "first_k_dense_replace": args.first_k_dense, "moe_layer_freq": args.moe_layer_freq,
                      "num_nextn_predict_layers": args.mtp, "kv_lora_rank": args.kv_lora_rank,
                      "routed_scaling_factor": args.routed_scaling_factor})
        if args.q_lora_rank is not None:
            c["q_lora_rank"] = args.q_lora_rank or None   # 0 -> null: plain q_proj
        if args.no_rope_interleave:
            c["rope_interleave"] = False
        rs = c["rope_scaling"]
        if args.yarn_mscale is not None:
            rs["mscale"] = args.yarn_mscale
        if args.yarn_mscale_all_dim is not None:
            rs["mscale_all_dim"] = args.yarn_mscale_all_dim
    if args.norm_topk_prob is not None:
        knobs["norm_topk_prob"] = bool(args.norm_topk_prob)
    for k, v in knobs.items():
        if v is not None:
            c[k] = v
    if args.tie is not None:
        c["tie_word_embeddings"] = args.tie
    if args.attention_bias:
        c["attention_bias"] = True
    if args.mlp_bias:
        c["mlp_bias"] = True
    if args.rope_scaling is not None:
        rs, max_pos = rope_scaling(args.rope_scaling, args)
        c["rope_scaling"] = rs
        if max_pos:
            c["max_position_embeddings"] = max_pos
    if c.get("max_window_layers") is not None:
        c["max_window_layers"] = c["num_hidden_layers"]
    if args.family == "qwen2":
        c["sliding_window"] = c["max_position_embeddings"]
    for item in args.set or []:
        k, _, v = item.partition("=")
        c[k] = json.loads(v)
    c["torch_dtype"] = DTYPES[args.dtype][1]
    return c


# --tokenizer: a byte-level BPE tokenizer.json in the family's style (its
# pre-tokenizer regex, special tokens, bos handling), a few merges, and
# tokenizer_config.json with the family's chat template (tests/hf/templates,
# our own renditions). Ids: the 256 byte tokens, the merges, then the
# special tokens; config.json's vocab_size, bos and eos follow.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_PATTERNS = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                     r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
                     r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]
TOKENIZER_STYLES = {
    # family: (patterns, specials, bos, eos ids (by token), adds bos, template)
    "llama": ([LLAMA3_PATTERN], ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
              "<|begin_of_text|>", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], True, "llama3.jinja"),
    "qwen2": ([QWEN_PATTERN], ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None,
              ["<|im_end|>", "<|endoftext|>"], False, "qwen2.jinja"),
    "qwen3": ([QWEN_PATTERN], ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], None,
              ["<|im_end|>", "<|endoftext|>"], False, "qwen3.jinja"),
    "deepseek_v3": (DEEPSEEK_PATTERNS, ["<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                                        "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>",
                                        "<\uff5cAssistant\uff5c>"],
                    "<\uff5cbegin\u2581of\u2581sentence\uff5c>", ["<\uff5cend\u2581of\u2581sentence\uff5c>"], True,
                    "deepseek_v3.jinja"),
}
TOKENIZER_STYLES["qwen3_moe"] = TOKENIZER_STYLES["qwen3"]
TINY_MERGES = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"),
               ("\u0120", "a")]


def byte_chars():
    """GPT-2's byte -> printable character map of byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tokenizer_vocab_size(family):
    return 256 + len(TINY_MERGES) + len(TOKENIZER_STYLES[family][1])


def apply_tokenizer_ids(cfg, family):
    """config.json's vocab/bos/eos for the tokenizer write_tokenizer writes."""
    _, specials, bos, eos, _, _ = TOKENIZER_STYLES[family]
    first = 256 + len(TINY_MERGES)
    ids = {t: first + i for i, t in enumerate(specials)}
    cfg["vocab_size"] = max(cfg["vocab_size"], tokenizer_vocab_size(family))
    cfg["bos_token_id"] = ids[bos] if bos else None
    cfg["eos_token_id"] = [ids[t] for t in eos] if len(eos) > 1 else ids[eos[0]]


def write_tokenizer(out, family):
    patterns, specials, bos, eos, adds_bos, template = TOKENIZER_STYLES[family]
    chars = byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    for a, b in TINY_MERGES:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(specials)]
    split = [{"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False} for p in patterns]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    if adds_bos:
        bos_id = next(a["id"] for a in added if a["content"] == bos)
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": {"type": "NFC"} if family.startswith("qwen") else None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": split + [byte_level]},
           "post_processor": post,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": family == "llama", "vocab": vocab,
                     "merges": [[a, b] for a, b in TINY_MERGES]}}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(HERE, "templates", template), encoding="utf-8") as f:
        chat_template = f.read()
    tc = {"add_bos_token": adds_bos, "add_eos_token": False, "bos_token": bos, "eos_token": eos[0],
          "pad_token": None, "model_max_length": 131072,
          "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
          "chat_template": chat_template}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=1)
        f.write("\n")


def _is_router(name):
    return name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")


def draw(name, shape, g, tied=False):
    if name.endswith("e_score_correction_bias"):
        return torch.rand(shape, generator=g) * 0.2 - 0.1
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith(".bias"):
        return 0.2 * torch.randn(shape, generator=g)
    if name.endswith("embed_tokens.weight"):
        # A tied embedding is also the output head: N(0, 1/hidden) keeps its logits O(1).
        return torch.randn(shape, generator=g) * (shape[1] ** -0.5 if tied else 1.0)
    gain = 2.0 if name.endswith("mlp.gate.weight") else 1.0
    return torch.randn(shape, generator=g) * (gain / shape[1] ** 0.5)


def make_weights(cfg, seed, router_attempt=0, mtp_distinct=False):
    """{name: float32 tensor}: every non-router tensor from Generator(seed) in file
    order; router tensors from Generator(seed + 1000 * router_attempt + 1)."""
    shapes = ref.weight_shapes(cfg)
    g = torch.Generator().manual_seed(seed)
    gr = torch.Generator().manual_seed(seed + 1000 * router_attempt + 1)
    out = {}
    for name, shape in shapes.items():
        out[name] = draw(name, shape, gr if _is_router(name) else g, bool(cfg.get("tie_word_embeddings")))
    n_main = cfg["num_hidden_layers"]
    n_mtp = int(cfg.get("num_nextn_predict_layers", 0) or 0) if cfg["model_type"] == "deepseek_v3" else 0
    for k in range(0 if mtp_distinct else n_mtp):
        p = f"model.layers.{n_main + k}."
        out[p + "embed_tokens.weight"] = out["model.embed_tokens.weight"].clone()
        head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
        out[p + "shared_head.head.weight"] = out[head].clone()
    return out


def stored(weights, dtype):
    """The tensors as written: `dtype`, except e_score_correction_bias (F32)."""
    return {n: (t if n.endswith("e_score_correction_bias") else t.to(dtype)) for n, t in weights.items()}


def write_folder(out, cfg, tensors, shards=1):
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f in ("model.safetensors.index.json", "config.json",
                                               "generation_config.json"):
            os.remove(os.path.join(out, f))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    meta = {"format": "pt"}
    names = list(tensors)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, meta)
        return
    if shards > len(names):
        raise SystemExit(f"--shards {shards} exceeds the {len(names)} tensors")
    nbytes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(nbytes)
    # Contiguous runs in file order: a tensor goes to the shard its starting byte falls in
    # (of `shards` equal byte ranges); by count instead when that leaves a shard empty.
    starts = [sum(nbytes[:j]) for j in range(len(names))]
    owner = [min(shards - 1, st * shards // total) for st in starts]
    if len(set(owner)) < shards:
        owner = [j * shards // len(names) for j in range(len(names))]
    groups = [[n for n, o in zip(names, owner) if o == k] for k in range(shards)]
    weight_map = {}
    for k, grp in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(out, fname), {n: tensors[n] for n in grp}, meta)
        for n in grp:
            weight_map[n] = fname
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def default_margins(folder):
    """(smallest routing margin, smallest greedy top1-top2 logit gap) of hf_reference's
    default runs on `folder`: the batch of seed 0, greedy 8 tokens after tokens[0, :4],
    the MTP head, and for MLA both attention paths."""
    m = ref.Model(folder)
    toks = ref.default_tokens(m.spec.vocab, 0)
    prompt = toks[0, :ref.DEFAULT_PROMPT_LEN].tolist()
    with torch.no_grad():
        m.losses(toks)
        _, _, gaps = m.generate(prompt, ref.DEFAULT_GREEDY)
        if m.spec.mla:
            m.forward(toks, absorbed=True)
            m.generate(prompt, ref.DEFAULT_GREEDY, absorbed=True)
    return m.min_margin(), min(gaps)


def build(cfg, out, seed=0, shards=1, mtp_distinct=False, quiet=True):
    """Writes the folder; returns the routing margin (inf without MoE)."""
    dtype = {v[1]: v[0] for v in DTYPES.values()}[cfg["torch_dtype"]]
    moe = ref.Spec(cfg).moe is not None
    for attempt in range(MAX_ROUTER_ATTEMPTS if moe else 1):
        w = make_weights(cfg, seed, attempt, mtp_distinct)
        write_folder(out, cfg, stored(w, dtype), shards)
        if quiet and not moe:
            return float("inf")
        margin, gap = default_margins(out)
        if margin > ref.ROUTER_MARGIN_MIN:
            if not quiet:
                if moe:
                    print(f"[make_tiny] routing margin {margin:.3e} (router attempt {attempt})")
                if gap < ref.ROUTER_MARGIN_MIN:
                    print(f"[make_tiny] warning: default greedy run has a top1-top2 gap of {gap:.2e}")
            return margin
        if not quiet:
            print(f"[make_tiny] routing margin {margin:.3e} <= {ref.ROUTER_MARGIN_MIN}: redrawing the router")
    shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"no router draw with a margin above {ref.ROUTER_MARGIN_MIN} in {MAX_ROUTER_ATTEMPTS} attempts")


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=sorted(ref.ARCHITECTURES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie", dest="tie", action="store_true", default=None)
    ap.add_argument("--no-tie", dest="tie", action="store_false")
    ap.add_argument("--rope-scaling", choices=("none", "linear", "llama3", "yarn"))
    ap.add_argument("--rope-factor", type=float)
    ap.add_argument("--original-max-pos", type=int, default=64)
    ap.add_argument("--yarn-attention-factor", type=float)
    ap.add_argument("--rope-theta", type=float)
    for k in ("vocab", "hidden", "intermediate", "layers", "heads", "kv-heads", "head-dim", "experts",
              "top-k", "moe-intermediate", "decoder-sparse-step", "n-group", "topk-group",
              "shared-experts", "first-k-dense", "moe-layer-freq", "mtp", "kv-lora-rank", "q-lora-rank",
              "norm-topk-prob"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--mlp-only-layers", help="comma-separated layer indices (qwen3_moe)")
    ap.add_argument("--routed-scaling-factor", type=float)
    ap.add_argument("--yarn-mscale", type=float)
    ap.add_argument("--yarn-mscale-all-dim", type=float)
    ap.add_argument("--no-rope-interleave", action="store_true")
    ap.add_argument("--attention-bias", action="store_true")
    ap.add_argument("--mlp-bias", action="store_true", help="llama only")
    ap.add_argument("--mtp-distinct", action="store_true",
                    help="draw the MTP embed_tokens/shared_head.head instead of copying the main ones")
    ap.add_argument("--set", action="append", metavar="KEY=JSON", help="override a config key")
    ap.add_argument("--tokenizer", action="store_true",
                    help="also write tokenizer.json and tokenizer_config.json (chat template) in the family's style")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    cfg = make_config(args)
    if args.tokenizer:
        apply_tokenizer_ids(cfg, args.family)
    build(cfg, args.out, args.seed, args.shards, args.mtp_distinct, quiet=False)
    if args.tokenizer:
        write_tokenizer(args.out, args.family)
    print(f"[make_tiny] wrote {args.family} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
