#!/usr/bin/env bash
# Fine-tuning an imported model (train.init_from / `myriad train --hf`;
# docs/open-models.md): tiny Hugging Face folders (make_tiny.py: Qwen3-MoE,
# and a tied Llama) trained from with a config that has no [model] section.
#  - 40 steps on one rank lower the validation loss of the folder's model
#    on the data (hf_check loss: trainer.h's Evaluate, as `myriad eval`);
#  - the first step's loss from the same folder is the same under dp2, tp2,
#    and for the MoE ep2, pp2 and dp2 with ZeRO-3, as on one rank (<= 1e-5
#    relative); a folder of the same
#    family drawn with another seed differs (so the comparison sees the
#    weights);
#  - a run directory works as the source too (a fine-tune of the fine-tune,
#    one rank and tp2 agree), and the fine-tune starts at step 1 with a
#    fresh optimizer (its first loss is the source's loss on that batch);
#  - a run directory written by `myriad import` as the source: the same
#    first-step loss as the folder (one rank and tp2), its hf record kept in
#    the fine-tune's checkpoints; and import -> export gives the folder back;
#  - a [model] key that contradicts the folder, or out_dir = init_from, is
#    refused with one line naming it; a training-only key is accepted.
# Usage: hf_finetune.sh BUILD_DIR SOURCE_DIR MYRIAD_BINARY
source "$(dirname "$0")/dist_lib.bash" "$@"
CHECK="$BUILD/hf/hf_check"
[ -x "$CHECK" ] || { echo "FAIL: $CHECK is not built"; exit 1; }
# Vocabulary 512: the tiny data's tokenizer.
"$PY" "$SRC/tests/hf/make_tiny.py" --family qwen3_moe --vocab 512 --mlp-only-layers 0 --out "$WORK/qm" >/dev/null
"$PY" "$SRC/tests/hf/make_tiny.py" --family qwen3_moe --vocab 512 --mlp-only-layers 0 --seed 1 --out "$WORK/qm-seed1" >/dev/null
"$PY" "$SRC/tests/hf/make_tiny.py" --family llama --vocab 512 --tie --dtype bf16 --out "$WORK/llama" >/dev/null
CFG="$WORK/finetune.toml"
cat >"$CFG" <<EOF
# A fine-tune: the model is train.init_from's.
[train]
seq_len = 32
batch_size = 4
grad_accum = 2
steps = 40
lr = 2e-3
warmup_steps = 4
log_every = 1
eval_every = 0
ckpt_every = 0
precision = "fp32"
[data]
dir = "$WORK/data"
EOF
S=()

# first_loss NAME: the loss logged at step 1 of $WORK/NAME.
first_loss() { "$PY" -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if l.strip()][0]['loss'])" "$WORK/$1/metrics.jsonl"; }
# same_first_step A B: step-1 losses within 1e-5 relative.
same_first_step() {
  local a b
  a=$(first_loss "$1") b=$(first_loss "$2")
  if "$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)" "$a" "$b"
  then pass "$2: first-step loss $b == one rank's $a"
  else fail "$2: first-step loss $b, one rank $a"; fi
}

echo "== one rank: the loss goes down"
for m in qm llama; do
  train "$m-1" 1 --hf "$WORK/$m" || continue
  before=$("$CHECK" loss "$WORK/$m" "$WORK/data" 4 32 8)
  after=$("$CHECK" loss "$WORK/$m-1" "$WORK/data" 4 32 8)
  if "$PY" -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.9 * float(sys.argv[1]) else 1)" "$before" "$after"
  then pass "$m: validation loss $before (the folder) -> $after after 40 steps"
  else fail "$m: validation loss $before -> $after (not lowered by 10%)"; fi
  grep -q '"init_from"' "$WORK/$m-1/step_00000040/manifest.json" && pass "$m: the manifest records init_from" ||
    fail "$m: no init_from in the manifest"
  grep -q "initialised from $WORK/$m (a Hugging Face folder" "$WORK/$m-1.log" && pass "$m: logged as a fine-tune" ||
    fail "$m: no 'initialised from' line: $(tail -3 "$WORK/$m-1.log")"
