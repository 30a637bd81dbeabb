// Ring attention over LocalComm ranks against single-rank attention over the
// whole sequence (the oracle: ops::Attention / AttentionBackward on one
// thread, sliced with CpScatter), plus the layout and the schedule checked
// against closed forms.
#include "train/parallel/cp/ring_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "train/comm/local_comm.h"

namespace myriad {
namespace {

std::vector<float> RandomVec(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.Normal();
  return v;
}

// max |a - b| / max |ref|
double RelErr(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, (double)std::fabs(a[i] - ref[i]));
    den = std::max(den, (double)std::fabs(ref[i]));
  }
  return num / std::max(den, 1e-30);
}

struct Shape {
  int B = 2, T = 32, H = 4, Hkv = 2, D = 8;
};

// Full-sequence tensors and the single-rank results.
struct Problem {
  Shape s;
  std::vector<float> q, k, v, dout;                  // inputs
  std::vector<float> out, lse, dq, dk, dv;           // single-rank oracle
  explicit Problem(const Shape& sh) : s(sh) {
    const int64_t nq = (int64_t)s.B * s.T * s.H * s.D, nkv = (int64_t)s.B * s.T * s.Hkv * s.D;
    q = RandomVec(nq, 1);
    k = RandomVec(nkv, 2);
    v = RandomVec(nkv, 3);
    dout = RandomVec(nq, 4);
    out.resize(nq);
    lse.resize((int64_t)s.B * s.H * s.T);
    dq.resize(nq);
    dk.resize(nkv);
    dv.resize(nkv);
    AttentionBackwardParams bp;
    bp.fwd = Params(s.T, q.data(), k.data(), v.data(), out.data(), lse.data());
    ops::Attention(bp.fwd);
    bp.dout = dout.data();
    bp.dq = dq.data();
    bp.dk = dk.data();
    bp.dv = dv.data();
    ops::AttentionBackward(bp);
  }
  AttentionParams Params(int rows, const float* qp, const float* kp, const float* vp, float* op,
                         float* lp) const {
    AttentionParams p;
    p.B = s.B; p.Tq = rows; p.Tk = rows; p.H = s.H; p.Hkv = s.Hkv; p.D = s.D;
    p.scale = 1.f / std::sqrt((float)s.D);
    p.causal = true;
    p.q_batch_stride = p.out_batch_stride = (int64_t)rows * s.H * s.D;
    p.kv_batch_stride = (int64_t)rows * s.Hkv * s.D;
    p.q = qp; p.k = kp; p.v = vp; p.out = op; p.lse = lp;
    return p;
  }
};

// Runs ring forward + backward on cp local ranks; returns the gathered
// full-sequence results (out, lse, dq, dk, dv) and checks the bytes sent.
struct RingResult {
  std::vector<float> out, lse, dq, dk, dv;
};
RingResult RunRing(const Problem& pb, int cp) {
  const Shape& s = pb.s;
  RingResult res;
  res.out.assign(pb.out.size(), NAN);
  res.lse.assign(pb.lse.size(), NAN);
  res.dq.assign(pb.dq.size(), NAN);
  res.dk.assign(pb.dk.size(), NAN);
  res.dv.assign(pb.dv.size(), NAN);
  comm::RunLocalRanks(cp, [&](comm::Comm& c) {
    const int r = c.rank(), Tl = s.T / cp;
    const int64_t qw = (int64_t)s.H * s.D, kvw = (int64_t)s.Hkv * s.D;
    std::vector<float> q(s.B * Tl * qw), k(s.B * Tl * kvw), v(k.size()), dout(q.size()), out(q.size()),
        lse((int64_t)s.B * s.H * Tl), dq(q.size()), dk(k.size()), dv(k.size());
    CpScatter(pb.q.data(), q.data(), s.B, s.T, qw, cp, r);
    CpScatter(pb.k.data(), k.data(), s.B, s.T, kvw, cp, r);
    CpScatter(pb.v.data(), v.data(), s.B, s.T, kvw, cp, r);
    CpScatter(pb.dout.data(), dout.data(), s.B, s.T, qw, cp, r);
    AttentionBackwardParams bp;
    bp.fwd = pb.Params(Tl, q.data(), k.data(), v.data(), out.data(), lse.data());
    c.stats().Reset();
    RingAttentionForward(c, bp.fwd);
    // K|V make cp-1 hops: 2 * B*Tl*Hkv*D floats each.
    const int64_t msg = 2 * (int64_t)s.B * Tl * kvw * sizeof(float);
    EXPECT_EQ(c.stats().bytes_sent, (cp - 1) * msg) << "forward, rank " << r;
    bp.dout = dout.data();
    bp.dq = dq.data();
    bp.dk = dk.data();
    bp.dv = dv.data();
    c.stats().Reset();
    RingAttentionBackward(c, bp);
    // K|V again (cp-1 hops) and the dK|dV accumulators (cp hops); nothing when cp == 1.
    EXPECT_EQ(c.stats().bytes_sent, cp == 1 ? 0 : (2 * cp - 1) * msg) << "backward, rank " << r;
    // Ranks own disjoint rows: writing into the shared results is race-free.
    CpGather(out.data(), res.out.data(), s.B, s.T, qw, cp, r);
    CpGather(lse.data(), res.lse.data(), s.B * s.H, s.T, 1, cp, r);  // [B*H, T]
    CpGather(dq.data(), res.dq.data(), s.B, s.T, qw, cp, r);
    CpGather(dk.data(), res.dk.data(), s.B, s.T, kvw, cp, r);
    CpGather(dv.data(), res.dv.data(), s.B, s.T, kvw, cp, r);
  });
  return res;
}

