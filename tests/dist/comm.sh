#!/usr/bin/env bash
# MpiComm on real ranks: dist_comm under mpirun with 4 and 3 ranks (an odd
# size: ragged blocks, a lone split), with MPI limited to
# MPI_THREAD_FUNNELED (async collectives run at issue), and once without
# mpirun (the size-1 world that needs no MPI runtime). Args: build dir, source dir, myriad binary.
set -euo pipefail
build=$1
prog="$build/dist/dist_comm"
export OMP_NUM_THREADS=1
status=0

run() {
  local label=$1
  shift
  echo "== $label"
  local out
  if ! out=$(timeout 60 "$@" 2>&1); then
    echo "$out"
    echo "FAIL $label: exit status non-zero"
    status=1
    return
  fi
  echo "$out"
  if grep -q '^FAIL' <<<"$out" || ! grep -q '^PASS' <<<"$out"; then
    echo "FAIL $label: a check failed or none ran"
    status=1
  fi
}

run "mpirun -np 4" mpirun -np 4 --oversubscribe "$prog"
run "mpirun -np 3" mpirun -np 3 --oversubscribe "$prog"
run "mpirun -np 2, MPI_THREAD_FUNNELED" mpirun -np 2 --oversubscribe "$prog" --funneled
run "no mpirun" env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$prog"
exit $status
