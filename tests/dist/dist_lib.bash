# Shared set-up of the multi-rank training tests (train_equiv.sh,
# reshard.sh): sourced, not run (and not *.sh, so CMake does not take it for
# a test). Arguments: BUILD_DIR SOURCE_DIR [MYRIAD_BINARY].
# After it: lib.sh's pass/fail/expect_error/finish and $WORK (removed on
# exit), tiny data prepared in $WORK/data, $CFG, $PY, $T0, and train().
# As root, OpenMPI also wants OMPI_ALLOW_RUN_AS_ROOT=1,
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (and OMPI_MCA_rmaps_base_oversubscribe=1
# on small machines); ctest sets them.
set -euo pipefail
BUILD="$1"
SRC="$2"
MYRIAD="${3:-$BUILD/myriad}"
[ -x "$MYRIAD" ] || { echo "FAIL: $MYRIAD not built"; exit 1; }
source "$SRC/tests/e2e/lib.sh" "$MYRIAD" "$SRC"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
export OMP_NUM_THREADS=1
T0=$SECONDS

make_tiny_data
[ -f "$WORK/data/tokenizer.model" ] || { echo "FAIL: myriad prepare produced no data"; exit 1; }
CFG="$SRC/configs/tiny.toml"

# train NAME NP [args...]: `myriad train -c $CFG "${S[@]}"` (the caller's
# settings array) into $WORK/NAME, under mpirun when NP > 1; appends to
# $WORK/NAME.log.
train() {
  local name="$1" np="$2"; shift 2
  local cmd=("$MYRIAD" train -c "$CFG" "${S[@]}" --set "train.out_dir=$WORK/$name" -q "$@")
  [ "$np" -gt 1 ] && cmd=(mpirun -np "$np" --oversubscribe "${cmd[@]}")
  local t=$SECONDS
  if ! timeout 120 "${cmd[@]}" >>"$WORK/$name.log" 2>&1; then
    fail "$name ($*): training failed: $(tail -5 "$WORK/$name.log")"
    return 1
  fi
  echo "   $name $*: $((SECONDS - t)) s"
}
