// The bf16 / int8 codec against hand-computed values, and the compressed
// all-reduce on LocalComm ranks against the exact sum (computed here in
// double) within error bounds derived from the quantiser, plus the drift
// that error feedback prevents.
#include "train/comm/compressed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "train/comm/local_comm.h"

namespace myriad::comm {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CompressionCodec, Bf16RoundsToNearestEven) {
  // bf16 keeps 7 fraction bits: the step above 1 is 2^-7.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 0x1p-8f)), 1.0f);              // tie -> even (down)
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);  // tie -> even (up)
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffffu)), 0x7f80u);  // max float rounds to inf
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001u)))));  // signalling NaN stays NaN
}

TEST(CompressionCodec, Int8BlocksAndResidual) {
  const int64_t block = 4, n = 10;
  const float x[n] = {127, -63.5f, 1, 0.4f, 0, 0, 0, 0, 2.54f, -1.27f};
  EXPECT_EQ(CompressedBytes(Compression::kInt8, n, block), n + 3 * 4);
  EXPECT_EQ(CompressedBytes(Compression::kBf16, n, block), 2 * n);
  std::vector<uint8_t> packed(CompressedBytes(Compression::kInt8, n, block));
  std::vector<float> residual(n, 0.0f), y(n);
  CompressChunk(Compression::kInt8, x, n, block, residual.data(), packed.data());
  float scales[3];
  std::memcpy(scales, packed.data(), sizeof(scales));
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[1], 0.0f);  // all-zero block
  EXPECT_FLOAT_EQ(scales[2], 0.02f);
  const int8_t* q = reinterpret_cast<const int8_t*>(packed.data() + 12);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // -63.5 ties to even
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[8], 127);
  DecompressChunk(Compression::kInt8, packed.data(), n, block, y.data(), false);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_LE(std::fabs(y[i] - x[i]), scales[i / block] / 2 * (1 + 1e-6)) << i;
    EXPECT_FLOAT_EQ(residual[i], x[i] - y[i]) << i;
  }
  // The residual is added before the next compression: 0.4 + 0.4 = 0.8 -> 1.
  CompressChunk(Compression::kInt8, x, n, block, residual.data(), packed.data());
  EXPECT_EQ(q[3], 1);
}

// Exact sum in double, and per-rank data.
struct Problem {
  std::vector<std::vector<float>> x;  // [rank][i]
  std::vector<double> sum;
};

Problem MakeProblem(int n, int64_t count, uint64_t seed) {
  Problem p;
  p.x.resize(n);
  p.sum.assign(count, 0.0);
  for (int r = 0; r < n; ++r) {
    Rng rng(seed + r);
    p.x[r].resize(count);
    for (int64_t i = 0; i < count; ++i) {
      p.x[r][i] = rng.Normal() * (1 + (i % 7));  // blocks with different ranges
      p.sum[i] += p.x[r][i];
    }
  }
  return p;
}

// int8, one call, fresh state: with s_rb = max_{i in b} |x_ri| / 127 the
// scale rank r uses for block b, decompressed inputs are off by at most
// s_rb / 2 each, so the fp32 chunk sum is off by E_b = sum_r s_rb / 2; the
// summed chunk's scale is at most (max_b |sum| + E_b) / 127 and adds half of
// it. Bound: E_b + (max_b |sum| + E_b) / 254 (+ fp32 rounding slack).
TEST(CompressedComm, Int8AllReduceWithinBound) {
  for (int n : {2, 3, 4}) {
    for (int64_t count : {int64_t{1}, int64_t{255}, int64_t{1000}, int64_t{5000}}) {
      const int64_t block = 256;
      Problem p = MakeProblem(n, count, 1000 * n + count);
      std::vector<std::vector<float>> out(n);
      RunLocalRanks(n, [&](Comm& c) {
        CompressedComm cc(c, CompressionOptions{Compression::kInt8, true, block});
        std::vector<float> v = p.x[c.rank()];
        cc.AllReduce(v.data(), count, DType::kF32, ReduceOp::kSum);
        out[c.rank()] = v;
      });
      for (int r = 1; r < n; ++r) ASSERT_EQ(out[r], out[0]);  // bitwise equal on every rank
      for (int64_t b0 = 0; b0 < count; b0 += block) {
        const int64_t b1 = std::min(count, b0 + block);
        double e = 0, big = 0;
        for (int r = 0; r < n; ++r) {
          double m = 0;
          for (int64_t i = b0; i < b1; ++i) m = std::max(m, std::fabs(static_cast<double>(p.x[r][i])));
          e += m / 254;
        }
        for (int64_t i = b0; i < b1; ++i) big = std::max(big, std::fabs(p.sum[i]));
        const double bound = e + (big + e) / 254 + 1e-5 * big;
        for (int64_t i = b0; i < b1; ++i) {
          ASSERT_LE(std::fabs(out[0][i] - p.sum[i]), bound) << "n " << n << " count " << count << " i " << i;
        }
      }
    }
  }
}

