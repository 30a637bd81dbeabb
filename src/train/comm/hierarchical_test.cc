// HierarchicalComm on LocalComm ranks, against the flat comm's own results
// (an independent algorithm: one rank-ordered reduction) and against byte
// counts derived here in closed form from comm.h's per-op model.
#include "train/comm/hierarchical.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/rng.h"
#include "train/comm/local_comm.h"

namespace myriad::comm {
namespace {

std::vector<float> RandomFloats(uint64_t seed, int64_t n) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.Normal();
  return v;
}

std::vector<int64_t> RandomInts(uint64_t seed, int64_t n) {
  Rng rng(seed);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = static_cast<int64_t>(rng.Below(2000001)) - 1000000;
  return v;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Layout {
  int ranks, per_node;
};
const Layout kLayouts[] = {{4, 2}, {8, 4}, {8, 2}};
const int64_t kCounts[] = {1, 5, 1000, 1023, 4099};

TEST(HierarchicalComm, FloatSumMatchesFlat) {
  for (const Layout lay : kLayouts) {
    RunLocalRanks(lay.ranks, [&](Comm& flat) {
      HierarchicalComm hier(flat, HierOptions{lay.per_node, {}});
      ASSERT_EQ(hier.local_size(), lay.per_node);
      ASSERT_EQ(hier.num_nodes(), lay.ranks / lay.per_node);
      ASSERT_EQ(hier.node(), flat.rank() / lay.per_node);
      ASSERT_TRUE(hier.node_major());
      for (int64_t count : kCounts) {
        std::vector<float> a = RandomFloats(100 * flat.rank() + count, count), b = a;
        // |x| summed over ranks, for a relative bound of each element.
        std::vector<float> mag(count);
        for (int64_t i = 0; i < count; ++i) mag[i] = std::fabs(a[i]);
        flat.AllReduce(b.data(), count, DType::kF32, ReduceOp::kSum);
        flat.AllReduce(mag.data(), count, DType::kF32, ReduceOp::kSum);
        hier.AllReduce(a.data(), count, DType::kF32, ReduceOp::kSum);
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_NEAR(a[i], b[i], 1e-6 * mag[i]) << lay.ranks << "/" << lay.per_node << " count " << count << " i " << i;
        }
      }
    });
  }
}

TEST(HierarchicalComm, IntegerReductionsExact) {
  for (const Layout lay : kLayouts) {
    RunLocalRanks(lay.ranks, [&](Comm& flat) {
      HierarchicalComm hier(flat, HierOptions{lay.per_node, {}});
      for (int64_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
          std::vector<int64_t> a = RandomInts(7 * flat.rank() + count, count), b = a;
          flat.AllReduce(b.data(), count, DType::kI64, op);
          hier.AllReduce(a.data(), count, DType::kI64, op);
          ASSERT_EQ(a, b) << "count " << count << " op " << static_cast<int>(op);
          std::vector<int32_t> c(count), d(count);
          for (int64_t i = 0; i < count; ++i) c[i] = d[i] = static_cast<int32_t>(b[i] % 1000);
          flat.AllReduce(d.data(), count, DType::kI32, op);
          hier.AllReduce(c.data(), count, DType::kI32, op);
          ASSERT_EQ(c, d);
        }
      }
    });
  }
}

// Per rank, with L ranks per node, N nodes, shard s = ceil(C / L) and this
// rank's valid part v = clamp(C - l*s, 0, s), in comm.h's model:
//   intra = reduce-scatter (L-1)*s*4 + all-gather (L-1)*s*4
//   inter = all-reduce of v floats among N: 2*(N-1)*(4v)/N
TEST(HierarchicalComm, AllReduceBytesClosedForm) {
  for (const Layout lay : kLayouts) {
    RunLocalRanks(lay.ranks, [&](Comm& flat) {
      HierarchicalComm hier(flat, HierOptions{lay.per_node, {}});
      const int64_t L = lay.per_node, N = lay.ranks / lay.per_node, l = flat.rank() % L;
      HierStats expect_step;
      for (int64_t count : kCounts) {
        std::vector<float> a(count, 1.0f);
        hier.AllReduce(a.data(), count, DType::kF32, ReduceOp::kSum);
        const int64_t s = CeilDiv(count, L), v = std::clamp<int64_t>(count - l * s, 0, s);
        const HierStats got = hier.last_op_stats();
        EXPECT_EQ(got.intra_bytes, 2 * (L - 1) * s * 4) << count;
        EXPECT_EQ(got.inter_bytes, 2 * (N - 1) * (4 * v) / N) << count;
        EXPECT_EQ(a[count - 1], static_cast<float>(lay.ranks));
        expect_step += got;
      }
      EXPECT_EQ(hier.step_stats().intra_bytes, expect_step.intra_bytes);
      EXPECT_EQ(hier.step_stats().inter_bytes, expect_step.inter_bytes);
      EXPECT_EQ(hier.stats().bytes_sent, expect_step.intra_bytes + expect_step.inter_bytes);
      hier.ResetStepStats();
      EXPECT_EQ(hier.step_stats().intra_bytes, 0);
      EXPECT_EQ(hier.step_stats().inter_bytes, 0);
      EXPECT_EQ(hier.total_stats().inter_bytes, expect_step.inter_bytes);
    });
  }
}