void ExpectMatches(const Problem& pb, int cp, const std::string& what) {
  const RingResult r = RunRing(pb, cp);
  const double tol = 1e-5;
  EXPECT_LE(RelErr(r.out, pb.out), tol) << what << " out";
  EXPECT_LE(RelErr(r.lse, pb.lse), tol) << what << " lse";
  EXPECT_LE(RelErr(r.dq, pb.dq), tol) << what << " dq";
  EXPECT_LE(RelErr(r.dk, pb.dk), tol) << what << " dk";
  EXPECT_LE(RelErr(r.dv, pb.dv), tol) << what << " dv";
}

TEST(RingAttention, MatchesSingleRankAttention) {
  for (Shape s : {Shape{2, 32, 4, 2, 8}, Shape{2, 64, 4, 2, 16}}) {
    const Problem pb(s);
    for (int cp : {1, 2, 4})
      ExpectMatches(pb, cp,
                    "T" + std::to_string(s.T) + " D" + std::to_string(s.D) + " cp" + std::to_string(cp));
  }
}

// The backward relies on the kernel taking fwd.out and fwd.lse as given;
// check every CPU ISA this machine runs, not only the default one.
TEST(RingAttention, MatchesOnEveryCpuIsa) {
  Backend* saved = ops::Active();
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    Backend* be = CpuBackend(isa);
    if (!be) continue;
    ops::SetActive(be);
    const Problem pb(Shape{2, 64, 4, 2, 16});
    ExpectMatches(pb, 4, std::string("isa ") + isa);
  }
  ops::SetActive(saved);
}

TEST(RingAttention, PositionsPairEarlyAndLateChunks) {
  // T = 16, cp = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  std::vector<int32_t> pos(8);
  CpPositions(16, 2, 0, pos.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  CpPositions(16, 2, 1, pos.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  std::vector<int32_t> all(5);
  CpPositions(5, 1, 0, all.data());  // cp = 1: identity, any T
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(RingAttention, ScatterGatherRoundTrip) {
  const int B = 3, T = 24, X = 5, cp = 3;
  std::vector<float> full(B * T * X), back(full.size(), -1.f);
  for (size_t i = 0; i < full.size(); ++i) full[i] = (float)i;
  for (int r = 0; r < cp; ++r) {
    std::vector<float> local(B * (T / cp) * X);
    std::vector<int32_t> pos(T / cp);
    CpScatter(full.data(), local.data(), B, T, X, cp, r);
    CpPositions(T, cp, r, pos.data());
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T / cp; ++i)
        for (int x = 0; x < X; ++x)
          ASSERT_EQ(local[(b * (T / cp) + i) * X + x], full[(b * T + pos[i]) * X + x]);
    CpGather(local.data(), back.data(), B, T, X, cp, r);
  }
  EXPECT_EQ(back, full);
  // The collective gather gives the same on every rank.
  comm::RunLocalRanks(cp, [&](comm::Comm& c) {
    std::vector<float> local(B * (T / cp) * X), got(full.size());
    CpScatter(full.data(), local.data(), B, T, X, cp, c.rank());
    CpAllGather(c, local.data(), B, T, X, got.data());
    EXPECT_EQ(got, full) << "rank " << c.rank();
  });
}

// The schedule covers every causal (query, key) pair of the sequence exactly
// once and no other, and gives each rank the same number of pairs.
TEST(RingAttention, ScheduleIsExactAndBalanced) {
  for (int cp : {1, 2, 3, 4, 8})
    for (int C : {1, 3, 4}) {
      const int T = 2 * cp * C, Tl = T / cp;
      std::vector<int> hits((size_t)T * T, 0);
      std::vector<int64_t> pairs(cp, 0);
      for (int r = 0; r < cp; ++r) {
        std::vector<int32_t> qpos(Tl);
        CpPositions(T, cp, r, qpos.data());
        for (int src = 0; src < cp; ++src) {
          std::vector<int32_t> kpos(Tl);
          CpPositions(T, cp, src, kpos.data());
          for (const RingBlock& b : RingStepBlocks(T, cp, r, src)) {
            ASSERT_LE(b.q_rows, b.k_rows) << "the kernel needs Tk >= Tq";
            int64_t n = 0;
            for (int i = 0; i < b.q_rows; ++i)
              for (int j = 0; j < b.k_rows; ++j) {
                if (b.causal && j > i + (b.k_rows - b.q_rows)) continue;
                const int qp = qpos[b.q_row0 + i], kp = kpos[b.k_row0 + j];
                ASSERT_LE(kp, qp) << "cp" << cp << " rank " << r << " src " << src;
                ++hits[(size_t)qp * T + kp];
                ++n;
              }
            EXPECT_EQ(n, b.pairs());
            pairs[r] += n;
          }
        }
      }
      for (int qp = 0; qp < T; ++qp)
        for (int kp = 0; kp <= qp; ++kp) ASSERT_EQ(hits[(size_t)qp * T + kp], 1) << qp << "," << kp;
      for (int r = 0; r < cp; ++r) EXPECT_EQ(pairs[r], pairs[0]) << "cp" << cp << " C" << C << " rank " << r;
      EXPECT_EQ(pairs[0] * cp, (int64_t)T * (T + 1) / 2);
    }
}

TEST(RingAttentionDeathTest, LengthNotDivisibleByTwiceCp) {
  std::vector<int32_t> pos(8);
  EXPECT_DEATH(CpPositions(30, 4, 0, pos.data()), "T=30 is not divisible by 2\\*cp=8");
}

}  // namespace
}  // namespace myriad
