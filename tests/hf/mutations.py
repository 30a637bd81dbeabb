#!/usr/bin/python3
"""Mutation test of check_reference.py (a development aid, not a ctest: ~5 min).

Copies tests/hf and tests/golden to a temporary tree, applies one deliberate bug
to hf_reference.py at a time, runs check_reference.py there and reports whether
some check failed (CAUGHT) or not (MISSED). Every mutation below must be CAUGHT
except those marked behaviour-preserving.

  mutations.py [NAME ...]     (default: all)
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
# (name, text in hf_reference.py, replacement)
M = [
 ("rope sign", "return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)", "return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)"),
 ("rope sign il", "torch.stack((a * cos - b * sin, b * cos + a * sin)", "torch.stack((a * cos + b * sin, b * cos - a * sin)"),
 ("qwen norm ignored", "        if m[\"norm\"]:\n            top = top /", "        if False:\n            top = top /"),
 ("llama o bias", "self.qkv_bias, self.o_bias = ab, ab", "self.qkv_bias, self.o_bias = ab, False"),
 ("greedy feed", "torch.tensor([[t]])", "torch.tensor([[ids[0]]])"),
 ("mtp chain", "            h = x\n", "            h = hidden\n"),
 ("qnorm whole", "q = rms_norm(q, self.w[a + \"q_norm.weight\"], s.eps)", "q = rms_norm(q.flatten(-2), self.w[a + \"q_norm.weight\"].repeat(s.heads), s.eps).view(q.shape)"),
 ("gqa repeat", "k = k.repeat_interleave(rep, dim=1)\n        v = v.repeat_interleave(rep, dim=1)", "k = k.repeat(1, rep, 1, 1)\n        v = v.repeat(1, rep, 1, 1)"),
 ("qnorm after rope", "        q, k = self.rope(q, cs), self.rope(k, cs)\n        if cache", "        q, k = self.rope(q, cs), self.rope(k, cs)\n        if s.qk_norm:\n            q = rms_norm(q, self.w[a + 'q_norm.weight'] * 0 + self.w[a + 'q_norm.weight'].flip(0), s.eps)\n        if cache"),
 ("kv_a split", "c = rms_norm(kv[..., :r], self.w[a + \"kv_a_layernorm.weight\"], MLA_LOWRANK_EPS)   # [B, T, r]\n        k_pe = self.rope(kv[..., r:].unsqueeze(1), cs)", "c = rms_norm(kv[..., dr:], self.w[a + \"kv_a_layernorm.weight\"], MLA_LOWRANK_EPS)\n        k_pe = self.rope(kv[..., :dr].unsqueeze(1), cs)"),
 ("kv_b split", "k = torch.cat((kvh[..., :dn], k_pe.expand(B, H, T, dr)), dim=-1)\n            v = kvh[..., dn:]", "k = torch.cat((kvh[..., dv:], k_pe.expand(B, H, T, dr)), dim=-1)\n            v = kvh[..., :dv]"),
 ("q split", "q_nope, q_pe = q[..., :dn], q[..., dn:]", "q_pe, q_nope = q[..., :dr], q[..., dr:]"),
 ("mtp concat", "x = torch.cat((rms_norm(e, self.w[p + \"enorm.weight\"], s.eps),\n                           rms_norm(h[:, :n], self.w[p + \"hnorm.weight\"], s.eps)), dim=-1)", "x = torch.cat((rms_norm(h[:, :n], self.w[p + \"hnorm.weight\"], s.eps), rms_norm(e, self.w[p + \"enorm.weight\"], s.eps)), dim=-1)"),
 ("mtp shift", "[tokens[:, k:]]", "[tokens[:, k - 1:T - 1]]"),
 ("mtp prenorm h", "return F.linear(hn, head), hn", "return F.linear(hn, head), h"),
 ("bias ignored", "biased = scores + self.w[", "biased = scores + 0 * self.w["),
 ("group max", ".topk(2, dim=-1).values.sum(dim=-1)", ".max(dim=-1).values"),
 ("weights biased", "wts = scores.gather(1, idx)", "wts = biased.gather(1, idx)"),
 ("no routed scale", "return idx, wts * m[\"scale\"]", "return idx, wts"),
 ("sigmoid in qwen", "probs = torch.softmax(logits, dim=-1)", "probs = torch.sigmoid(logits)"),
 ("sparse step", "(i + 1) % m[\"sparse_step\"] == 0", "i % m[\"sparse_step\"] == 0"),
 ("moe freq", "i >= m[\"first_dense\"] and i % m[\"freq\"] == 0", "i >= m[\"first_dense\"]"),
 ("yarn ramp flip", "out = (inv / factor) * ramp + inv * keep", "out = (inv / factor) * keep + inv * ramp"),
 ("yarn no trunc", "lo, hi = math.floor(lo), math.ceil(hi)", "pass"),
 ("llama3 medium", "out[i] = (1.0 - s) * inv[i] / factor + s * inv[i]", "out[i] = s * inv[i] / factor + (1.0 - s) * inv[i]"),
 ("mscale once", "s = s * m * m", "s = s * m"),
 ("no attn factor", "f = r[\"attention_factor\"]", "f = 1.0"),
 ("mask ignores past", "qi = torch.arange(T)[:, None] + past", "qi = torch.arange(T)[:, None] + 0 * past"),
 ("absorbed no scale", "torch.einsum(\"bhtd,bsd->bhts\", q_pe, cache_pe)) * s.scale", "torch.einsum(\"bhtd,bsd->bhts\", q_pe, cache_pe))"),
 ("qwen2 o bias", "self.qkv_bias, self.o_bias = True, False", "self.qkv_bias, self.o_bias = True, True"),
 ("lowrank eps", "MLA_LOWRANK_EPS = 1e-6", "MLA_LOWRANK_EPS = 1e-1"),
 ("loss shift", "tokens[:, shift:shift + n].reshape(-1)", "tokens[:, shift - 1:shift - 1 + n].reshape(-1)"),
 ("no renorm", "wts = wts / (wts.sum(dim=-1, keepdim=True) + 1e-20)", "wts = wts"),
 ("interleave pairs", "a, b = x[..., 0::2], x[..., 1::2]", "a, b = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]"),
 ("yarn attn default", "attn = yarn_mscale(factor)\n", "attn = 1.0\n"),
 ("shared experts off", "out = out + self.mlp(xf, p + \"shared_experts.\")", "out = out"),
 ("tie ignored", "head = self.w[\"model.embed_tokens.weight\"] if s.tie else self.w[\"lm_head.weight\"]", "head = self.w.get(\"lm_head.weight\", self.w[\"model.embed_tokens.weight\"])"),
 ("rope theta ignored", "inv = 1.0 / theta ** (half / dim)", "inv = 1.0 / 10000.0 ** (half / dim)"),
 ("grad fd", "y * wts[rows, slot][:, None]", "y * wts[rows, slot][:, None].detach()"),
 ("topk group ignore", "cand = biased.masked_fill(~eligible, float(\"-inf\"))", "cand = biased"),
 ("mla absorbed uv", "o = torch.einsum(\"bhtr,hvr->bhtv\", o_c, w_uv)", "o = torch.einsum(\"bhtr,hvr->bhtv\", o_c, w_uv.flip(1))"),
]

# Mutations that do not change behaviour (MISSED is the right answer).
EQUIVALENT = {"tie ignored"}


def main(only):
    missed = []
    with tempfile.TemporaryDirectory(prefix="hf_ref_mut_") as tmp:
        for name, old, new in M:
            if only and name not in only:
                continue
            tree = os.path.join(tmp, "tree")
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(HERE, os.path.join(tree, "hf"), ignore=shutil.ignore_patterns("js", "__pycache__"))
            shutil.copytree(os.path.join(TESTS, "golden"), os.path.join(tree, "golden"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            p = os.path.join(tree, "hf", "hf_reference.py")
            with open(p) as f:
                s = f.read()
            if s.count(old) != 1:
                print(f"?      {name}: the text to mutate occurs {s.count(old)} times")
                missed.append(name)
                continue
            with open(p, "w") as f:
                f.write(s.replace(old, new))
            r = subprocess.run([sys.executable, os.path.join(tree, "hf", "check_reference.py")],
                               capture_output=True, text=True)
            fails = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("FAIL") or "Error" in ln]
            caught = r.returncode != 0
            print(f"{'CAUGHT' if caught else 'MISSED'} {name}: {(fails[-1] if fails else '')[:140]}")
            if not caught and name not in EQUIVALENT:
                missed.append(name)
    print(f"{len(missed)} unexpected: {missed}" if missed else "every mutation caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