done

echo "== the first step under other layouts"
for m in qm llama; do
  train "$m-dp2" 2 --hf "$WORK/$m" --set train.steps=1 --set parallel.dp=2 && same_first_step "$m-1" "$m-dp2"
  train "$m-tp2" 2 --hf "$WORK/$m" --set train.steps=1 --set parallel.tp=2 && same_first_step "$m-1" "$m-tp2"
done
train qm-ep2 2 --hf "$WORK/qm" --set train.steps=1 --set parallel.ep=2 && same_first_step qm-1 qm-ep2
train qm-pp2 2 --hf "$WORK/qm" --set train.steps=1 --set parallel.pp=2 && same_first_step qm-1 qm-pp2
train qm-z3 2 --hf "$WORK/qm" --set train.steps=1 --set parallel.dp=2 --set parallel.zero=3 && same_first_step qm-1 qm-z3
train qm-s1 1 --hf "$WORK/qm-seed1" --set train.steps=1 || true
if [ -f "$WORK/qm-s1/metrics.jsonl" ]; then
  r=$(first_loss qm-s1) f=$(first_loss qm-1)
  [ "$r" != "$f" ] && pass "the same family drawn with another seed starts elsewhere ($r vs $f)" ||
    fail "another folder gives the same first loss: the comparison does not see the weights"
fi

echo "== a run directory as the source"
train ft2-1 1 --init-from "$WORK/qm-1" --set train.steps=1 &&
  train ft2-tp2 2 --init-from "$WORK/qm-1" --set train.steps=1 --set parallel.tp=2 && same_first_step ft2-1 ft2-tp2
# Its first step is the source model's loss on the first batch: it must be
# below the folder's first loss (it starts trained), and start at step 1.
if [ -f "$WORK/ft2-1/metrics.jsonl" ]; then
  "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$(first_loss ft2-1)" "$(first_loss qm-1)" &&
    pass "the fine-tune of the fine-tune starts from its weights ($(first_loss ft2-1) < $(first_loss qm-1))" ||
    fail "the run-directory source did not give its weights"
  grep -q '"step":1,' "$WORK/ft2-1/metrics.jsonl" && pass "and at step 1 (a fresh optimizer)" || fail "not at step 1"
fi

echo "== the folder's own tokenizer: prepare --tokenizer, fine-tune, export"
# A byte-level BPE tokenizer.json (GPT-2's byte alphabet, 200 merges learned
# from the corpus by counting pairs, <|endoftext|> as eos) in the folder.
"$PY" - "$WORK/qm" "$WORK/corpus" <<'PYEOF'
import collections, json, os, sys
folder, corpus = sys.argv[1], sys.argv[2]
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_char = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {byte_char[b]: b for b in range(256)}
words = collections.Counter()
for name in sorted(os.listdir(corpus)):
    for w in open(os.path.join(corpus, name), encoding="utf-8", errors="replace").read().split():
        words[tuple(byte_char[b] for b in (" " + w).encode())] += 1
merges = []
while len(merges) < 200:
    pairs = collections.Counter()
    for w, c in words.items():
        for a, b in zip(w, w[1:]):
            pairs[a, b] += c
    (a, b), _ = pairs.most_common(1)[0]
    merges.append(a + " " + b)
    vocab.setdefault(a + b, len(vocab))
    new = collections.Counter()
    for w, c in words.items():
        out, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                out.append(a + b); i += 2
            else:
                out.append(w[i]); i += 1
        new[tuple(out)] += c
    words = new
