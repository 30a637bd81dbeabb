#!/usr/bin/python3
"""The Python half of tests/hf/export_roundtrip.sh (export -> the independent reference).

  export_check.py make DIR        writes the variant folders (make_tiny.py, in one process)
                                  into DIR/<name> and prints one line per folder:
                                  "<name> <myriad export options>"
  export_check.py compare SRC OUT NAME...
                                  for each NAME: hf_reference.py's logits and loss of
                                  SRC/NAME and OUT/NAME (the exported copy) on the same
                                  batch must be equal (bit for bit: the same weights
                                  and an equivalent config.json); a line per folder
  export_check.py greedy FOLDER PROMPT N [LOGITS]
                                  prints "<ids> <smallest top1-top2 margin> <logits diff>"
                                  of the reference's greedy decode of N tokens after
                                  PROMPT (comma-separated ids); with LOGITS (raw float32
                                  [N, V], Myriad's rows for the same ids), the largest
                                  |ours - reference| / max(1, max |reference|) over the
                                  rows both decoded ("-" without LOGITS)
  export_check.py bias FOLDER     prints the largest |e_score_correction_bias| of FOLDER
                                  and how many such tensors it holds

Nothing here uses Myriad's code: the reference reads the folders as Hugging Face
would (tests/hf/README.md).
"""
import contextlib
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_reference as ref  # noqa: E402
import make_tiny  # noqa: E402

# name, make_tiny options, myriad export options. Every family the export
# writes, each rope scaling, tied and untied, the three dtypes, shards in and
# out; DeepSeek-V3 with q_b_proj and q_proj, interleaved and rotate-half RoPE,
# an MTP layer and none.
VARIANTS = [
    ("llama", ["--family", "llama"], []),
    ("llama_llama3_tied", ["--family", "llama", "--rope-scaling", "llama3", "--tie"], []),
    ("llama_yarn_bf16_shards", ["--family", "llama", "--rope-scaling", "yarn", "--dtype", "bf16", "--shards", "3"],
     ["--dtype", "bf16"]),
    ("llama_linear_fp16", ["--family", "llama", "--rope-scaling", "linear", "--dtype", "fp16"], ["--dtype", "f16"]),
    ("qwen2", ["--family", "qwen2"], ["--max-shard-size", "60KB"]),
    ("qwen3_bf16_as_f32", ["--family", "qwen3", "--dtype", "bf16"], []),
    ("qwen3_moe", ["--family", "qwen3_moe", "--mlp-only-layers", "0"], []),
    ("qwen3_moe_dense_between", ["--family", "qwen3_moe"], []),  # make_tiny's mlp_only_layers [1]
    ("qwen3_moe_step2_bf16_tied", ["--family", "qwen3_moe", "--layers", "2", "--mlp-only-layers", "",
                                   "--decoder-sparse-step", "2", "--norm-topk-prob", "0", "--tie", "--dtype", "bf16"],
     ["--dtype", "bf16", "--max-shard-size", "100KB"]),
    ("deepseek_v3", ["--family", "deepseek_v3"], []),  # q_lora_rank 32, yarn mscale, interleaved, MTP 1
    ("deepseek_v3_q_proj", ["--family", "deepseek_v3", "--q-lora-rank", "0"], []),
    ("deepseek_v3_bf16_shards", ["--family", "deepseek_v3", "--dtype", "bf16", "--shards", "3"],
     ["--dtype", "bf16", "--max-shard-size", "300KB"]),
    ("deepseek_v3_rotate_half", ["--family", "deepseek_v3", "--no-rope-interleave"], []),
    ("deepseek_v3_no_mtp_no_yarn", ["--family", "deepseek_v3", "--mtp", "0", "--set", "rope_scaling=null"], []),
]


def make(root):
    with contextlib.redirect_stdout(sys.stderr):  # (stdout is the list)
        for name, tiny, export in VARIANTS:
            make_tiny.main(tiny + ["--out", os.path.join(root, name)])
    for name, _, export in VARIANTS:
        print(name, " ".join(export))


def compare(src, out, names):
    bad = 0
    for name in names:
        a = ref.Model(os.path.join(src, name))
        b = ref.Model(os.path.join(out, name))
        tokens = ref.default_tokens(a.spec.vocab, 0)
        with torch.no_grad():
            ra, rb = a.losses(tokens), b.losses(tokens)
        diff = float((ra["logits"] - rb["logits"]).abs().max())
        same = torch.equal(ra["logits"], rb["logits"]) and torch.equal(ra["loss"], rb["loss"])
        print(f"{'ok' if same else 'FAIL'}: {name}: reference logits of the export vs the original: "
              f"max |diff| {diff:.3g}, loss {float(ra['loss']):.6f} vs {float(rb['loss']):.6f}")
        bad += not same
    return 1 if bad else 0


def greedy(folder, prompt, n, logits=None):
    m = ref.Model(folder)
    with torch.no_grad():
        ids, rows, margins = m.generate([int(v) for v in prompt.split(",")], int(n))
    diff = "-"
    if logits:
        ours = torch.from_numpy(np.fromfile(logits, dtype="<f4")).reshape(rows.shape)
        diff = f"{float((ours - rows).abs().max() / max(1.0, float(rows.abs().max()))):.3g}"
    print(",".join(str(i) for i in ids), f"{min(margins):.3g}", diff)
    return 0


def bias(folder):
    _, tensors = ref.load_folder(folder)
    b = [t.float().abs().max().item() for n, t in tensors.items() if n.endswith("e_score_correction_bias")]
    print(f"{max(b) if b else 0:.3g} {len(b)}")
    return 0


def main(argv):
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    try:
        if argv[0] == "make":
            make(argv[1])
            return 0
        if argv[0] == "compare":
            return compare(argv[1], argv[2], argv[3:])
        if argv[0] == "greedy":
            return greedy(*argv[1:])
        if argv[0] == "bias":
            return bias(argv[1])
    except ref.ReferenceError as e:
        print(f"[export_check] error: {e}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
