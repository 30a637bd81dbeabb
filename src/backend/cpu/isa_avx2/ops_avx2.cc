// The AVX2 CPU backend (compiled with -mavx2 -mfma -mf16c -O3): the portable
// kernels (auto-vectorised for ymm) plus hand-blocked SIMD kernels.
#include "backend/cpu/impl/fill_ops.h"
#include "backend/cpu/impl/elementwise_simd.h"
#include "backend/cpu/impl/flash_simd.h"
#include "backend/cpu/isa_avx2/vec.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {

void FillAvx2Ops(BackendOps* ops) {
  FillPortableOps(ops);
  ops->attention_fwd = FlashSimd<VecAvx2, 2>::Forward;
  ops->paged_attention = FlashSimd<VecAvx2, 2>::Paged;
  ops->attention_bwd = FlashSimd<VecAvx2, 2>::Backward;
  ops->swiglu_fwd = ElementwiseSimd<VecAvx2>::SwigluFwd;
  ops->swiglu_bwd = ElementwiseSimd<VecAvx2>::SwigluBwd;
  ops->softmax_xent = ElementwiseSimd<VecAvx2>::SoftmaxXent;
  ops->gemv_f32 = GemvF32Avx2;
  ops->gemv_f16 = GemvF16Avx2;
  ops->gemv_q8 = GemvQ8Avx2;
}

}  // namespace myriad::cpu
