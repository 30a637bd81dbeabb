#!/usr/bin/env bash
# The post-training experiments of docs/rl.md, end to end on this machine:
#   scripts/rl_experiments.sh [MYRIAD] [OUT]      (defaults: build/myriad runs/rl-exp)
# 1. task text (`myriad tasks --text`, training splits only) -> a tokenizer and shards;
# 2. a small MoE pretrained on it (configs/arith-pretrain.toml);
# 3. arithmetic: GRPO vs SFT on the references, equal problems (configs/rl-arith.toml);
# 4. teachers: GRPO on Python, GRPO on both domains (the "mixed" teacher);
# 5. students from the pretrained model at equal compute: MOPD from the two
#    domain teachers, SFT on those teachers' samples, MOPD from the mixed teacher
#    (600 and 1200 iterations at a constant rate, 1200 with a cosine decay);
# 6. OUT/summary.json, a Markdown table on stdout, docs/img/rl-reward.png.
# Each stage is skipped when its run directory already finished (rerun to continue).
set -euo pipefail
M="${1:-build/myriad}"
OUT="${2:-runs/rl-exp}"
STAGES="${STAGES:-pre rl sft teachers students}"
mkdir -p "$OUT/corpus"
has() { [[ " $STAGES " == *" $1 "* ]]; }
done_run() { [ -f "$OUT/$1/done" ]; }
run() {  # run NAME VERB ARGS...: one post-training run, logged to OUT/NAME.log
  local name="$1" verb="$2"; shift 2
  if done_run "$name"; then echo "== $name: done before"; return; fi
  echo "== $name: myriad $verb $*"
  local t0=$SECONDS
  "$M" "$verb" -c configs/rl-arith.toml --set train.init_from="$OUT/pre" --set train.out_dir="$OUT/$name" "$@" \
    2> >(tee "$OUT/$name.log" | grep -E "^eval|teacher for|error" >&2)
  echo "$((SECONDS - t0))" >"$OUT/$name/done"
}
continue_from() {  # continue_from SRC NAME: NAME starts from SRC's checkpoints (once)
  if [ ! -d "$OUT/$2" ] && done_run "$1"; then cp -r "$OUT/$1" "$OUT/$2" && rm -f "$OUT/$2/done"; fi
}
if has pre && [ ! -f "$OUT/pre/done" ]; then
  "$M" tasks --domain arithmetic --count 20000 --difficulty 1 --seed 1 --text "$OUT/arithmetic.txt"
  "$M" tasks --domain python --count 20000 --difficulty 1 --seed 1 --text "$OUT/python.txt"
  # Documents of 100 problems (prepare splits train/val by document).
  split -l 100 -d -a 4 --additional-suffix=.txt "$OUT/arithmetic.txt" "$OUT/corpus/arith-"
  split -l 300 -d -a 4 --additional-suffix=.txt "$OUT/python.txt" "$OUT/corpus/py-"
  "$M" prepare --input "$OUT/corpus" --out "$OUT/data" --vocab 300 --val-fraction 0.02
  t0=$SECONDS
  "$M" train -c configs/arith-pretrain.toml --set data.dir="$OUT/data" --set train.out_dir="$OUT/pre" ${PRE_ARGS:-}
  echo "$((SECONDS - t0))" >"$OUT/pre/done"
fi
# Python learns at a lower rate (3e-4 overfits the training templates: held-out greedy accuracy falls).
PY=(--set rl.domains=python --set train.seq_len=56 --set train.steps=100 --set train.lr=1e-4 --set train.min_lr=1e-4)
BOTH=(--set rl.domains=arithmetic,python --set train.seq_len=56 --set train.steps=150)
MIXED=("${BOTH[@]}" --set train.lr=2e-4 --set train.min_lr=2e-4)
has rl && run rl-arith rl
has sft && run sft-arith rl --set rl.algorithm=sft
if has teachers; then
  run rl-python rl "${PY[@]}"
  run rl-mixed rl "${MIXED[@]}"
fi
if has students; then
  TEACHERS="arithmetic=$OUT/rl-arith,python=$OUT/rl-python"
  # Equal student compute: 600 iterations each, half of their prompts
  # arithmetic (the arithmetic teacher had 300 iterations of it).
  STUDENT=("${BOTH[@]}" --set train.steps=600 --set rl.eval_every=50 --set train.ckpt_every=100)
  run mopd distill "${STUDENT[@]}" --set distill.teachers="$TEACHERS"
  run sft-teacher rl "${STUDENT[@]}" --set rl.algorithm=sft --set rl.sft_source=teacher --set distill.teachers="$TEACHERS"
  run mopd-mixed distill "${STUDENT[@]}" --set distill.teachers="*=$OUT/rl-mixed"
  # All three for twice as long, equal compute again: the learning rate is
  # constant, so each is its 600-iteration run continued (seeded from its
  # checkpoints; resuming is bitwise equal to running straight through).
  continue_from mopd mopd-1200
  run mopd-1200 distill "${STUDENT[@]}" --set train.steps=1200 --set distill.teachers="$TEACHERS"
  continue_from sft-teacher sft-teacher-1200
  run sft-teacher-1200 rl "${STUDENT[@]}" --set train.steps=1200 --set rl.algorithm=sft --set rl.sft_source=teacher \
    --set distill.teachers="$TEACHERS"
  continue_from mopd-mixed mopd-mixed-1200
  run mopd-mixed-1200 distill "${STUDENT[@]}" --set train.steps=1200 --set distill.teachers="*=$OUT/rl-mixed"
  # The same three over 1200 iterations with the learning rate decayed
  # (cosine, 3e-4 -> 3e-5), from the pretrained model.
  COS=("${STUDENT[@]}" --set train.steps=1200 --set train.min_lr=3e-5)
  run mopd-cos distill "${COS[@]}" --set distill.teachers="$TEACHERS"
  run sft-teacher-cos rl "${COS[@]}" --set rl.algorithm=sft --set rl.sft_source=teacher --set distill.teachers="$TEACHERS"
  run mopd-mixed-cos distill "${COS[@]}" --set distill.teachers="*=$OUT/rl-mixed"
fi
python3 scripts/rl_report.py "$OUT"
if command -v gnuplot >/dev/null && [ -f "$OUT/rl-arith/metrics.jsonl" ]; then
  mkdir -p docs/img
  gnuplot -e "dat='$OUT/reward.dat'; png='docs/img/rl-reward.png'" scripts/rl_plot.gp && echo "wrote docs/img/rl-reward.png"
fi
if command -v gnuplot >/dev/null && [ -f "$OUT/mopd.dat" ]; then
  ta=$(grep -oP '^# teacher rl-arith final arithmetic pass@1: \K[0-9.]+' "$OUT/mopd.dat")
  tp=$(grep -oP '^# teacher rl-python final python pass@1: \K[0-9.]+' "$OUT/mopd.dat")
  gnuplot -e "dat='$OUT/mopd.dat'; png='docs/img/rl-mopd.png'; ta=$ta; tp=$tp" scripts/rl_mopd_plot.gp \
    && echo "wrote docs/img/rl-mopd.png"
fi
