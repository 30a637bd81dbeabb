#!/usr/bin/python3
"""PyTorch benchmark peer for Myriad: training steps and batch-1 KV-cached decode.

Both modes run the model of tests/golden/reference.py (the same code the golden
test trusts), in fp32 on the CPU, in the setting BENCHMARKS.md names as
PyTorch's best here: OPENBLAS_CORETYPE=SkylakeX (set below before torch loads
unless the caller set it) and torch.set_num_threads(--threads).

  /usr/bin/python3 bench/torch_peer.py train --config bench/configs/moe_small.toml \
      [--set KEY=VALUE ...] --steps 5 --warmup 2 --threads 1 [--batch 8] [--seq 256]
  /usr/bin/python3 bench/torch_peer.py train-hf --hf HF_DIR --batch 8 --seq 256 --steps 5 --warmup 2
  /usr/bin/python3 bench/torch_peer.py decode-hf --hf HF_DIR --tokens 32 [--absorbed]
  /usr/bin/python3 bench/torch_peer.py decode --config bench/configs/gpt2_dense.toml \
      --tokens 32 --prompt-len 16 [--threads 1]

Environment: OPENBLAS_CORETYPE (default SkylakeX, see above);
MYRIAD_PEER_MALLOC=default turns off the allocator tuning (see tune_malloc;
by default the script re-executes itself once with GLIBC_TUNABLES set).

Each prints ONE JSON line on stdout (progress goes to stderr). CPU-time
fields (process_time, all threads) show how much CPU the run actually got: on
a shared machine a low CPU/wall ratio means the figure is contention-bound.
train:  tokens_per_s = batch*seq / median step time; a step is forward, backward,
        global-norm clipping, AdamW and the bias update on one random batch.
train-hf: the same step on a Hugging Face folder, in the independent reference
        of tests/hf/hf_reference.py (its Model, autograd, torch.optim.AdamW).
decode: tokens_per_s = generated tokens / time of the one-token steps (the
        prompt is prefilled once, timed separately as prefill_ms).
"""
import os
import sys

if "OPENBLAS_CORETYPE" not in os.environ:
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"   # must precede the first torch import

PEER_MALLOC_TUNED = os.environ.get("MYRIAD_PEER_MALLOC", "tuned") != "default"
_THP_SET = "glibc.malloc.hugetlb" in os.environ.get("GLIBC_TUNABLES", "")
if __name__ == "__main__" and PEER_MALLOC_TUNED and not _THP_SET:
    # glibc reads its tunables only at process start: re-exec once with
    # transparent huge pages for malloc's mmap'd blocks (see tune_malloc).
    prev = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = (prev + ":" if prev else "") + "glibc.malloc.hugetlb=1"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import argparse  # noqa: E402
import ctypes  # noqa: E402


def tune_malloc():
    """Keeps freed memory in glibc's heap instead of returning it to the kernel.

    PyTorch on CPU allocates its activations afresh every step; with glibc's
    defaults, blocks of a few MB and up are mmap'd and unmapped each time, and
    page faults on this VM are expensive: re-touching them cost ~45% of a
    moe_small step and ~40% of a gpt2_dense step. The usual PyTorch-on-CPU
    advice is a caching allocator (jemalloc/tcmalloc, not installed here); we
    get the same effect from glibc: mallopt keeps blocks up to 32 MiB (glibc's
    ceiling) in the heap, and GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (set by the
    re-exec at the top of this file) backs the larger mmap'd blocks (logits,
    embedding gradients) with transparent huge pages. The peer thus runs its
    best ordinary configuration. MYRIAD_PEER_MALLOC=default turns both off.
    """
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    ok = libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
    ok &= libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1) == 1
    ok &= libc.mallopt(M_TOP_PAD, 256 << 20) == 1
    return bool(ok)


MALLOC_TUNED = PEER_MALLOC_TUNED and tune_malloc()

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from reference import (MyriadRef, Trainer, apply_rope, as_leaves, combine_weights,  # noqa: E402
                       load_config, rms_norm, router_scores, select_experts, swiglu)