// bf16 rounding to nearest is off by at most 2^-8 relative (8 significant
// bits: half a step of 2^-7): the inputs by sum_r |x_r| 2^-8 together, the
// summed chunk by |sum'| 2^-8.
TEST(CompressedComm, Bf16AllReduceWithinBound) {
  const int n = 4;
  const int64_t count = 777;
  Problem p = MakeProblem(n, count, 5);
  std::vector<std::vector<float>> out(n);
  RunLocalRanks(n, [&](Comm& c) {
    CompressedComm cc(c, CompressionOptions{Compression::kBf16, false, 256});
    std::vector<float> v = p.x[c.rank()];
    cc.AllReduce(v.data(), count, DType::kF32, ReduceOp::kSum);
    out[c.rank()] = v;
    EXPECT_EQ(cc.residual_count(), 0u);  // no error feedback asked for
  });
  for (int64_t i = 0; i < count; ++i) {
    double mag = 0;
    for (int r = 0; r < n; ++r) mag += std::fabs(p.x[r][i]);
    const double e = mag * 0x1p-8;
    const double bound = e + (std::fabs(p.sum[i]) + e) * 0x1p-8 + 1e-6 * mag;
    ASSERT_LE(std::fabs(out[0][i] - p.sum[i]), bound) << i;
  }
}

// Bytes per rank r of n, chunk c of m_c floats (chunks of whole 256-blocks):
// stage 1 sends every other rank's chunk compressed, stage 2 sends its own
// summed chunk to the n-1 others. int8: m + 4 ceil(m/256); bf16: 2m.
TEST(CompressedComm, BytesSentAreTheCompressedPayload) {
  const int n = 4;
  const int64_t count = 10000;  // 40 blocks (the last partial): chunks of 10 blocks = 2560
  const int64_t chunk[n] = {2560, 2560, 2560, 10000 - 3 * 2560};
  auto int8_bytes = [](int64_t m) { return m + 4 * ((m + 255) / 256); };
  RunLocalRanks(n, [&](Comm& c) {
    const int me = c.rank();
    for (Compression mode : {Compression::kInt8, Compression::kBf16, Compression::kNone}) {
      CompressedComm cc(c, CompressionOptions{mode, true, 256});
      std::vector<float> v(count, 1.0f);
      cc.AllReduce(v.data(), count, DType::kF32, ReduceOp::kSum);
      int64_t want = 0;
      if (mode == Compression::kNone) {
        want = 2 * (n - 1) * (4 * count) / n;  // the inner all-reduce, comm.h's model
      } else {
        auto bytes = [&](int64_t m) { return mode == Compression::kInt8 ? int8_bytes(m) : 2 * m; };
        for (int r = 0; r < n; ++r) want += r == me ? 0 : bytes(chunk[r]);
        want += (n - 1) * bytes(chunk[me]);
      }
      EXPECT_EQ(cc.stats().bytes_sent, want) << CompressionName(mode);
      EXPECT_NEAR(v[0], 4.0f, 1e-5);
      EXPECT_NEAR(v[count - 1], 4.0f, 1e-5);
    }
  });
}

