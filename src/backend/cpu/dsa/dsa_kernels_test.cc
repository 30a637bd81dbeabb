// DSA kernels beyond the ops' contract: the int8 indexer against the
// reference's own quantisation and against fp32, the top-k's recovery when
// its sampled threshold lets too few keys through, and the sparse attention
// schedules (blocked, masked dense, their resolution).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/dsa/dsa.h"
#include "backend/cpu/dsa/dsa_test_util.h"

namespace myriad::cpu::dsa {
namespace {

using namespace dsatest;

// The int8 indexer against the reference's own quantisation (dsa.h's
// spec, written apart): the same selection with every ISA's kernels (VNNI,
// AVX2, portable); Di not a multiple of 4, decode, K small and large.
TEST(Dsa, Int8IndexerMatchesReference) {
  for (const Dims& d : {Dims{2, 300, 300, 1, 1, 8, 4, 32, 40}, Dims{1, 257, 400, 1, 1, 8, 3, 30, 64},
                        Dims{3, 1, 2000, 1, 1, 8, 2, 16, 128}, Dims{1, 200, 200, 1, 1, 8, 4, 32, 5},
                        // decode over 9000 keys: the key tiles split over the threads
                        Dims{1, 1, 9000, 1, 1, 8, 4, 32, 256}}) {
    SCOPED_TRACE(d.Name());
    const Case c(d, 21);
    ForEachKernelIsa([&] {
      std::vector<int32_t> fast = c.NewIdx(), ref = c.NewIdx();
      IndexerParams p = c.Indexer(fast.data());
      p.precision = IndexerPrecision::kInt8;
      IndexerTopK(p);
      p.idx = ref.data();
      ref::IndexerTopK(p);
      EXPECT_EQ(fast, ref);
    });
  }
}

// int8 selects nearly what fp32 selects (random data, where scores are
// dense and many sit near the K-th): recall >= 0.9 over all rows.
TEST(Dsa, Int8SelectionAgreesWithFp32) {
  const Dims d{1, 1024, 1024, 1, 1, 8, 4, 32, 128};
  const Case c(d, 5);
  std::vector<int32_t> f32 = c.NewIdx(), i8 = c.NewIdx();
  IndexerTopK(c.Indexer(f32.data()));
  IndexerParams p = c.Indexer(i8.data());
  p.precision = IndexerPrecision::kInt8;
  IndexerTopK(p);
  int64_t same = 0, total = 0;
  for (int t = 0; t < d.Tq; ++t) {
    const int32_t* a = f32.data() + (int64_t)t * d.K;
    const int32_t* b = i8.data() + (int64_t)t * d.K;
    for (int j = 0; j < d.K; ++j)
      if (a[j] >= 0) ++total, same += std::binary_search(b, b + d.K, a[j]) ? 1 : 0;
  }
  EXPECT_GE((double)same / total, 0.9) << same << " of " << total;
  EXPECT_LT(same, total);  // not the fp32 path in disguise
}

// The sampled threshold can let fewer than K keys through (here every
// sampled key, 16 i + 7, scores far above the rest): the row is scored
// again with every key a candidate, and the selection is still exact.
TEST(Dsa, TopKRecoversWhenTheSampleOverestimates) {
  const Dims d{1, 600, 600, 1, 1, 8, 2, 8, 96};
  Case c(d, 9);
  for (int s = 0; s < d.Tk; ++s)
    for (int x = 0; x < d.Di; ++x)
      c.ki.at(0, (int64_t)s * d.Di + x) = s % 16 == 7 ? 10.f + x : 0.01f * (float)((s * 7 + x) % 13);
  for (int t = 0; t < d.Tq; ++t)
    for (int j = 0; j < d.Hi; ++j) {
      c.wi.at(0, (int64_t)t * d.Hi + j) = 1.f;
      for (int x = 0; x < d.Di; ++x) c.qi.at(0, ((int64_t)t * d.Hi + j) * d.Di + x) = 1.f;
    }
  for (auto prec : {IndexerPrecision::kFp32, IndexerPrecision::kInt8}) {
    std::vector<int32_t> fast = c.NewIdx(), ref = c.NewIdx();
    IndexerParams p = c.Indexer(fast.data());
    p.precision = prec;
    IndexerTopK(p);
    p.idx = ref.data();
    ref::IndexerTopK(p);
    EXPECT_EQ(fast, ref) << (prec == IndexerPrecision::kInt8 ? "int8" : "fp32");
  }
}

// Decode (a few query rows) scores keys tile by tile without laying out
// every key or sampling a threshold: its selections must be the bits the
// blocked path gives the same rows in a prefill, fp32 and int8.
TEST(Dsa, DecodeSelectionEqualsPrefillRows) {
  const Dims d{1, 700, 700, 1, 1, 8, 4, 30, 48};
  const Case c(d, 31);
  for (auto prec : {IndexerPrecision::kFp32, IndexerPrecision::kInt8}) {
    SCOPED_TRACE(prec == IndexerPrecision::kInt8 ? "int8" : "fp32");
    std::vector<int32_t> full = c.NewIdx();
    IndexerParams p = c.Indexer(full.data());
    p.precision = prec;
    IndexerTopK(p);  // 700 rows: the blocked path with the sampled threshold
    for (int t : {60, 333, 699}) {
      std::vector<int32_t> one(d.K, -7);
      IndexerParams q = p;
      q.Tq = 1, q.Tk = t + 1;
      q.qi = c.qi.p() + (int64_t)t * d.Hi * d.Di;
      q.wi = c.wi.p() + (int64_t)t * d.Hi;
      q.idx = one.data();
      IndexerTopK(q);
      EXPECT_EQ(std::vector<int32_t>(full.begin() + (int64_t)t * d.K, full.begin() + (int64_t)(t + 1) * d.K), one)
          << "row " << t;
    }
  }
}

// The blocked forward kernel (q_block > 1) against the double-precision
// reference and the row kernel, over a grid of q_block and key_chunk: steps
// cut at chunk boundaries change the rounding only. Shapes: the generic
// path (g = 2, D = 40) and the paired one (D = 32, 64), with k/v repacked
// per kv head (Hkv > 1) and not (Hkv = 1); several batch elements; rows
// IndexerTopK would never write (not ascending, pads in the middle) go
// through the row kernel inside the blocked one.
TEST(Dsa, BlockedScheduleMatchesReference) {
  ForEachKernelIsa([] {
    for (const Dims& d : {Dims{2, 150, 150, 4, 2, 40, 3, 16, 24}, Dims{1, 200, 300, 2, 1, 64, 2, 8, 37},
                          Dims{2, 170, 260, 6, 3, 32, 2, 8, 50}}) {
      SCOPED_TRACE(d.Name());
      const Case c(d, 11);
      std::vector<int32_t> idx = c.NewIdx();
      IndexerTopK(c.Indexer(idx.data()));
      // Three irregular rows: reversed, a pad in the middle, a duplicate-free shuffle.
      int32_t* r1 = idx.data() + (int64_t)(d.Tq - 1) * d.K;
      std::reverse(r1, r1 + d.K);
      int32_t* r2 = idx.data() + (int64_t)(d.Tq - 2) * d.K;
      r2[d.K / 2] = -1;
      int32_t* r3 = idx.data() + (int64_t)(d.Tq / 2) * d.K;
      std::swap(r3[0], r3[d.K - 1]);
      Tensor out_row = c.NewOut();
      std::vector<float> lse_row = c.NewLse();
      SparseAttentionParams p = c.Attn(idx.data(), &out_row, &lse_row);
      p.q_block = 1;
      SparseAttention(p);
      Tensor out_ref = c.NewOut();
      std::vector<float> lse_ref = c.NewLse();
      ref::SparseAttention(c.Attn(idx.data(), &out_ref, &lse_ref));
      EXPECT_LE(RelErr(out_row, out_ref), 1e-5);
      EXPECT_LE(RelErr(lse_row, lse_ref), 1e-6);
      for (int qb : {2, 7, 64, 1000})
        for (int chunk : {1, 16, 100, 4096}) {
          SCOPED_TRACE(testing::Message() << "q_block " << qb << " key_chunk " << chunk);
          Tensor out = c.NewOut();
          std::vector<float> lse = c.NewLse();
          SparseAttentionParams pb = c.Attn(idx.data(), &out, &lse);
          pb.q_block = qb;
          pb.key_chunk = chunk;
          const SparseAttentionSchedule s = ResolveSparseAttentionSchedule(pb);
          EXPECT_EQ(s.q_block, qb);
          EXPECT_EQ(s.key_chunk, chunk);
          SparseAttention(pb);
          EXPECT_LE(RelErr(out, out_ref), 1e-5);
          EXPECT_LE(RelErr(lse, lse_ref), 1e-6);
          EXPECT_LE(RelErr(out, out_row), 1e-5);
          EXPECT_TRUE(PaddingIntact(out));
        }
    }
  });
}

// Masked dense attention (dense_tile) computes the same math by GEMMs over
// every causal key: out and lse match the reference, for tiles that do and
// do not divide the rows; a selection in another form (not ascending) falls
// back to the row kernel and gives its bits.
TEST(Dsa, MaskedDenseScheduleMatchesReference) {
  for (const Dims& d : {Dims{2, 150, 150, 4, 2, 40, 3, 16, 24}, Dims{1, 300, 300, 2, 1, 64, 2, 8, 100}}) {
    SCOPED_TRACE(d.Name());
    const Case c(d, 12);
    std::vector<int32_t> idx = c.NewIdx();
    IndexerTopK(c.Indexer(idx.data()));
    Tensor out_ref = c.NewOut();
    std::vector<float> lse_ref = c.NewLse();
    ref::SparseAttention(c.Attn(idx.data(), &out_ref, &lse_ref));
    for (int tile : {1, 7, 64, 1000}) {
      SCOPED_TRACE(testing::Message() << "dense_tile " << tile);
      Tensor out = c.NewOut();
      std::vector<float> lse = c.NewLse();
      SparseAttentionParams p = c.Attn(idx.data(), &out, &lse);
      p.dense_tile = tile;
      EXPECT_EQ(ResolveSparseAttentionSchedule(p).dense_tile, tile);
      SparseAttention(p);
      EXPECT_LE(RelErr(out, out_ref), 1e-5);
      EXPECT_LE(RelErr(lse, lse_ref), 1e-5);
      EXPECT_TRUE(PaddingIntact(out));
    }
    // One row reversed: the whole call goes to the row kernel.
    int32_t* row = idx.data() + (int64_t)(d.Tq - 1) * d.K;
    std::reverse(row, row + d.K);
    Tensor a = c.NewOut(), b = c.NewOut();
    std::vector<float> la = c.NewLse(), lb = c.NewLse();
    SparseAttentionParams pa = c.Attn(idx.data(), &a, &la), pb = c.Attn(idx.data(), &b, &lb);
    pa.dense_tile = 64;
    pb.q_block = 1;
    SparseAttention(pa);
    SparseAttention(pb);
    EXPECT_EQ(std::memcmp(a.p(), b.p(), a.v.size() * sizeof(float)), 0);
  }
}

// The schedule: explicit > installed lookup > default; the default keeps
// the row kernel where there is nothing to reuse (decode, few keys).
TEST(Dsa, ScheduleResolution) {
  SparseAttentionParams p;
  p.B = 1, p.Tq = 1, p.Tk = 65536, p.K = 2048;
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).q_block, 1);  // decode
  p.Tq = p.Tk = 4096;  // the selection is half the keys: still blocked
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).dense_tile, 0);
  EXPECT_GT(ResolveSparseAttentionSchedule(p).q_block, 1);
  p.Tq = 16384, p.Tk = 16384;
  const SparseAttentionSchedule d = ResolveSparseAttentionSchedule(p);
  EXPECT_EQ(d.dense_tile, 0);
  EXPECT_GT(d.q_block, 1);
  EXPECT_GT(d.key_chunk, 0);
  SetSparseAttentionScheduleLookup([](const SparseAttentionParams& q) {
    return q.Tk == 16384 ? SparseAttentionSchedule{32, 777} : SparseAttentionSchedule{};
  });
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).q_block, 32);
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).key_chunk, 777);
  p.q_block = 5;
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).q_block, 5);  // explicit wins
  p.q_block = 0;
  p.Tk = p.Tq = 12288;  // the lookup has no answer: the default
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).q_block, DefaultSparseAttentionSchedule(p).q_block);
  EXPECT_EQ(DefaultSparseAttentionSchedule(p).q_block, 192);  // ~32 rows per selected key: 32 * 12288 / 2048
  p.Tk = p.Tq = 65536;
  EXPECT_EQ(DefaultSparseAttentionSchedule(p, 1 << 20).q_block, 1024);
  EXPECT_EQ(DefaultSparseAttentionSchedule(p, 1 << 20).key_chunk, 1024);  // ~32 keys of a row per chunk
  // A 512 KB L2 halves both (the rows' state and the chunk must share it).
  EXPECT_EQ(DefaultSparseAttentionSchedule(p, 1 << 19).q_block, 512);
  EXPECT_EQ(DefaultSparseAttentionSchedule(p, 1 << 19).key_chunk, 512);
  SetSparseAttentionScheduleLookup(nullptr);
  p.Tk = p.Tq = 16384;
  EXPECT_EQ(ResolveSparseAttentionSchedule(p).q_block, d.q_block);
}

}  // namespace
}  // namespace myriad::cpu::dsa
