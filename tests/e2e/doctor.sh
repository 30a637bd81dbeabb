#!/usr/bin/env bash
# myriad doctor: it reports the BLAS kernel that runs, and a coretype set in
# the environment is respected (never silently replaced), with a loud
# warning when it is a generic kernel.
source "$(dirname "$0")/lib.sh" "$@"

out="$(env -u OPENBLAS_CORETYPE "$MYRIAD" doctor 2>&1)" && rc=0 || rc=$?
if grep -q "^blas core " <<<"$out" && grep -Eq "^backend    (fenced-)?cpu-" <<<"$out"; then
  pass "doctor reports backend and blas core: $(grep '^blas core' <<<"$out")"
else
  fail "doctor output lacks backend/blas core lines: $out"
fi

# An explicit coretype from the environment is the one OpenBLAS runs.
out="$(OPENBLAS_CORETYPE=Prescott "$MYRIAD" doctor 2>&1)" && rc=0 || rc=$?
if grep -q "^blas core  Prescott (OPENBLAS_CORETYPE from the environment)" <<<"$out"; then
  pass "OPENBLAS_CORETYPE=Prescott respected"
else
  fail "OPENBLAS_CORETYPE=Prescott not respected: $(grep '^blas core' <<<"$out")"
fi
if grep -q "SLOW GEMM" <<<"$out" && [ "$rc" -ne 0 ]; then pass "generic kernel warned about, exit $rc"
else fail "generic kernel: no SLOW GEMM warning or exit 0 (rc $rc): $out"; fi
# An AVX2 coretype is kept even on an AVX-512 CPU (it used to be replaced by
# SkylakeX behind the user's back); there the note says what it costs.
out="$(OPENBLAS_CORETYPE=Haswell "$MYRIAD" doctor 2>&1)" && rc=0 || rc=$?
if grep -q "^blas core  Haswell (OPENBLAS_CORETYPE from the environment)" <<<"$out"; then
  pass "OPENBLAS_CORETYPE=Haswell respected"
else
  fail "OPENBLAS_CORETYPE=Haswell not respected: $(grep '^blas core' <<<"$out")"
fi
if grep -q "avx512f" <<<"$(grep '^isa' <<<"$out")"; then
  if grep -q "SkylakeX runs about 2x faster" <<<"$out"; then pass "AVX-512 CPU: the slower choice is named"
  else fail "AVX-512 CPU: no note that SkylakeX is faster: $out"; fi
fi
finish