TEST(HierarchicalComm, ReduceScatterAllGatherBroadcastAllToAllMatchFlat) {
  for (const Layout lay : kLayouts) {
    RunLocalRanks(lay.ranks, [&](Comm& flat) {
      HierarchicalComm hier(flat, HierOptions{lay.per_node, {}});
      const int n = flat.size(), me = flat.rank();
      const int64_t L = lay.per_node, N = n / L;
      for (int64_t count : {int64_t{1}, int64_t{37}}) {
        // ReduceScatter on integers: exact.
        std::vector<int64_t> send = RandomInts(me + 11 * count, n * count), r1(count), r2(count);
        flat.ReduceScatter(send.data(), r1.data(), count, DType::kI64, ReduceOp::kSum);
        hier.ReduceScatter(send.data(), r2.data(), count, DType::kI64, ReduceOp::kSum);
        ASSERT_EQ(r1, r2);
        // Intra: (L-1) blocks of N*count; inter: (N-1) blocks of count.
        EXPECT_EQ(hier.last_op_stats().intra_bytes, (L - 1) * N * count * 8);
        EXPECT_EQ(hier.last_op_stats().inter_bytes, (N - 1) * count * 8);

        // AllGather, separate buffers and in place.
        std::vector<int64_t> mine = RandomInts(1000 + me, count), g1(n * count), g2(n * count);
        flat.AllGather(mine.data(), g1.data(), count, DType::kI64);
        hier.AllGather(mine.data(), g2.data(), count, DType::kI64);
        ASSERT_EQ(g1, g2);
        EXPECT_EQ(hier.last_op_stats().intra_bytes, (L - 1) * N * count * 8);
        EXPECT_EQ(hier.last_op_stats().inter_bytes, (N - 1) * count * 8);
        std::vector<int64_t> g3(n * count, -1);
        std::copy(mine.begin(), mine.end(), g3.begin() + me * count);
        hier.AllGather(g3.data() + me * count, g3.data(), count, DType::kI64);
        ASSERT_EQ(g1, g3);

        // Broadcast from every root.
        for (int root = 0; root < n; ++root) {
          std::vector<int64_t> b = RandomInts(500 + me, count), want = RandomInts(500 + root, count);
          hier.Broadcast(b.data(), count, DType::kI64, root);
          ASSERT_EQ(b, want) << "root " << root;
        }
      }
      // AllToAllV: rank me sends (me + j) % 3 + 1 values to rank j.
      std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
      int64_t st = 0, rt = 0, intra = 0, inter = 0;
      for (int j = 0; j < n; ++j) {
        sc[j] = (me + j) % 3 + 1;
        rc[j] = (j + me) % 3 + 1;
        sd[j] = st;
        rd[j] = rt;
        st += sc[j];
        rt += rc[j];
        if (j != me) (j / L == me / L ? intra : inter) += sc[j] * 4;
      }
      std::vector<int32_t> s(st), r1(rt), r2(rt);
      for (int64_t i = 0; i < st; ++i) s[i] = static_cast<int32_t>(me * 1000 + i);
      flat.AllToAllV(s.data(), sc.data(), sd.data(), r1.data(), rc.data(), rd.data(), DType::kI32);
      hier.AllToAllV(s.data(), sc.data(), sd.data(), r2.data(), rc.data(), rd.data(), DType::kI32);
      ASSERT_EQ(r1, r2);
      EXPECT_EQ(hier.last_op_stats().intra_bytes, intra);
      EXPECT_EQ(hier.last_op_stats().inter_bytes, inter);
    });
  }
}