def openblas_corename():
    """The OpenBLAS kernel family actually loaded in this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
        for p in sorted(paths):
            lib = ctypes.CDLL(p)
            if hasattr(lib, "openblas_get_corename"):
                lib.openblas_get_corename.restype = ctypes.c_char_p
                return lib.openblas_get_corename().decode()
    except OSError:
        pass
    return None


def environment(threads):
    return {"threads": threads, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "openblas_corename": openblas_corename(), "malloc_tuned": MALLOC_TUNED,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
            "torch_version": torch.__version__}


# ----------------------------------------------------------------------------
# KV-cached inference (main model only; MTP modules are training-only)
# ----------------------------------------------------------------------------

class KVCacheDecoder:
    """Incremental forward of the reference model with per-layer K/V caches.

    K is cached after RoPE. feed(tokens, pos) runs n new tokens at absolute
    positions pos..pos+n-1 against everything cached before them.
    """

    def __init__(self, model: MyriadRef, params, buffers, max_len):
        c = model.cfg
        if max_len > c.max_seq_len:
            raise ValueError(f"[decode] {max_len} positions exceed model.max_seq_len {c.max_seq_len}")
        self.model, self.p, self.bufs, self.c = model, params, buffers, c
        shape = (c.n_kv_heads, max_len, c.head_dim)
        self.k_cache = [torch.zeros(shape) for _ in range(c.n_layers)]
        self.v_cache = [torch.zeros(shape) for _ in range(c.n_layers)]

    def _moe(self, prefix, x):
        """MoE on x [n, C]; a single token runs only its K experts."""
        c, p = self.c, self.p
        s = router_scores(x, p[prefix + "mlp.gate.weight"], c.score_func)
        sel = select_experts(s, self.bufs[prefix + "mlp.gate.e_score_correction_bias"], c.top_k)
        w = combine_weights(s, sel)
        out = torch.zeros_like(x)
        if x.shape[0] == 1:
            for slot, e in enumerate(sel[0].tolist()):
                ep = f"{prefix}mlp.experts.{e}."
                out += w[0, slot] * swiglu(x, p[ep + "gate_proj.weight"], p[ep + "up_proj.weight"],
                                           p[ep + "down_proj.weight"])
        else:
            for e in range(c.n_routed_experts):
                tok, slot = (sel == e).nonzero(as_tuple=True)
                if tok.numel():
                    ep = f"{prefix}mlp.experts.{e}."
                    y = swiglu(x.index_select(0, tok), p[ep + "gate_proj.weight"], p[ep + "up_proj.weight"],
                               p[ep + "down_proj.weight"])
                    out.index_add_(0, tok, y * w[tok, slot].unsqueeze(-1))
        if c.n_shared_experts > 0:
            sp = prefix + "mlp.shared_experts."
            out += swiglu(x, p[sp + "gate_proj.weight"], p[sp + "up_proj.weight"], p[sp + "down_proj.weight"])
        return out

    @torch.no_grad()
    def feed(self, tokens, pos, all_logits=False):
        """tokens: int64 [n]. Returns logits [V] of the last token (or [n, V])."""
        c, p, m = self.c, self.p, self.model
        n, H, Hkv, D = tokens.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        end = pos + n
        cos, sin = m.cos[pos:end], m.sin[pos:end]
        h = F.embedding(tokens, p["model.embed_tokens.weight"])                 # [n, C]
        mask = None
        if n > 1:
            qpos = torch.arange(pos, end)[:, None]
            mask = torch.arange(end)[None, :] > qpos                            # [n, end]
        for l in range(c.n_layers):
            pre = f"model.layers.{l}."
            a = rms_norm(h, p[pre + "input_layernorm.weight"], c.norm_eps)
            q = apply_rope(F.linear(a, p[pre + "self_attn.q_proj.weight"]).view(n, H, D).transpose(0, 1), cos, sin)
            k = apply_rope(F.linear(a, p[pre + "self_attn.k_proj.weight"]).view(n, Hkv, D).transpose(0, 1), cos, sin)
            v = F.linear(a, p[pre + "self_attn.v_proj.weight"]).view(n, Hkv, D).transpose(0, 1)
            self.k_cache[l][:, pos:end] = k
            self.v_cache[l][:, pos:end] = v
            keys, vals = self.k_cache[l][:, :end], self.v_cache[l][:, :end]       # [Hkv, end, D]
            qg = q.reshape(Hkv, (H // Hkv) * n, D)       # query heads grouped by their kv head
            scores = torch.matmul(qg, keys.transpose(1, 2)) / (D ** 0.5)       # [Hkv, G*n, end]
            if mask is not None:
                scores = scores.view(Hkv, H // Hkv, n, end).masked_fill(mask, float("-inf")).view(Hkv, -1, end)
            att = torch.matmul(torch.softmax(scores, -1), vals).view(H, n, D).transpose(0, 1).reshape(n, H * D)
            h = h + F.linear(att, p[pre + "self_attn.o_proj.weight"])
            f = rms_norm(h, p[pre + "post_attention_layernorm.weight"], c.norm_eps)
            if l >= c.n_dense_layers:
                h = h + self._moe(pre, f)
            else:
                h = h + swiglu(f, p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"],
                               p[pre + "mlp.down_proj.weight"])
        if not all_logits:
            h = h[-1:]
        logits = F.linear(rms_norm(h, p["model.norm.weight"], c.norm_eps), m.head_weight(p))
        return logits if all_logits else logits[0]


def greedy_decode(decoder, prompt, n_new):
    """Prefills `prompt` [P], then generates n_new tokens one at a time.

    Returns (generated token ids, prefill seconds, per-token seconds list).
    """
    t0 = time.perf_counter()
    logits = decoder.feed(prompt, 0)
    prefill_s = time.perf_counter() - t0
    out, times, pos = [], [], prompt.shape[0]
    nxt = int(torch.argmax(logits))
    for _ in range(n_new):
        t0 = time.perf_counter()
        logits = decoder.feed(torch.tensor([nxt]), pos)
        times.append(time.perf_counter() - t0)
        out.append(nxt)
        pos += 1
        nxt = int(torch.argmax(logits))
    return out, prefill_s, times


# ----------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------

def time_steps(step, total, warmup, B, T):
    """Runs step(s) -> loss for s in range(total), timing each; the fields of
    the result line that every training mode shares."""
    times, cpu_times, losses = [], [], []
    for s in range(total):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step(s)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(float(loss))
        if s >= warmup:
            times.append(dt)
            cpu_times.append(dc)
        print(f"step {s + 1}/{total}: {dt * 1e3:.1f} ms loss {float(loss):.4f}"
              + ("" if s >= warmup else " (warmup)"), file=sys.stderr)
    med = statistics.median(times)
    return {"batch": B, "seq": T, "steps": total - warmup, "warmup": warmup,
            "tokens_per_s": B * T / med, "step_ms_median": med * 1e3, "step_ms_min": min(times) * 1e3,
            "step_cpu_ms_median": statistics.median(cpu_times) * 1e3, "final_loss": losses[-1]}


def cmd_train(args):
    mcfg, tcfg, _ = load_config(args.config, args.set, need_train=True)
    B = args.batch or tcfg.batch_size
    T = args.seq or tcfg.seq_len
    total = args.warmup + args.steps
    tcfg = replace(tcfg, batch_size=B, seq_len=T, grad_accum=1, steps=max(total, 1),
                   warmup_steps=min(tcfg.warmup_steps, max(total - 1, 0)))
    if T > mcfg.max_seq_len:
        raise SystemExit(f"[train] --seq {T} exceeds model.max_seq_len {mcfg.max_seq_len}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(tcfg.seed)
    gen = torch.Generator().manual_seed(tcfg.seed)
    model = MyriadRef(mcfg)
    params = as_leaves(model.init_params(gen))
    buffers = model.init_buffers()
    trainer = Trainer(model, params, buffers, tcfg)
    tokens = torch.randint(0, mcfg.vocab_size, (total, B, T + 1), generator=gen)

    def step(s):
        if args.autocast == "bf16":
            # PyTorch's own mixed precision on CPU: matmuls in bf16 under autocast.
            with torch.cpu.amp.autocast(dtype=torch.bfloat16):
                return trainer.step([tokens[s]])[0]
        return trainer.step([tokens[s]])[0]

    timed = time_steps(step, total, args.warmup, B, T)
    result = {"bench": "train", "peer": "pytorch", "config": os.path.basename(args.config), **timed,
              "params": sum(x.numel() for x in params.values()), "autocast": args.autocast}
    result.update(environment(args.threads))
    print(json.dumps(result), flush=True)


def cmd_train_hf(args):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "hf"))
    import hf_reference as ref  # noqa: E402
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(1234)
    model = ref.Model(args.hf)
    names = model.trainable()
    for n in names:
        model.w[n].requires_grad_(True)
    opt = torch.optim.AdamW([model.w[n] for n in names], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    B, T = args.batch, args.seq
    total = args.warmup + args.steps
    tokens = torch.randint(0, model.spec.vocab, (total, B, T + 1), generator=gen)

    def step(s):
        opt.zero_grad(set_to_none=True)
        loss = model.losses(tokens[s])["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_([model.w[n] for n in names], 1.0)
        opt.step()
        return loss

    timed = time_steps(step, total, args.warmup, B, T)
    result = {"bench": "train", "peer": "pytorch", "model": os.path.basename(os.path.normpath(args.hf)), **timed,
              "params": sum(model.w[n].numel() for n in names)}
    result.update(environment(args.threads))
    print(json.dumps(result), flush=True)


def cmd_decode_hf(args):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "hf"))
    import hf_reference as ref  # noqa: E402
    torch.set_num_threads(args.threads)
    model = ref.Model(args.hf)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, model.spec.vocab, (args.prompt_len,), generator=gen).tolist()
    best, prefill = float("inf"), float("inf")
    with torch.no_grad():
        for _ in range(2):  # warm-up, then timed
            cache = ref.Cache()
            t0 = time.perf_counter()
            logits, _ = model.forward(torch.tensor([prompt]), cache=cache, absorbed=args.absorbed)
            t1 = time.perf_counter()
            for _ in range(args.tokens):
                t = int(logits[0, -1].argmax())
                logits, _ = model.forward(torch.tensor([[t]]), cache=cache, absorbed=args.absorbed)
            t2 = time.perf_counter()
            best, prefill = min(best, t2 - t1), min(prefill, t1 - t0)
    result = {"bench": "decode", "peer": "pytorch", "model": os.path.basename(os.path.normpath(args.hf)),
              "tokens": args.tokens, "prompt_len": args.prompt_len, "tokens_per_s": args.tokens / best,
              "prefill_ms": prefill * 1e3, "absorbed": args.absorbed}
    result.update(environment(args.threads))
    print(json.dumps(result), flush=True)


def cmd_decode(args):
    mcfg, _, _ = load_config(args.config, args.set, need_train=False)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = MyriadRef(mcfg)
    params = model.init_params(gen)
    buffers = model.init_buffers()
    prompt = torch.randint(0, mcfg.vocab_size, (args.prompt_len,), generator=gen)
    max_len = args.prompt_len + args.tokens
    # Warm-up pass (caches, allocator, lazy library init), then the measured one.
    greedy_decode(KVCacheDecoder(model, params, buffers, max_len), prompt, min(4, args.tokens))
    c0 = time.process_time()
    out, prefill_s, times = greedy_decode(KVCacheDecoder(model, params, buffers, max_len), prompt, args.tokens)
    cpu_s = time.process_time() - c0
    result = {"bench": "decode", "peer": "pytorch", "config": os.path.basename(args.config),
              "prompt_len": args.prompt_len, "tokens": args.tokens,
              "tokens_per_s": len(times) / sum(times), "token_ms_median": statistics.median(times) * 1e3,
              "prefill_ms": prefill_s * 1e3, "cpu_s_per_wall_s": cpu_s / (prefill_s + sum(times)),
              "last_token": out[-1] if out else None}
    result.update(environment(args.threads))
    print(json.dumps(result), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="time training steps")
    tr.add_argument("--config", required=True)
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    tr.add_argument("--steps", type=int, default=5, help="timed steps")
    tr.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    tr.add_argument("--threads", type=int, default=1)
    tr.add_argument("--batch", type=int, default=None, help="default: train.batch_size")
    tr.add_argument("--seq", type=int, default=None, help="default: train.seq_len")
    tr.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: run the step under torch.cpu.amp.autocast(bfloat16)")
    th = sub.add_parser("train-hf", help="time training steps of a Hugging Face folder (tests/hf/hf_reference.py)")
    th.add_argument("--hf", required=True)
    th.add_argument("--steps", type=int, default=5)
    th.add_argument("--warmup", type=int, default=2)
    th.add_argument("--threads", type=int, default=1)
    th.add_argument("--batch", type=int, default=8)
    th.add_argument("--seq", type=int, default=256)
    dh = sub.add_parser("decode-hf", help="time batch-1 greedy decode of a Hugging Face folder (hf_reference.py)")
    dh.add_argument("--hf", required=True)
    dh.add_argument("--tokens", type=int, default=32)
    dh.add_argument("--prompt-len", type=int, default=16)
    dh.add_argument("--threads", type=int, default=1)
    dh.add_argument("--seed", type=int, default=1234)
    dh.add_argument("--absorbed", action="store_true", help="MLA: the absorbed decode (compressed cache)")
    de = sub.add_parser("decode", help="time batch-1 greedy decode with a KV cache")
    de.add_argument("--config", required=True)
    de.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    de.add_argument("--tokens", type=int, default=32, help="tokens to generate (timed)")
    de.add_argument("--prompt-len", type=int, default=16)
    de.add_argument("--threads", type=int, default=1)
    de.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    if args.cmd in ("train", "train-hf"):
        if args.steps < 1:
            raise SystemExit("[train] --steps must be >= 1")
        cmd_train(args) if args.cmd == "train" else cmd_train_hf(args)
    else:
        if args.tokens < 1 or args.prompt_len < 1:
            raise SystemExit("[decode] --tokens and --prompt-len must be >= 1")
        cmd_decode(args) if args.cmd == "decode" else cmd_decode_hf(args)


if __name__ == "__main__":
    main()
