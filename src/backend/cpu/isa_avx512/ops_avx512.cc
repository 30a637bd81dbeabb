// The AVX-512 CPU backend (compiled with -mavx512f/bw/vl/dq/vnni -O3): the
// portable kernels (auto-vectorised for zmm) plus hand-blocked SIMD kernels.
// GCC 12 flags _mm512_undefined_ps() inside the max/scalef intrinsics as
// "maybe uninitialized" (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "backend/cpu/impl/fill_ops.h"
#include "backend/cpu/impl/flash_simd.h"
#include "backend/cpu/isa_avx512/vec.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {

void FillAvx512Ops(BackendOps* ops) {
  FillPortableOps(ops);
  ops->attention_fwd = FlashSimd<VecAvx512, 4>::Forward;
  ops->attention_bwd = FlashSimd<VecAvx512, 4>::Backward;
}

}  // namespace myriad::cpu
