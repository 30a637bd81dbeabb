// DSA's sparse attention forward as masked dense attention (the schedule
// "dense_tile", dsa.h): per kv head and tile of query rows, the scores of
// every causal key by one GEMM, every unselected key masked to -inf, a
// softmax per row, the output by a second GEMM. The same math as the
// gather kernels (each row's softmax over its selected keys), at dense
// cost: it wins where the selection is a large share of the keys (short
// sequences), and the kernel lab's tuned table or the default picks it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/impl/common.h"  // ExpF
#include "backend/cpu/dsa/dsa.h"
#include "backend/cpu/dsa/dsa_simd.h"
#include "backend/cpu/blas.h"  // BlasSgemm

namespace myriad::cpu::dsa {
namespace {

using namespace simd;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row r of S (n scores): keep the selected keys sel[0..ns), set the rest to
// -inf, softmax in place; returns the log-sum-exp (-inf: nothing selected).
DSA_KERNEL(float, MaskSoftmaxRow, (float* S, int n, const int32_t* sel, int ns, float* keep), (S, n, sel, ns, keep)) {
  for (int i = 0; i < ns; ++i) keep[i] = S[sel[i]];
  for (int i = 0; i < n; ++i) S[i] = kNegInf;
  float mx = kNegInf;
  for (int i = 0; i < ns; ++i) S[sel[i]] = keep[i], mx = std::max(mx, keep[i]);
  if (mx == kNegInf) {
    for (int i = 0; i < n; ++i) S[i] = 0.f;
    return kNegInf;
  }
  V16 sum = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V16 e = ExpV(LoadV(S + i) - mx);
    StoreV(S + i, e);
    sum += e;
  }
  float tail = 0.f;
  for (; i < n; ++i) tail += (S[i] = cpu::ExpF(S[i] - mx));
  const float l = HSum(sum) + tail;
  const float inv = 1.f / l;
  for (int j = 0; j < n; ++j) S[j] *= inv;
  return mx + std::log(l);
}

}  // namespace

bool MaskedDenseAttention(const SparseAttentionParams& p, int tile) {
  const int B = p.B, Tq = p.Tq, Tk = p.Tk, H = p.H, Hkv = p.Hkv, D = p.D, K = p.K, g = H / Hkv;
  const int64_t ldq = (int64_t)H * D, ldkv = (int64_t)Hkv * D;
  // Every row must be an ascending prefix of causal keys then -1 pads (what
  // IndexerTopK writes); otherwise the caller runs a gather kernel.
  std::vector<int> nsel((size_t)B * Tq);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tq; ++t) {
      const int32_t* sel = p.idx + b * p.idx_batch_stride + (int64_t)t * K;
      const int n = RegularPrefix(sel, K);
      if (n < 0 || (n > 0 && sel[n - 1] > Tk - Tq + t)) return false;
      nsel[(size_t)b * Tq + t] = n;
    }
  tile = std::max(1, std::min(tile, Tq));
  std::vector<float> S((size_t)tile * Tk), keep((size_t)std::max(1, omp_get_max_threads()) * K);
  for (int b = 0; b < B; ++b)
    for (int t0 = 0; t0 < Tq; t0 += tile) {
      const int R = std::min(tile, Tq - t0);
      const int n = Tk - Tq + t0 + R;  // keys the tile's last row may see
      for (int hk = 0; hk < Hkv; ++hk)
        for (int h = hk * g; h < (hk + 1) * g; ++h) {
          const float* q = p.q + b * p.q_batch_stride + (int64_t)t0 * ldq + (int64_t)h * D;
          const float* k = p.k + b * p.kv_batch_stride + (int64_t)hk * D;
          const float* v = p.v + b * p.kv_batch_stride + (int64_t)hk * D;
          float* out = p.out + b * p.out_batch_stride + (int64_t)t0 * ldq + (int64_t)h * D;
          // S [R, n] = scale q k^T, then the masked softmax per row, then out = S v.
          BlasSgemm(Trans::kNo, Trans::kYes, R, n, D, p.scale, q, ldq, k, ldkv, 0.f, S.data(), n);
#pragma omp parallel for schedule(static)
          for (int r = 0; r < R; ++r) {
            const int t = t0 + r;
            const int32_t* sel = p.idx + b * p.idx_batch_stride + (int64_t)t * K;
            const float lse = MaskSoftmaxRow(S.data() + (int64_t)r * n, n, sel, nsel[(size_t)b * Tq + t],
                                             keep.data() + (int64_t)omp_get_thread_num() * K);
            if (p.lse) p.lse[((int64_t)b * H + h) * Tq + t] = lse;
          }
          BlasSgemm(Trans::kNo, Trans::kNo, R, D, n, 1.f, S.data(), n, v, ldkv, 0.f, out, ldq);
        }
    }
  return true;
}

}  // namespace myriad::cpu::dsa
