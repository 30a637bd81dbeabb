// The AVX2 CPU backend (compiled with -mavx2 -mfma -mf16c -O3).
#include "backend/cpu/impl/fill_ops.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {
void FillAvx2Ops(BackendOps* ops) { FillPortableOps(ops); }
}  // namespace myriad::cpu
