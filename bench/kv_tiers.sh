#!/usr/bin/env bash
# Runs bench_kv_tiers (random weights, contexts up to 1024 tokens) with a
# redis-server started on a free loopback port for the remote tier, then
# stops it. The model is the demo MoE widened to d_model 512 and 6 layers
# (MYRIAD_KV_BENCH_SHAPE=demo keeps the demo's own shape, whose prefill is so
# cheap that fixed per-step costs dominate TTFT). Extra args go to
# bench_kv_tiers (later --set win).
# Usage: bench/kv_tiers.sh [BUILD_DIR] [bench_kv_tiers args...]
set -euo pipefail
BUILD="${1:-build}"
shift || true
PROG="$BUILD/bench_kv_tiers"
[ -x "$PROG" ] || { echo "FAIL: $PROG not built (hint: cmake --build $BUILD --target bench_kv_tiers)"; exit 1; }
command -v redis-server >/dev/null || { echo "FAIL: redis-server not installed (hint: scripts/install-deps.sh)"; exit 1; }
DIR="$(mktemp -d /tmp/myriad-kvbench.XXXXXX)"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --daemonize no >"$DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
SHAPE=(--set model.d_model=512 --set model.n_layers=6 --set model.d_expert=512)
[ "${MYRIAD_KV_BENCH_SHAPE:-}" = demo ] && SHAPE=()
"$PROG" --config configs/demo-moe.toml --set model.max_seq_len=1024 "${SHAPE[@]}" --redis "redis://127.0.0.1:$PORT" \
  --disk-dir "$DIR/disk" "$@"
