#!/usr/bin/env bash
# HierarchicalComm and its int8 inter-node stage on real MPI ranks: dist_hier
# under mpirun -np 4, emulated as 2 nodes x 2 ranks (hierarchical == flat,
# compressed within its bound, bytes across nodes >= 3.5x fewer with int8).
# Usage: hier.sh BUILD_DIR SOURCE_DIR [MYRIAD_BINARY]
# As root, OpenMPI also wants OMPI_ALLOW_RUN_AS_ROOT=1 and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (ctest sets them).
set -euo pipefail
BUILD="$1"
PROG="$BUILD/dist/dist_hier"
[ -x "$PROG" ] || { echo "FAIL: $PROG not built (hint: cmake --build $BUILD --target dist_hier)"; exit 1; }
export OMP_NUM_THREADS=1
# Second run: MPI held to MPI_THREAD_FUNNELED (async ops run at issue).
for mode in "" --funneled; do
  if ! out=$(timeout 60 mpirun -np 4 --oversubscribe "$PROG" $mode 2>&1); then
    echo "$out"
    echo "FAIL: dist_hier $mode with 4 ranks (2 nodes x 2)"
    exit 1
  fi
  echo "$out"
  if grep -q '^FAIL' <<<"$out" || ! grep -q '^PASS' <<<"$out"; then
    echo "FAIL: dist_hier $mode: a check failed or none ran"
    exit 1
  fi
done
echo "ok: hierarchical and int8-compressed all-reduce on 2 emulated nodes x 2 ranks"