eos = len(vocab)
tok = {"version": "1.0", "normalizer": None,
       "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                         "rstrip": False, "normalized": False, "special": True}],
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab, "merges": merges}}
json.dump(tok, open(os.path.join(folder, "tokenizer.json"), "w"))
json.dump({"eos_token": "<|endoftext|>", "bos_token": None}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
PYEOF
if "$MYRIAD" prepare --input "$WORK/corpus" --out "$WORK/data-hf" --tokenizer "$WORK/qm" --val-fraction 0.1 \
     >/dev/null 2>"$WORK/prepare-hf.log"; then
  grep -q "\"tokenizer\": \"$WORK/qm\"" "$WORK/data-hf/data.json" && pass "prepare --tokenizer records the folder's tokenizer" ||
    fail "data.json: $(grep tokenizer "$WORK/data-hf/data.json")"
  train qm-own 1 --hf "$WORK/qm" --set "data.dir=$WORK/data-hf" --set train.steps=10 &&
    grep -q "\"tokenizer\": \"$WORK/qm\"" "$WORK/qm-own/step_00000010/manifest.json" &&
    pass "the fine-tune's manifest names the folder's tokenizer" || fail "qm-own: the manifest's tokenizer is not the folder's"
  if "$MYRIAD" export "$WORK/qm-own" --hf "$WORK/qm-own-hf" 2>"$WORK/export-own.log" &&
     cmp -s "$WORK/qm/tokenizer.json" "$WORK/qm-own-hf/tokenizer.json" &&
     cmp -s "$WORK/qm/tokenizer_config.json" "$WORK/qm-own-hf/tokenizer_config.json"; then
    pass "its export carries the folder's tokenizer.json and tokenizer_config.json"
  else fail "export of the fine-tune: $(tail -2 "$WORK/export-own.log")"; fi
else fail "prepare --tokenizer: $(tail -2 "$WORK/prepare-hf.log")"; fi

echo "== a run directory written by myriad import"
if "$MYRIAD" import "$WORK/qm" --out "$WORK/qm-imported" >/dev/null 2>"$WORK/import.log"; then
  train imp-1 1 --init-from "$WORK/qm-imported" --set train.steps=1 && same_first_step qm-1 imp-1
  train imp-tp2 2 --init-from "$WORK/qm-imported" --set train.steps=1 --set parallel.tp=2 && same_first_step qm-1 imp-tp2
  grep -q '"architecture": "Qwen3MoeForCausalLM"' "$WORK/imp-1/step_00000001/manifest.json" &&
    pass "the fine-tune's checkpoint carries the imported model's hf record (eos ids, architecture)" ||
    fail "no hf record in the fine-tune's manifest"
  if "$MYRIAD" export "$WORK/qm-imported" --hf "$WORK/qm-imported-hf" 2>"$WORK/export-imp.log" &&
     out=$("$CHECK" same "$WORK/qm" "$WORK/qm-imported-hf" 2>&1); then
    pass "import -> export gives the folder back: $out"
  else fail "import -> export: $(tail -1 "$WORK/export-imp.log") $out"; fi
else fail "myriad import: $(tail -2 "$WORK/import.log")"; fi

echo "== refusals"
expect_error "a [model] key that contradicts the folder" \
  "\[model\] conflicts with the model of train.init_from=$WORK/qm: model.d_model=48 \(the model's: 64\)" \
  "$MYRIAD" train -c "$CFG" --hf "$WORK/qm" --set model.d_model=48 --set "train.out_dir=$WORK/bad"
expect_error "out_dir = init_from" "train.init_from and train.out_dir are the same folder" \
  "$MYRIAD" train -c "$CFG" --init-from "$WORK/qm-1" --set "train.out_dir=$WORK/qm-1"
expect_error "a missing source" "train.init_from=$WORK/nothing: not found" \
  "$MYRIAD" train -c "$CFG" --hf "$WORK/nothing" --set "train.out_dir=$WORK/bad"
train qm-aux 1 --hf "$WORK/qm" --set train.steps=1 --set model.aux_loss_weight=0.01 &&
  pass "a training-only key (model.aux_loss_weight) may be set"
echo "total $((SECONDS - T0)) s"
finish
