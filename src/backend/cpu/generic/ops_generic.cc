// The "scalar" CPU backend: the portable kernels at baseline x86-64 flags.
#include "backend/cpu/impl/fill_ops.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {
void FillGenericOps(BackendOps* ops) { FillPortableOps(ops); }
}  // namespace myriad::cpu
