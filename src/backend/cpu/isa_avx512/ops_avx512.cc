// The AVX-512 CPU backend (compiled with -mavx512f/bw/vl/dq/vnni -O3).
#include "backend/cpu/impl/fill_ops.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {
void FillAvx512Ops(BackendOps* ops) { FillPortableOps(ops); }
}  // namespace myriad::cpu
