// DSA ops: fast kernels against the scalar references (ragged shapes, padded
// batch strides), sparse attention against dense attention when the
// selection is every causal key, the references against finite
// differences, the selection's contract (ties, pads, order), the KL's
// properties, and bitwise determinism across thread counts.
#include "backend/cpu/dsa/dsa.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dsa/dsa_test_util.h"
#include "backend/backend.h"

namespace myriad::cpu::dsa {
namespace {

using namespace dsatest;

TEST(Dsa, FastMatchesReference) {
  ForEachKernelIsa([] {
    uint32_t seed = 1;
    for (const Dims& d : AllDims()) {
      SCOPED_TRACE(d.Name());
      const Case c(d, seed++);
      const Results f = RunAll<false>(c, nullptr);
      const Results r = RunAll<true>(c, &f.idx);
      EXPECT_EQ(f.idx, r.idx);
      EXPECT_LE(RelErr(f.out, r.out), 1e-5);
      EXPECT_LE(RelErr(f.lse, r.lse), 1e-5);
      EXPECT_LE(RelErr(f.dv, r.dv), 1e-5);
      if (d.K > 1) {
        EXPECT_LE(RelErr(f.dq, r.dq), 1e-5);
        EXPECT_LE(RelErr(f.dk, r.dk), 1e-5);
        EXPECT_LE(RelErr(f.dqi, r.dqi), 1e-5);
        EXPECT_LE(RelErr(f.dki, r.dki), 1e-5);
        EXPECT_LE(RelErr(f.dwi, r.dwi), 1e-5);
      } else {
        // One key: P = 1 and p = q = 1 are constant, so dq, dk and the
        // indexer's gradients are exactly 0 (both sides hold rounding noise,
        // which a relative comparison would magnify).
        for (const Tensor* t :
             {&f.dq, &f.dk, &f.dqi, &f.dki, &f.dwi, &r.dq, &r.dk, &r.dqi, &r.dki, &r.dwi})
          EXPECT_LE(MaxAbs(*t), 1e-5);
      }
      // K = 1: p = q = 1, the KL is 0 up to rounding; otherwise a real divergence.
      if (d.K > 1) {
        EXPECT_GT(r.loss, 1e-3);
      }
      EXPECT_GE(f.loss, -1e-7);  // KL >= 0 (up to rounding when it is 0)
      EXPECT_LE(std::fabs(f.loss - r.loss), std::max(1e-6 * std::fabs(r.loss), 1e-7))
          << f.loss << " vs " << r.loss;
      if (std::getenv("DSA_TEST_VERBOSE"))
        std::printf(
            "%s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e dqi %.2e dki %.2e dwi %.2e loss %.2e "
            "(%.4f)\n",
            d.Name().c_str(), RelErr(f.out, r.out), RelErr(f.lse, r.lse), RelErr(f.dq, r.dq),
            RelErr(f.dk, r.dk), RelErr(f.dv, r.dv), RelErr(f.dqi, r.dqi), RelErr(f.dki, r.dki),
            RelErr(f.dwi, r.dwi), std::fabs(f.loss - r.loss) / std::max(1e-300, std::fabs(r.loss)),
            r.loss);
      for (const Tensor* t : {&f.out, &f.dq, &f.dk, &f.dv, &f.dqi, &f.dki, &f.dwi})
        EXPECT_TRUE(PaddingIntact(*t));
      // Loss only (null gradients) gives the same loss.
      IndexerLossParams lp;
      lp.indexer = c.Indexer(const_cast<int32_t*>(f.idx.data()));
      Tensor out = c.NewOut();
      std::vector<float> lse = f.lse;
      lp.attn = c.Attn(f.idx.data(), &out, &lse);
      EXPECT_EQ(IndexerLoss(lp), f.loss);
    }
  });
}

// ---------------------------------------------------------------- selection

TEST(Dsa, TopKContract) {
  for (const Dims& d : AllDims()) {
    SCOPED_TRACE(d.Name());
    const Case c(d, 100 + d.K);
    std::vector<int32_t> idx = c.NewIdx();
    IndexerTopK(c.Indexer(idx.data()));
    for (int b = 0; b < d.B; ++b)
      for (int t = 0; t < d.Tq; ++t) {
        const int pos = d.Tk - d.Tq + t;
        const int32_t* row = idx.data() + b * c.idx_stride + (int64_t)t * d.K;
        const int want = std::min(d.K, pos + 1);
        int valid = 0;
        while (valid < d.K && row[valid] >= 0) ++valid;
        ASSERT_EQ(valid, want) << "row " << t;
        for (int j = valid; j < d.K; ++j) ASSERT_EQ(row[j], -1);
        for (int j = 0; j < valid; ++j) {
          ASSERT_LE(row[j], pos);
          if (j > 0) {
            ASSERT_LT(row[j - 1], row[j]);
          }
        }
        // The chosen are the best: min chosen score >= max unchosen score
        // (scores recomputed here, in double).
        auto score = [&](int s) {
          double I = 0;
          for (int j = 0; j < d.Hi; ++j) {
            double u = 0;
            for (int x = 0; x < d.Di; ++x)
              u += (double)c.qi.v[b * c.qi.stride + ((int64_t)t * d.Hi + j) * d.Di + x] *
                   c.ki.v[b * c.ki.stride + (int64_t)s * d.Di + x];
            I += c.wi.v[b * c.wi.stride + (int64_t)t * d.Hi + j] * std::max(u, 0.0);
          }
          return I;
        };
        std::vector<bool> chosen(pos + 1, false);
        double min_in = INFINITY, max_out = -INFINITY;
        for (int j = 0; j < valid; ++j)
          chosen[row[j]] = true, min_in = std::min(min_in, score(row[j]));
        for (int s = 0; s <= pos; ++s)
          if (!chosen[s]) max_out = std::max(max_out, score(s));
        ASSERT_GE(min_in, max_out - 1e-5);
      }
  }
}

// Scores with exact ties (I = ki[s][0], products of exact values): the
// selection takes the lower s among equals; both implementations.
TEST(Dsa, TopKTiesGoToLowerIndex) {
  const Dims d{1, 20, 20, 1, 1, 4, 1, 2, 6};
  for (int pattern = 0; pattern < 3; ++pattern) {
    Case c(d, 7);
    for (int s = 0; s < d.Tk; ++s) {
      // 0: all equal; 1: values 0.5, 1, 1.5 repeating; 2: descending pairs.
      const float val = pattern == 0   ? 1.f
                        : pattern == 1 ? 0.5f * (1 + s % 3)
                                       : 0.25f * ((40 - s) / 2);
      c.ki.at(0, (int64_t)s * 2) = val;
      c.ki.at(0, (int64_t)s * 2 + 1) = 3.f;
    }
    for (int t = 0; t < d.Tq; ++t) {
      c.qi.at(0, (int64_t)t * 2) = 1.f;
      c.qi.at(0, (int64_t)t * 2 + 1) = 0.f;
      c.wi.at(0, t) = 1.f;
    }
    for (bool use_ref : {false, true}) {
      SCOPED_TRACE("pattern " + std::to_string(pattern) + (use_ref ? " ref" : " fast"));
      std::vector<int32_t> idx = c.NewIdx();
      if (use_ref)
        ref::IndexerTopK(c.Indexer(idx.data()));
      else
        IndexerTopK(c.Indexer(idx.data()));
      for (int t = 0; t < d.Tq; ++t) {
        // Expected: order by (score desc, s asc), take K, sort.
        std::vector<int> order(t + 1);
        for (int s = 0; s <= t; ++s) order[s] = s;
        auto val = [&](int s) { return c.ki.at(0, (int64_t)s * 2); };
        std::sort(order.begin(), order.end(),
                  [&](int a, int b) { return val(a) != val(b) ? val(a) > val(b) : a < b; });
        order.resize(std::min(d.K, t + 1));
        std::sort(order.begin(), order.end());
        order.resize(d.K, -1);
        const std::vector<int32_t> got(idx.begin() + (int64_t)t * d.K,
                                       idx.begin() + (int64_t)(t + 1) * d.K);
        ASSERT_EQ(got, std::vector<int32_t>(order.begin(), order.end())) << "row " << t;
      }
    }
  }
}

// ---------------------------------------------------------------- dense equivalence

// Keys read in place through a block table (the serving pool's layout:
// blocks of 16 rows, in shuffled order, with other data between them): the
// same selection as the contiguous keys, bit for bit, for the reference and
// every kernel ISA, both precisions, the decode (few rows) and the blocked
// path, with two sequences whose tables differ.
TEST(Dsa, IndexerReadsKeysThroughABlockTable) {
  constexpr int kBt = 16, kGap = 5;  // rows per block; floats of other data after a block's rows
  for (const Dims& d : {Dims{2, 1, 300, 4, 2, 24, 3, 16, 40}, Dims{2, 3, 77, 4, 2, 24, 2, 16, 9},
                        Dims{2, 90, 250, 4, 2, 24, 3, 16, 32}, Dims{1, 37, 37, 4, 2, 24, 3, 16, 64}})
    for (IndexerPrecision prec : {IndexerPrecision::kFp32, IndexerPrecision::kInt8}) {
      SCOPED_TRACE(d.Name() + (prec == IndexerPrecision::kInt8 ? " int8" : " fp32"));
      const Case c(d, 7 + d.Tk);
      const int max_blocks = (d.Tk + kBt - 1) / kBt, n_blocks = d.B * max_blocks + 3;
      const int64_t stride = (int64_t)kBt * d.Di + kGap;
      std::vector<int32_t> order(n_blocks);
      for (int i = 0; i < n_blocks; ++i) order[i] = i;
      std::mt19937 rng(d.Tk);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<float> pool((size_t)n_blocks * stride, std::numeric_limits<float>::quiet_NaN());
      std::vector<int32_t> table((size_t)d.B * max_blocks);
      for (int b = 0; b < d.B; ++b)
        for (int j = 0; j < max_blocks; ++j) {
          const int32_t blk = order[(size_t)b * max_blocks + j];
          table[(size_t)b * max_blocks + j] = blk;
          for (int s = j * kBt; s < std::min(d.Tk, (j + 1) * kBt); ++s)
            std::copy_n(c.ki.p() + b * c.ki.stride + (int64_t)s * d.Di, d.Di,
                        pool.data() + blk * stride + (int64_t)(s % kBt) * d.Di);
        }
      IndexerParams want_p = c.Indexer(nullptr);
      want_p.precision = prec;
      std::vector<int32_t> want = c.NewIdx();
      want_p.idx = want.data();
      ref::IndexerTopK(want_p);
      IndexerParams paged = want_p;
      paged.ki = pool.data();
      paged.ki_batch_stride = 0;
      paged.ki_blocks = table.data();
      paged.ki_max_blocks = max_blocks;
      paged.ki_block_tokens = kBt;
      paged.ki_block_stride = stride;
      std::vector<int32_t> got = c.NewIdx();
      paged.idx = got.data();
      ref::IndexerTopK(paged);
      EXPECT_EQ(got, want) << "reference";
      ForEachKernelIsa([&] {
        std::vector<int32_t> fast = c.NewIdx(), fast_paged = c.NewIdx();
        IndexerParams p = want_p;
        p.idx = fast.data();
        IndexerTopK(p);
        p = paged;
        p.idx = fast_paged.data();
        IndexerTopK(p);
        EXPECT_EQ(fast_paged, fast);
        if (prec == IndexerPrecision::kFp32) {
          EXPECT_EQ(fast_paged, want);
        }
      });
    }
}

TEST(Dsa, EqualsDenseAttentionWhenKCoversAllKeys) {
  for (const Dims& d : {Dims{2, 37, 37, 4, 2, 24, 3, 16, 64}, Dims{2, 1, 50, 4, 2, 24, 3, 16, 64},
                        Dims{1, 37, 37, 4, 4, 24, 3, 16, 37}}) {
    SCOPED_TRACE(d.Name());
    const Case c(d, 42);
    std::vector<int32_t> idx = c.NewIdx();
    IndexerTopK(c.Indexer(idx.data()));
    Tensor out = c.NewOut(), dout_dense = c.NewOut();
    std::vector<float> lse = c.NewLse(), lse_dense = c.NewLse();
    const SparseAttentionParams sp = c.Attn(idx.data(), &out, &lse);
    SparseAttention(sp);
    const AttentionParams dp = c.Dense(&dout_dense, &lse_dense);
    CpuBackend()->ops().attention_fwd(dp);
    EXPECT_LE(RelErr(out, dout_dense), 1e-5);
    EXPECT_LE(RelErr(lse, lse_dense), 1e-5);

    Tensor dq = Tensor(d.B, c.q.n, kSentinel), dk = c.NewKv(), dv = c.NewKv();
    Tensor dq2 = dq, dk2 = dk, dv2 = dv;
    SparseAttentionBackwardParams sb;
    sb.fwd = sp;
    sb.dout = c.dout.p();
    sb.dq = dq.p();
    sb.dk = dk.p();
    sb.dv = dv.p();
    SparseAttentionBackward(sb);
    AttentionBackwardParams db;
    db.fwd = dp;
    db.dout = c.dout.p();
    db.dq = dq2.p();
    db.dk = dk2.p();
    db.dv = dv2.p();
    CpuBackend()->ops().attention_bwd(db);
    EXPECT_LE(RelErr(dq, dq2), 1e-5);
    EXPECT_LE(RelErr(dk, dk2), 1e-5);
    EXPECT_LE(RelErr(dv, dv2), 1e-5);
  }
}

// ---------------------------------------------------------------- finite differences

// Central differences of f at element x[i]; the step actually taken is
// measured (x +- eps rounds to float).
template <typename F>
double CentralDiff(float* x, F f, float eps) {
  const float x0 = *x;
  *x = x0 + eps;
  const double fp = f(), xp = *x;
  *x = x0 - eps;
  const double fm = f(), xm = *x;
  *x = x0;
  return (fp - fm) / (xp - xm);
}

TEST(Dsa, ReferenceAttentionBackwardMatchesFiniteDifferences) {
  const Dims d{1, 6, 6, 2, 1, 4, 1, 3, 3};
  Case c(d, 11);
  std::vector<int32_t> idx = c.NewIdx();
  ref::IndexerTopK(c.Indexer(idx.data()));
  // L = sum(out * dout), in double.
  auto loss = [&]() {
    Tensor out = c.NewOut();
    std::vector<float> lse = c.NewLse();
    ref::SparseAttention(c.Attn(idx.data(), &out, &lse));
    double L = 0;
    for (int64_t i = 0; i < out.n; ++i) L += (double)out.at(0, i) * c.dout.at(0, i);
    return L;
  };
  Tensor out = c.NewOut(), dq(d.B, c.q.n, kSentinel), dk = c.NewKv(), dv = c.NewKv();
  std::vector<float> lse = c.NewLse();
  SparseAttentionBackwardParams bp;
  bp.fwd = c.Attn(idx.data(), &out, &lse);
  ref::SparseAttention(bp.fwd);
  bp.dout = c.dout.p();
  bp.dq = dq.p();
  bp.dk = dk.p();
  bp.dv = dv.p();
  ref::SparseAttentionBackward(bp);
  int checked = 0;
  for (auto [x, g, name] : {std::tuple{&c.q, &dq, "q"}, {&c.k, &dk, "k"}, {&c.v, &dv, "v"}}) {
    for (int64_t i = 1; i < x->n; i += 5) {
      const double fd = CentralDiff(&x->at(0, i), loss, 3e-3f);
      const double an = g->at(0, i);
      EXPECT_NEAR(an, fd, 1e-4 + 1e-3 * std::fabs(fd)) << name << "[" << i << "]";
      checked += std::fabs(fd) > 1e-3;
    }
  }
  EXPECT_GT(checked, 10);  // most checked elements have a real gradient
}

TEST(Dsa, IndexerLossGradientsMatchFiniteDifferences) {
  const Dims d{2, 7, 7, 2, 1, 4, 2, 4, 4};
  Case c(d, 23);
  std::vector<int32_t> idx = c.NewIdx();
  ref::IndexerTopK(c.Indexer(idx.data()));
  Tensor out = c.NewOut();
  std::vector<float> lse = c.NewLse();
  const SparseAttentionParams ap = c.Attn(idx.data(), &out, &lse);
  ref::SparseAttention(ap);
  IndexerLossParams lp;
  lp.indexer = c.Indexer(idx.data());
  lp.attn = ap;
  auto loss = [&]() {
    IndexerLossParams l = lp;
    return ref::IndexerLoss(l);
  };
  Tensor dqi(d.B, c.qi.n, kSentinel), dki(d.B, c.ki.n, kSentinel), dwi(d.B, c.wi.n, kSentinel);
  IndexerLossParams lg = lp;
  lg.dqi = dqi.p();
  lg.dki = dki.p();
  lg.dwi = dwi.p();
  ref::IndexerLoss(lg);
  int checked = 0;
  for (auto [x, g, name] :
       {std::tuple{&c.qi, &dqi, "qi"}, {&c.ki, &dki, "ki"}, {&c.wi, &dwi, "wi"}}) {
    for (int b = 0; b < d.B; ++b)
      for (int64_t i = b; i < x->n; i += 3) {
        const double fd = CentralDiff(&x->at(b, i), loss, 1e-3f);
        const double an = g->at(b, i);
        EXPECT_NEAR(an, fd, 1e-6 + 1e-3 * std::fabs(fd)) << name << "[" << b << "," << i << "]";
        checked += std::fabs(fd) > 1e-4;
      }
  }
  EXPECT_GT(checked, 10);
}

// ---------------------------------------------------------------- KL properties

// The indexer equals the main attention (one head, positive inputs so the
// relu is the identity, I = scale q.k): p == q, KL == 0, gradients 0; then
// a different indexer (weights doubled) gives a positive KL.
TEST(Dsa, KlIsZeroWhenIndexerMatchesAttention) {
  const Dims d{2, 13, 13, 1, 1, 8, 1, 8, 5};
  Case c(d, 5);
  std::mt19937 rng(9);
  c.q = Random(d.B, c.q.n, rng, 0.f, true);
  c.k = Random(d.B, c.k.n, rng, 0.f, true);
  c.qi = c.q;
  c.ki = c.k;
  for (int b = 0; b < d.B; ++b)
    for (int t = 0; t < d.Tq; ++t) c.wi.at(b, t) = 1.f;
  std::vector<int32_t> idx = c.NewIdx();
  IndexerTopK(c.Indexer(idx.data()));
  Tensor out = c.NewOut();
  std::vector<float> lse = c.NewLse();
  SparseAttentionParams ap = c.Attn(idx.data(), &out, &lse);
  ap.scale = 1.f;
  SparseAttention(ap);
  Tensor dqi(d.B, c.qi.n, kSentinel), dki(d.B, c.ki.n, kSentinel), dwi(d.B, c.wi.n, kSentinel);
  IndexerLossParams lp;
  lp.indexer = c.Indexer(idx.data());
  lp.attn = ap;
  lp.dqi = dqi.p();
  lp.dki = dki.p();
  lp.dwi = dwi.p();
  const double loss = IndexerLoss(lp);
  EXPECT_LE(std::fabs(loss), 1e-6);
  EXPECT_LE(std::fabs(ref::IndexerLoss(lp)), 1e-6);
  for (const Tensor* g : {&dqi, &dki, &dwi})
    for (int b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < g->n; ++i) ASSERT_LE(std::fabs(g->v[b * g->stride + i]), 1e-6);
  for (int b = 0; b < d.B; ++b)
    for (int t = 0; t < d.Tq; ++t) c.wi.at(b, t) = 2.f;
  EXPECT_GT(IndexerLoss(lp), 1e-3);
}

// KL >= 0 on random cases, and a small step along -grad lowers the loss by
// about lr * |grad|^2 (first order).
TEST(Dsa, LossDecreasesAlongNegativeGradient) {
  const Dims d{2, 37, 37, 4, 2, 24, 3, 16, 16};
  Case c(d, 77);
  std::vector<int32_t> idx = c.NewIdx();
  IndexerTopK(c.Indexer(idx.data()));
  Tensor out = c.NewOut();
  std::vector<float> lse = c.NewLse();
  const SparseAttentionParams ap = c.Attn(idx.data(), &out, &lse);
  SparseAttention(ap);
  Tensor dqi(d.B, c.qi.n, kSentinel), dki(d.B, c.ki.n, kSentinel), dwi(d.B, c.wi.n, kSentinel);
  IndexerLossParams lp;
  lp.indexer = c.Indexer(idx.data());
  lp.attn = ap;
  lp.dqi = dqi.p();
  lp.dki = dki.p();
  lp.dwi = dwi.p();
  const double L0 = IndexerLoss(lp);
  EXPECT_GT(L0, 0.0);
  double g2 = 0;
  for (const Tensor* g : {&dqi, &dki, &dwi})
    for (int b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < g->n; ++i)
        g2 += (double)g->v[b * g->stride + i] * g->v[b * g->stride + i];
  ASSERT_GT(g2, 0.0);
  const double lr = 1e-3 * L0 / g2;  // predicted decrease: 0.1% of the loss
  for (auto [x, g] : {std::pair{&c.qi, &dqi}, {&c.ki, &dki}, {&c.wi, &dwi}})
    for (int b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < x->n; ++i) x->at(b, i) -= (float)(lr * g->at(b, i));
  lp.dqi = lp.dki = lp.dwi = nullptr;
  const double L1 = IndexerLoss(lp);
  EXPECT_LT(L1, L0);
  EXPECT_NEAR(L0 - L1, lr * g2, 0.1 * lr * g2);
}

// ---------------------------------------------------------------- determinism

// Shapes big enough for the parallel paths (prefill; decode with few rows,
// split by kv head): 1, 2 and 3 threads give the same bits, and match the
// references.
TEST(Dsa, BitwiseIdenticalAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  for (const Dims& d :
       {Dims{2, 150, 150, 4, 2, 40, 3, 16, 32}, Dims{4, 1, 3000, 8, 4, 64, 2, 16, 512}}) {
    SCOPED_TRACE(d.Name());
    const Case c(d, 3);
    omp_set_num_threads(1);
    const Results one = RunAll<false>(c, nullptr);
    // 2 threads, and more where the machine has the cores (oversubscribed
    // spinning threads would only make the test slow).
    std::vector<int> counts = {2};
    if (omp_get_num_procs() > 2) counts.push_back(std::min(omp_get_num_procs(), 5));
    for (int threads : counts) {
      omp_set_num_threads(threads);
      const Results r = RunAll<false>(c, nullptr);
      EXPECT_EQ(r.idx, one.idx);
      for (auto [a, b] : {std::pair{&r.out, &one.out},
                          {&r.dq, &one.dq},
                          {&r.dk, &one.dk},
                          {&r.dv, &one.dv},
                          {&r.dqi, &one.dqi},
                          {&r.dki, &one.dki},
                          {&r.dwi, &one.dwi}})
        EXPECT_EQ(std::memcmp(a->p(), b->p(), a->v.size() * sizeof(float)), 0) << threads;
      EXPECT_EQ(std::memcmp(r.lse.data(), one.lse.data(), r.lse.size() * sizeof(float)), 0);
      EXPECT_EQ(r.loss, one.loss);
    }
    omp_set_num_threads(saved);
    const Results ref = RunAll<true>(c, &one.idx);
    EXPECT_EQ(one.idx, ref.idx);
    EXPECT_LE(RelErr(one.out, ref.out), 1e-5);
    EXPECT_LE(RelErr(one.dq, ref.dq), 1e-5);
    EXPECT_LE(RelErr(one.dk, ref.dk), 1e-5);
    EXPECT_LE(RelErr(one.dv, ref.dv), 1e-5);
    EXPECT_LE(RelErr(one.dqi, ref.dqi), 1e-5);
    EXPECT_LE(RelErr(one.dki, ref.dki), 1e-5);
    EXPECT_LE(RelErr(one.dwi, ref.dwi), 1e-5);
    EXPECT_LE(std::fabs(one.loss - ref.loss), 1e-6 * std::fabs(ref.loss));
  }
  omp_set_num_threads(saved);
}

// ---------------------------------------------------------------- timing (manual)

// An informal figure, not a benchmark: one warm-up and one timed run each.
// Run with --gtest_also_run_disabled_tests --gtest_filter='*Timing*'.
TEST(Dsa, DISABLED_TimingPrefill4096) {
  const Dims d{1, 4096, 4096, 8, 4, 64, 4, 32, 512};
  const Case c(d, 1);
  std::vector<int32_t> idx = c.NewIdx();
  Tensor out = c.NewOut(), dout2 = c.NewOut();
  std::vector<float> lse = c.NewLse(), lse2 = c.NewLse();
  Tensor dq(d.B, c.q.n, 0.f), dk = c.NewKv(), dv = c.NewKv(), dqi(d.B, c.qi.n, 0.f),
                              dki(d.B, c.ki.n, 0.f), dwi(d.B, c.wi.n, 0.f);
  const SparseAttentionParams sp = c.Attn(idx.data(), &out, &lse);
  SparseAttentionBackwardParams sb;
  sb.fwd = sp;
  sb.dout = c.dout.p();
  sb.dq = dq.p();
  sb.dk = dk.p();
  sb.dv = dv.p();
  IndexerLossParams lp;
  lp.indexer = c.Indexer(idx.data());
  lp.attn = sp;
  lp.dqi = dqi.p();
  lp.dki = dki.p();
  lp.dwi = dwi.p();
  const AttentionParams dp = c.Dense(&dout2, &lse2);
  AttentionBackwardParams db;
  db.fwd = dp;
  db.dout = c.dout.p();
  db.dq = dq.p();
  db.dk = dk.p();
  db.dv = dv.p();
  auto time = [](const char* name, auto fn) {
    fn();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %-32s %9.2f ms\n", name, ms);
  };
  std::printf("T=%d H=%d Hkv=%d D=%d K=%d Hi=%d Di=%d, %d threads\n", d.Tk, d.H, d.Hkv, d.D, d.K,
              d.Hi, d.Di, omp_get_max_threads());
  time("dsa::IndexerTopK", [&] { IndexerTopK(c.Indexer(idx.data())); });
  time("dsa::SparseAttention", [&] { SparseAttention(sp); });
  time("ops::Attention (dense causal)", [&] { CpuBackend()->ops().attention_fwd(dp); });
  time("dsa::SparseAttentionBackward", [&] { SparseAttentionBackward(sb); });
  time("ops::AttentionBackward", [&] { CpuBackend()->ops().attention_bwd(db); });
  time("dsa::IndexerLoss (+grads)", [&] { IndexerLoss(lp); });
}

}  // namespace
}  // namespace myriad::cpu::dsa
