// Internals shared by the sparse attention ops (dsa.cc: forward and
// backward) and the indexer's loss (dsa_loss.cc); not part of the API.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "core/check.h"
#include "backend/cpu/dsa/dsa.h"
#include "backend/cpu/dsa/dsa_simd.h"

namespace myriad::cpu::dsa::detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this many multiply-adds an op runs on the calling thread: a
// fork/join would cost more than it saves (decode, small tests).
constexpr int64_t kMinParallelWork = int64_t{1} << 20;

// Thread workspace slots (grow-only, per thread; see backend/cpu/impl/common.h).
enum Slot { kSlotWork = 2, kSlotKeys, kSlotU, kSlotScores, kSlotPacked };

// Row pointers of a block: rows[j] = base + keys[min(j, bk - 1)] * ld, so
// the lanes past bk repeat a valid row (their weights are set to 0).
DSA_INLINE void BlockRows(const float* base, int64_t ld, const int32_t* keys, int bk,
                          const float** rows) {
  for (int j = 0; j < simd::kLanes; ++j) rows[j] = base + keys[j < bk ? j : bk - 1] * ld;
}

// The valid (>= 0) entries of a selection row: keys[i] = sel[slot[i]].
inline int Compact(const int32_t* sel, int K, int32_t* keys, int32_t* slot) {
  int n = 0;
  for (int j = 0; j < K; ++j)
    if (sel[j] >= 0) {
      keys[n] = sel[j];
      if (slot) slot[n] = j;
      ++n;
    }
  return n;
}

inline void CheckIndexer(const char* op, const IndexerParams& p) {
  DSA_CHECK(op, p.B > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.Hi > 0 && p.Di > 0 && p.K > 0);
  DSA_CHECK(op, p.qi && p.ki && p.wi && p.idx);
}

inline void CheckAttn(const char* op, const SparseAttentionParams& p) {
  DSA_CHECK(op, p.B > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.H > 0 && p.Hkv > 0 && p.H % p.Hkv == 0 &&
                    p.D > 0 && p.K > 0);
  DSA_CHECK(op, p.q && p.k && p.idx);
}

// One batch element of the attention tensors.
struct AttnView {
  const float *q, *k, *v, *dout, *lse, *drow;  // lse [H, Tq], drow [Tq, H]
  int Tq, Tk, H, Hkv, D, g;
  int64_t ldq, ldkv;
  int64_t kv_head_stride;  // floats from one kv head's k (v) row to the next head's
  float scale;
  bool narrow;  // the 8-lane step kernels (NarrowVectors)
};

// (Isa and ActiveIsa: dsa_simd.h.)
// Whether the attention step kernels use 8-lane vectors: every ISA but
// avx512 (the 16-lane kernels need 32 vector registers; AVX2 has 16).
inline bool NarrowVectors() { return ActiveIsa() != Isa::kAvx512; }

inline AttnView ViewOf(const SparseAttentionParams& p, int b) {
  AttnView a;
  a.q = p.q + b * p.q_batch_stride;
  a.k = p.k + b * p.kv_batch_stride;
  a.v = p.v ? p.v + b * p.kv_batch_stride : nullptr;
  a.dout = nullptr;
  a.lse = p.lse ? p.lse + (int64_t)b * p.H * p.Tq : nullptr;
  a.drow = nullptr;
  a.Tq = p.Tq, a.Tk = p.Tk, a.H = p.H, a.Hkv = p.Hkv, a.D = p.D, a.g = p.H / p.Hkv;
  a.ldq = (int64_t)p.H * p.D, a.ldkv = (int64_t)p.Hkv * p.D, a.kv_head_stride = p.D;
  a.scale = p.scale;
  a.narrow = NarrowVectors();
  return a;
}

// Inverse index of a selection, per batch element: the entries
// e = t*K + slot (ascending) whose idx is key s are
// ents[base[b] + off[b*(Tk+1) + s] .. base[b] + off[b*(Tk+1) + s + 1]).
struct InverseIndex {
  std::vector<int64_t> off, base;
  std::vector<int32_t> ents;
  const int32_t* Entries(int b, int Tk, int s, int* n) const {
    const int64_t* o = off.data() + (int64_t)b * (Tk + 1);
    *n = (int)(o[s + 1] - o[s]);
    return ents.data() + base[b] + o[s];
  }
};

InverseIndex BuildInverse(const int32_t* idx, int64_t idx_stride, int B, int Tq, int Tk, int K,
                          bool parallel);

}  // namespace myriad::cpu::dsa::detail