// A persistent gradient: every round each rank contributes one large entry
// per block (1.0) and many tiny ones (1e-4, below half a quantisation step
// of max/127 = 0.0079, so they quantise to 0). Without error feedback the
// tiny components never arrive and the cumulative error grows linearly with
// rounds; with it each rank's residual and the summed chunk's residual stay
// within half a step each, so the cumulative error of every element stays
// within sum_r s_r / 2 + s' / 2 (s_r = 1/127, s' = n/127) at every round.
TEST(CompressedComm, ErrorFeedbackPreventsDrift) {
  const int n = 4, rounds = 200;
  const int64_t count = 512, block = 256;
  const float tiny = 1e-4f;
  auto grad = [&](int64_t i) { return i % block == 0 ? 1.0f : tiny * (1 + i % 3); };
  for (bool feedback : {false, true}) {
    std::vector<double> max_err(n, 0.0), final_err(n, 0.0), half_err(n, 0.0);
    RunLocalRanks(n, [&](Comm& c) {
      CompressedComm cc(c, CompressionOptions{Compression::kInt8, feedback, block});
      std::vector<float> g(count);
      std::vector<double> got(count, 0.0), want(count, 0.0);
      double worst = 0;
      for (int t = 1; t <= rounds; ++t) {
        for (int64_t i = 0; i < count; ++i) g[i] = grad(i);
        cc.AllReduce(g.data(), count, DType::kF32, ReduceOp::kSum);
        double err = 0;
        for (int64_t i = 0; i < count; ++i) {
          got[i] += g[i];
          want[i] += n * static_cast<double>(grad(i));
          err = std::max(err, std::fabs(got[i] - want[i]));
        }
        worst = std::max(worst, err);
        if (t == rounds / 2) half_err[c.rank()] = std::fabs(got[1] - want[1]);
      }
      max_err[c.rank()] = worst;
      final_err[c.rank()] = std::fabs(got[1] - want[1]);  // a tiny component
    });
    const double step_bound = n * (1.0 / 127) / 2 + (n / 127.0) / 2;
    if (feedback) {
      EXPECT_LE(max_err[0], step_bound * 1.001) << "error feedback: bounded at every round";
    } else {
      // Element 1 (tiny 2e-4 per rank) never arrives: error = rounds * n * 2e-4.
      const double lost = rounds * n * 2.0 * tiny;
      EXPECT_NEAR(final_err[0], lost, 1e-3 * lost) << "no feedback: linear drift";
      EXPECT_NEAR(half_err[0], lost / 2, 1e-3 * lost);  // linear in rounds
      EXPECT_GT(final_err[0], 3 * step_bound);
    }
  }
}

TEST(CompressedComm, KeyedStateAndFallbacks) {
  RunLocalRanks(3, [&](Comm& c) {
    CompressedComm cc(c, CompressionOptions{Compression::kInt8, true, 256});
    std::vector<float> a(300, 1.0f);
    cc.AllReduceKeyed(1, a.data(), 300);
    cc.AllReduceKeyed(2, a.data(), 300);  // same address, another tensor
    cc.AllReduce(a.data(), 300, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(cc.residual_count(), 3u);
    cc.ForgetResiduals();
    EXPECT_EQ(cc.residual_count(), 0u);
    // Not f32 sum: the inner comm's exact all-reduce.
    std::vector<int32_t> ints(5, c.rank());
    cc.AllReduce(ints.data(), 5, DType::kI32, ReduceOp::kSum);
    EXPECT_EQ(ints[4], 3);
    std::vector<float> m(3, static_cast<float>(c.rank()) + 0.123f);
    cc.AllReduce(m.data(), 3, DType::kF32, ReduceOp::kMax);
    EXPECT_EQ(m[0], 2.0f + 0.123f);
    // Async keyed ops in flight complete in order.
    std::vector<float> x(1000, 0.5f), y(1000, 0.25f);
    Request rx = cc.IAllReduceKeyed(7, x.data(), 1000);
    Request ry = cc.IAllReduce(y.data(), 1000, DType::kF32, ReduceOp::kSum);
    ry.Wait();
    rx.Wait();
    EXPECT_NEAR(x[999], 1.5f, 1e-6);
    EXPECT_NEAR(y[0], 0.75f, 1e-6);
  });
}

}  // namespace
}  // namespace myriad::comm
