#!/usr/bin/env bash
# Runs every benchmark and writes bench/out/*.json (see bench/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
/usr/bin/python3 bench/train_throughput.py --config configs/demo-moe.toml --json-out bench/out/train_moe.json
/usr/bin/python3 bench/train_throughput.py --config bench/configs/gpt2_dense.toml --steps 3 --warmup 1 --json-out bench/out/train_gpt2.json
/usr/bin/python3 bench/decode.py --config configs/demo-moe.toml --json-out bench/out/decode_moe.json
/usr/bin/python3 bench/decode.py --config bench/configs/gpt2_dense.toml --json-out bench/out/decode_gpt2.json
/usr/bin/python3 bench/decode_batched.py --config configs/demo-moe.toml --json-out bench/out/decode_batched_moe.json
/usr/bin/python3 bench/speculative.py --json-out bench/out/speculative_moe.json
/usr/bin/python3 bench/serve_throughput.py --json-out bench/out/serve_moe.json
/usr/bin/python3 bench/serve_throughput.py --gpt2 --speculative off,ngram --json-out bench/out/serve_gpt2.json
