#!/usr/bin/env bash
# Runs bench_comm under mpirun: 4 ranks as 2 emulated nodes x 2, one thread
# each (see bench/README.md, "Communication"). Extra args go to bench_comm,
# e.g. --sizes-kib 256,4096 --reps 5 --json-out bench/out/comm.json.
# Usage: bench/comm.sh [BUILD_DIR] [bench_comm args...]
set -euo pipefail
BUILD="${1:-build}"
shift || true
PROG="$BUILD/bench_comm"
[ -x "$PROG" ] || { echo "FAIL: $PROG not built (hint: cmake --build $BUILD --target bench_comm)"; exit 1; }
export OMP_NUM_THREADS=1
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun -np 4 --oversubscribe "$PROG" "$@"
