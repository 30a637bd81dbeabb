#!/usr/bin/env bash
# `myriad serve` with its lower KV tiers, end to end on a tiny trained model:
# greedy outputs with cache hits served from the host tier, from the disk tier
# after a restart and from Redis (shared by servers) are identical to the
# outputs of a server without any prefix cache, whether a hit is loaded or
# the cost model recomputes it (--kv-load auto); a corrupt disk block is
# detected and recomputed (same output). Starts its own redis-server.
# Usage: serve_tiers.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
source "$(dirname "$0")/serve_lib.bash"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
command -v redis-server >/dev/null || { echo "FAIL: redis-server not installed (hint: scripts/install-deps.sh)"; exit 1; }
export OMP_NUM_THREADS=1
train_tiny_model

source "$(dirname "$0")/serve_tiers_lib.bash"
run_tier_checks 33 50
finish
