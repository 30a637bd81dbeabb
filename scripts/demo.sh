#!/usr/bin/env bash
# The main job (`make demo`): prepare the built-in multilingual corpus, train
# the demo MoE with checkpoints, then generate samples in English, Chinese and
# code. `make demo` has already installed the dependencies and built Myriad.
set -euo pipefail
cd "$(dirname "$0")/.."
MYRIAD=./build/myriad
CONFIG=${CONFIG:-configs/demo-moe.toml}

echo "== machine"
$MYRIAD doctor || echo "(doctor reported a problem: training will be slow)"

echo "== data"
if [ -f data/default/data.json ]; then
  echo "data/default already prepared (delete it to rebuild)"
else
  $MYRIAD prepare --out data/default
fi

echo "== training $CONFIG"
# Resumes from runs/demo-moe if a previous demo was interrupted.
$MYRIAD train --config "$CONFIG" "$@"

echo "== evaluation"
$MYRIAD eval --ckpt runs/demo-moe

sample() {
  echo
  echo "--- $1"
  $MYRIAD generate --ckpt runs/demo-moe --prompt "$2" --max-tokens "${3:-120}" \
    --temperature 0.8 --top-k 40 --top-p 0.95 --seed 7 --stats
}
echo "== samples"
sample "English" "The secret of happiness is"
sample "English" "A man walked into a bar and"
sample "Chinese" "人生就像"
sample "Chinese" "床前明月光，"
sample "Code (Python)" $'def read_config(path):\n    '
sample "Code (Python)" $'class Stack:\n    def __init__(self):\n        '