TEST(HierarchicalComm, AsyncAllReducesInFlightMatchSync) {
  RunLocalRanks(8, [&](Comm& flat) {
    HierarchicalComm hier(flat, HierOptions{4, {}});
    std::vector<std::vector<float>> async_bufs, sync_bufs;
    for (int b = 0; b < 6; ++b) {
      async_bufs.push_back(RandomFloats(flat.rank() * 10 + b, 100 + 333 * b));
      sync_bufs.push_back(async_bufs.back());
    }
    std::vector<Request> reqs;
    for (auto& v : async_bufs) {
      reqs.push_back(hier.IAllReduce(v.data(), static_cast<int64_t>(v.size()), DType::kF32, ReduceOp::kSum));
    }
    for (auto& r : reqs) r.Wait();
    for (auto& v : sync_bufs) hier.AllReduce(v.data(), static_cast<int64_t>(v.size()), DType::kF32, ReduceOp::kSum);
    ASSERT_EQ(async_bufs, sync_bufs);  // same algorithm, same order: same bits
    EXPECT_EQ(hier.total_stats().ops, 12);
  });
}

TEST(HierarchicalComm, FlatCommStaysUsable) {
  RunLocalRanks(4, [&](Comm& flat) {
    HierarchicalComm hier(flat, HierOptions{2, {}});
    std::vector<float> a(1000, 1.0f), b(10, 2.0f);
    Request r = hier.IAllReduce(a.data(), 1000, DType::kF32, ReduceOp::kSum);
    flat.AllReduce(b.data(), 10, DType::kF32, ReduceOp::kSum);  // meanwhile, on the flat comm
    r.Wait();
    EXPECT_EQ(a[999], 4.0f);
    EXPECT_EQ(b[9], 8.0f);
  });
}

TEST(HierarchicalComm, SplitNodesRejectsNonDivisor) {
  EXPECT_THROW(RunLocalRanks(4, [](Comm& flat) { SplitNodes(flat, 3); }), std::invalid_argument);
  RunLocalRanks(4, [](Comm& flat) {
    auto node = SplitNodes(flat, 0);  // in-process ranks share one machine
    EXPECT_EQ(node->size(), 4);
    auto pairs = SplitNodes(flat, 2);
    EXPECT_EQ(pairs->size(), 2);
    EXPECT_EQ(pairs->rank(), flat.rank() % 2);
  });
}

// int8 on the inter stage: the inter all-reduce sums N node partials P_k
// (shard-local), so per element of shard j the error is at most
//   sum_k m_k / 254 + (M + sum_k m_k / 254) / 254,
// m_k = max |P_k| over shard j (no block of it has a larger scale), M = max
// |sum| over shard j (bounds the summed chunk's scale, see compressed.h).
TEST(HierarchicalComm, Int8InterStageWithinBoundAndBytesDrop) {
  const int n = 8, L = 4, N = 2;
  const int64_t count = 3001;
  RunLocalRanks(n, [&](Comm& flat) {
    HierOptions plain{L, {}}, packed{L, {Compression::kInt8, true, 256}};
    HierarchicalComm h0(flat, plain), h8(flat, packed);
    std::vector<std::vector<float>> all(n);
    for (int r = 0; r < n; ++r) all[r] = RandomFloats(77 + r, count);
    std::vector<float> a = all[flat.rank()], b = a;
    h0.AllReduce(b.data(), count, DType::kF32, ReduceOp::kSum);
    h8.AllReduce(a.data(), count, DType::kF32, ReduceOp::kSum);
    const int64_t s = CeilDiv(count, L);
    for (int64_t j = 0; j * s < count; ++j) {
      const int64_t i0 = j * s, i1 = std::min(count, i0 + s);
      double sum_m = 0, big = 0;
      for (int k = 0; k < N; ++k) {
        double m = 0;
        for (int64_t i = i0; i < i1; ++i) {
          double p = 0;
          for (int r = k * L; r < (k + 1) * L; ++r) p += all[r][i];
          m = std::max(m, std::fabs(p));
        }
        sum_m += m;
      }
      for (int64_t i = i0; i < i1; ++i) big = std::max(big, std::fabs(static_cast<double>(b[i])));
      const double bound = sum_m / 254 + (big + sum_m / 254) / 254 + 1e-5;
      for (int64_t i = i0; i < i1; ++i) ASSERT_LE(std::fabs(a[i] - b[i]), bound) << i;
    }
    // Bytes across nodes: int8 + one fp32 scale per 256 vs fp32.
    const double ratio = static_cast<double>(h0.last_op_stats().inter_bytes) / h8.last_op_stats().inter_bytes;
    EXPECT_GE(ratio, 3.5);
    EXPECT_EQ(h0.last_op_stats().intra_bytes, h8.last_op_stats().intra_bytes);
  });
}

}  // namespace
}  // namespace myriad::comm
