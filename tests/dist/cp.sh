#!/usr/bin/env bash
# Context parallelism on real MPI ranks: dist_cp checks ring attention
# (forward out/lse, backward dq/dk/dv) against single-rank attention over the
# full sequence, at cp = 2 and cp = 4 (oversubscribed on small machines).
# Usage: cp.sh BUILD_DIR SOURCE_DIR [MYRIAD_BINARY]
# As root, OpenMPI also wants OMPI_ALLOW_RUN_AS_ROOT=1 and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (ctest sets them).
set -euo pipefail
BUILD="$1"
PROG="$BUILD/dist/dist_cp"
[ -x "$PROG" ] || { echo "FAIL: $PROG not built (hint: cmake --build $BUILD --target dist_cp)"; exit 1; }
export OMP_NUM_THREADS=1
for np in 2 4; do
  if ! timeout 60 mpirun -np "$np" --oversubscribe "$PROG"; then
    echo "FAIL: dist_cp with $np ranks"
    exit 1
  fi
done
echo "ok: ring attention matches single-rank attention at cp = 2 and 4"
