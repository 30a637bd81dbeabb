// The AVX-512 CPU backend (compiled with -mavx512f/bw/vl/dq/vnni -O3): the
// portable kernels (auto-vectorised for zmm) plus hand-blocked SIMD kernels.
// GCC 12 flags _mm512_undefined_ps() inside the max/scalef intrinsics as
// "maybe uninitialized" (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "backend/cpu/impl/fill_ops.h"
#include "backend/cpu/impl/elementwise_simd.h"
#include "backend/cpu/impl/flash_simd.h"
#include "backend/cpu/isa_avx512/vec.h"
#include "backend/cpu/cpu_info.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {

void FillAvx512Ops(BackendOps* ops) {
  FillPortableOps(ops);
  ops->attention_fwd = FlashSimd<VecAvx512, 4>::Forward;
  ops->paged_attention = FlashSimd<VecAvx512, 4>::Paged;
  ops->attention_bwd = FlashSimd<VecAvx512, 4>::Backward;
  ops->swiglu_fwd = ElementwiseSimd<VecAvx512>::SwigluFwd;
  ops->swiglu_bwd = ElementwiseSimd<VecAvx512>::SwigluBwd;
  ops->softmax_xent = ElementwiseSimd<VecAvx512>::SoftmaxXent;
  ops->gemv_f32 = GemvF32Avx512;
  // gemm_bf16.cc is the only TU with AVX512-BF16 code; null without it.
  ops->gemm_bf16 = GetCpuInfo().avx512_bf16 ? GemmBf16Avx512 : nullptr;
  ops->gemv_f16 = GemvF16Avx512;
  // Without VNNI the AVX2 kernel (built without VNNI flags) is the safe one:
  // this TU may contain compiler-generated VNNI instructions.
  ops->gemv_q8 = GetCpuInfo().avx512_vnni ? GemvQ8Avx512Vnni : GemvQ8Avx2;
}

}  // namespace myriad::cpu
