// LocalComm against serial oracles: every rank fills its data from
// Value<T>(rank, i), and the test computes the expected result itself, in
// rank order, from the same formula (no communication involved).
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "train/comm/comm.h"
#include "train/comm/local_comm.h"
#include "train/comm/world.h"

namespace myriad::comm {
namespace {

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  return DType::kU8;
}

// Deterministic per-rank data with fractional parts (so the summation order
// shows in float results) and mixed signs.
template <typename T>
T Value(int rank, int64_t i) {
  const int64_t h = (rank * 7919 + i * 104729 + 13) % 1009;
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(h * 0.0137 - 3.1 + rank * 0.5);
  if constexpr (std::is_same_v<T, uint8_t>) return static_cast<T>(h * 31 + rank);  // wraps
  return static_cast<T>(h - 500 + rank);
}

template <typename T>
T Apply(ReduceOp op, T acc, T x) {
  if (op == ReduceOp::kSum) return static_cast<T>(acc + x);
  if (op == ReduceOp::kMax) return std::max(acc, x);
  return std::min(acc, x);
}

// Reduction over ranks 0..n-1, in that order, of Value<T>(r, i).
template <typename T>
T Reduced(int n, int64_t i, ReduceOp op) {
  T acc = Value<T>(0, i);
  for (int r = 1; r < n; ++r) acc = Apply(op, acc, Value<T>(r, i));
  return acc;
}

template <typename T>
std::vector<T> RankData(int rank, int64_t count) {
  std::vector<T> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = Value<T>(rank, i);
  return v;
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
const int64_t kCounts[] = {0, 1, 7, 1001};

class LocalCommTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

template <typename T>
void CheckAllReduce(Comm& c) {
  for (ReduceOp op : kOps) {
    for (int64_t count : kCounts) {
      std::vector<T> buf = RankData<T>(c.rank(), count);
      c.AllReduce(buf.data(), count, DTypeOf<T>(), op);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(buf[i], Reduced<T>(c.size(), i, op)) << "i=" << i << " count=" << count;
      }
    }
  }
}

TEST_P(LocalCommTest, AllReduceEveryTypeAndOp) {
  RunLocalRanks(n(), [](Comm& c) {
    CheckAllReduce<float>(c);
    CheckAllReduce<double>(c);
    CheckAllReduce<int32_t>(c);
    CheckAllReduce<int64_t>(c);
    CheckAllReduce<uint8_t>(c);
  });
}

template <typename T>
void CheckReduceScatter(Comm& c) {
  for (ReduceOp op : kOps) {
    for (int64_t count : {0, 1, 5, 333}) {
      std::vector<T> send = RankData<T>(c.rank(), count * c.size());
      std::vector<T> recv(count, T(99));
      c.ReduceScatter(send.data(), recv.data(), count, DTypeOf<T>(), op);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(recv[i], Reduced<T>(c.size(), c.rank() * count + i, op));
      }
    }
  }
}

TEST_P(LocalCommTest, ReduceScatter) {
  RunLocalRanks(n(), [](Comm& c) {
    CheckReduceScatter<float>(c);
    CheckReduceScatter<double>(c);
    CheckReduceScatter<int32_t>(c);
  });
}

TEST_P(LocalCommTest, AllGatherSeparateAndInPlace) {
  RunLocalRanks(n(), [](Comm& c) {
    for (int64_t count : {0, 1, 13}) {
      std::vector<double> send = RankData<double>(c.rank(), count);
      std::vector<double> recv(count * c.size(), -1);
      c.AllGather(send.data(), recv.data(), count, DType::kF64);
      std::vector<int32_t> inplace(count * c.size(), -1);
      for (int64_t i = 0; i < count; ++i) inplace[c.rank() * count + i] = Value<int32_t>(c.rank(), i);
      c.AllGather(inplace.data() + c.rank() * count, inplace.data(), count, DType::kI32);
      for (int r = 0; r < c.size(); ++r) {
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv[r * count + i], Value<double>(r, i));
          ASSERT_EQ(inplace[r * count + i], Value<int32_t>(r, i));
        }
      }
    }
  });
}

// Rank s sends (s + 2*d) % 4 elements to rank d (some zero), each element
// encoding (source, destination, index); receive blocks keep a gap of one.
int64_t A2aCount(int src, int dst) { return (src + 2 * dst) % 4; }
float A2aValue(int src, int dst, int64_t i) { return src * 1000.f + dst * 10.f + i * 0.25f; }

TEST_P(LocalCommTest, AllToAllVRaggedAndEmptyBlocks) {
  RunLocalRanks(n(), [](Comm& c) {
    const int n = c.size(), me = c.rank();
    std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
    std::vector<float> send;
    for (int d = 0; d < n; ++d) {
      sc[d] = A2aCount(me, d);
      sd[d] = static_cast<int64_t>(send.size());
      for (int64_t i = 0; i < sc[d]; ++i) send.push_back(A2aValue(me, d, i));
    }
    int64_t total = 0;
    for (int s = 0; s < n; ++s) {
      rc[s] = A2aCount(s, me);
      rd[s] = total;
      total += rc[s] + 1;
    }
    std::vector<float> recv(total, -7.f);
    c.AllToAllV(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DType::kF32);
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < rc[s]; ++i) ASSERT_EQ(recv[rd[s] + i], A2aValue(s, me, i));
      ASSERT_EQ(recv[rd[s] + rc[s]], -7.f) << "gap overwritten";
    }
  });
}

TEST_P(LocalCommTest, BroadcastFromEveryRoot) {
  RunLocalRanks(n(), [](Comm& c) {
    for (int root = 0; root < c.size(); ++root) {
      for (int64_t count : {0, 6}) {
        std::vector<int64_t> buf = RankData<int64_t>(c.rank(), count);
        c.Broadcast(buf.data(), count, DType::kI64, root);
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], Value<int64_t>(root, i));
      }
    }
  });
}

TEST_P(LocalCommTest, AsyncCollectivesWaitedOutOfOrder) {
  RunLocalRanks(n(), [](Comm& c) {
    const int n = c.size(), me = c.rank();
    const int64_t count = 257;
    std::vector<float> a = RankData<float>(me, count);
    std::vector<double> gather_in = RankData<double>(me, 3), gather_out(3 * n);
    std::vector<int32_t> rs_in = RankData<int32_t>(me, 5 * n), rs_out(5);
    Request ra = c.IAllReduce(a.data(), count, DType::kF32, ReduceOp::kSum);
    Request rg = c.IAllGather(gather_in.data(), gather_out.data(), 3, DType::kF64);
    Request rr = c.IReduceScatter(rs_in.data(), rs_out.data(), 5, DType::kI32, ReduceOp::kMax);
    rr.Wait();
    ra.Wait();
    ra.Wait();  // idempotent
    rg.Wait();
    EXPECT_TRUE(ra.Test() && rg.Test() && rr.Test());
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(a[i], Reduced<float>(n, i, ReduceOp::kSum));
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 3; ++i) ASSERT_EQ(gather_out[r * 3 + i], Value<double>(r, i));
    }
    for (int i = 0; i < 5; ++i) ASSERT_EQ(rs_out[i], Reduced<int32_t>(n, me * 5 + i, ReduceOp::kMax));
    EXPECT_TRUE(Request().Test());
    Request().Wait();  // a default handle is complete
  });
}

TEST_P(LocalCommTest, SyncCollectiveRunsAfterQueuedAsyncWork) {
  RunLocalRanks(n(), [](Comm& c) {
    const int n = c.size();
    std::vector<std::vector<double>> bufs;
    std::vector<Request> reqs;
    for (int k = 0; k < 8; ++k) bufs.push_back(RankData<double>(c.rank() + k, 100));
    for (int k = 0; k < 8; ++k) {
      reqs.push_back(c.IAllReduce(bufs[k].data(), 100, DType::kF64, ReduceOp::kSum));
    }
    // The sync op drains the queue first, so every async op has finished.
    std::vector<double> b = RankData<double>(c.rank(), 10);
    c.AllReduce(b.data(), 10, DType::kF64, ReduceOp::kMin);
    for (Request& r : reqs) EXPECT_TRUE(r.Test());
    for (int k = 0; k < 8; ++k) {
      for (int64_t i = 0; i < 100; ++i) {
        double want = Value<double>(k, i);
        for (int r = 1; r < n; ++r) want += Value<double>(r + k, i);
        ASSERT_EQ(bufs[k][i], want);
      }
    }
    for (int64_t i = 0; i < 10; ++i) ASSERT_EQ(b[i], Reduced<double>(n, i, ReduceOp::kMin));
  });
}

// Ranks as a grid of rows of 2: row = rank / 2, column = rank % 2.
TEST_P(LocalCommTest, SplitIntoRowsAndColumnsUsedConcurrently) {
  RunLocalRanks(n(), [](Comm& c) {
    const int n = c.size(), me = c.rank();
    std::unique_ptr<Comm> row = c.Split(me / 2, me);
    std::unique_ptr<Comm> col = c.Split(me % 2, me);
    std::vector<int> row_members, col_members;
    for (int r = 0; r < n; ++r) {
      if (r / 2 == me / 2) row_members.push_back(r);
      if (r % 2 == me % 2) col_members.push_back(r);
    }
    ASSERT_EQ(row->size(), static_cast<int>(row_members.size()));
    ASSERT_EQ(col->size(), static_cast<int>(col_members.size()));
    EXPECT_EQ(row->rank(), me % 2);
    EXPECT_EQ(col->rank(), me / 2);
    EXPECT_EQ(row->name(), "local split " + std::to_string(row->size()));

    // Both splits busy at once: async on each, then sync on each.
    const int64_t count = 301;
    std::vector<float> on_row = RankData<float>(me, count), on_col = RankData<float>(me, count);
    Request rr = row->IAllReduce(on_row.data(), count, DType::kF32, ReduceOp::kSum);
    Request rc = col->IAllReduce(on_col.data(), count, DType::kF32, ReduceOp::kSum);
    std::vector<int64_t> row_ids(row->size()), col_ids(col->size());
    int64_t my_id = me;
    col->AllGather(&my_id, col_ids.data(), 1, DType::kI64);
    row->AllGather(&my_id, row_ids.data(), 1, DType::kI64);
    rc.Wait();
    rr.Wait();
    for (size_t k = 0; k < row_members.size(); ++k) EXPECT_EQ(row_ids[k], row_members[k]);
    for (size_t k = 0; k < col_members.size(); ++k) EXPECT_EQ(col_ids[k], col_members[k]);
    for (int64_t i = 0; i < count; ++i) {
      float want_row = Value<float>(row_members[0], i), want_col = Value<float>(col_members[0], i);
      for (size_t k = 1; k < row_members.size(); ++k) want_row += Value<float>(row_members[k], i);
      for (size_t k = 1; k < col_members.size(); ++k) want_col += Value<float>(col_members[k], i);
      ASSERT_EQ(on_row[i], want_row);
      ASSERT_EQ(on_col[i], want_col);
    }

    // Keys order the new ranks; a split of a split works too.
    std::unique_ptr<Comm> reversed = c.Split(0, -me);
    EXPECT_EQ(reversed->rank(), n - 1 - me);
    std::unique_ptr<Comm> single = row->Split(row->rank(), 0);
    EXPECT_EQ(single->size(), 1);
    std::unique_ptr<Comm> shared = c.SplitShared();
    EXPECT_EQ(shared->size(), n);
    EXPECT_EQ(shared->rank(), me);
  });
}

TEST_P(LocalCommTest, RingExchangeWithTagsAndNonBlockingP2P) {
  RunLocalRanks(n(), [](Comm& c) {
    const int n = c.size(), me = c.rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    // Post the receives first, in the opposite tag order of the sends.
    std::vector<int32_t> got_b(4), got_a(3);
    Request rb = c.IRecv(got_b.data(), 4, DType::kI32, prev, /*tag=*/2);
    Request ra = c.IRecv(got_a.data(), 3, DType::kI32, prev, /*tag=*/1);
    std::vector<int32_t> a = {me, 10 * me, 100 * me}, b = {me + 1, me + 2, me + 3, me + 4};
    Request sa = c.ISend(a.data(), 3, DType::kI32, next, 1);
    Request sb = c.ISend(b.data(), 4, DType::kI32, next, 2);
    sa.Wait();
    sb.Wait();
    ra.Wait();
    rb.Wait();
    EXPECT_EQ(got_a, (std::vector<int32_t>{prev, 10 * prev, 100 * prev}));
    EXPECT_EQ(got_b, (std::vector<int32_t>{prev + 1, prev + 2, prev + 3, prev + 4}));

    // Several messages with one tag arrive in send order; blocking calls
    // that meet queued messages, and empty messages.
    for (int k = 0; k < 5; ++k) {
      double v = me * 100 + k;
      c.Send(&v, 1, DType::kF64, next, 7);
    }
    c.Send(nullptr, 0, DType::kF64, next, 8);
    for (int k = 0; k < 5; ++k) {
      double v = -1;
      c.Recv(&v, 1, DType::kF64, prev, 7);
      EXPECT_EQ(v, prev * 100 + k);
    }
    c.Recv(nullptr, 0, DType::kF64, prev, 8);
  });
}

TEST_P(LocalCommTest, StatsFollowTheDocumentedModel) {
  RunLocalRanks(n(), [](Comm& c) {
    const int64_t n = c.size(), me = c.rank();
    std::vector<float> big(100 * n);
    std::vector<float> small(100);
    c.stats().Reset();
    c.AllReduce(big.data(), 100, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(c.stats().bytes_sent, 2 * (n - 1) * 400 / n);
    c.stats().Reset();
    c.ReduceScatter(big.data(), small.data(), 100, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(c.stats().bytes_sent, (n - 1) * 400);
    c.stats().Reset();
    c.IAllGather(small.data(), big.data(), 100, DType::kF32).Wait();
    EXPECT_EQ(c.stats().bytes_sent, (n - 1) * 400);
    c.stats().Reset();
    c.Broadcast(small.data(), 100, DType::kF32, 0);
    EXPECT_EQ(c.stats().bytes_sent, (n > 1 && me != n - 1) ? 400 : 0);
    c.stats().Reset();
    std::vector<int64_t> counts(n, 3), displs(n);
    for (int64_t r = 0; r < n; ++r) displs[r] = 3 * r;
    c.AllToAllV(big.data(), counts.data(), displs.data(), small.data(), counts.data(), displs.data(),
                DType::kF32);
    EXPECT_EQ(c.stats().bytes_sent, (n - 1) * 12);
    c.stats().Reset();
    c.Send(small.data(), 10, DType::kF64, (me + 1) % n, 0);
    c.Recv(small.data(), 10, DType::kF64, (me + n - 1) % n, 0);
    c.Barrier();
    EXPECT_EQ(c.stats().bytes_sent, 80);
    EXPECT_EQ(c.stats().ops, 3);
    EXPECT_GE(c.stats().seconds, 0.0);
  });
}

TEST_P(LocalCommTest, ExceptionOnOneRankPropagatesInsteadOfHanging) {
  std::atomic<int> aborted{0};
  try {
    RunLocalRanks(n(), [&](Comm& c) {
      std::unique_ptr<Comm> sub = c.Split(0, c.rank());
      std::vector<float> x(8, 1.f);
      Request pending = sub->IAllReduce(x.data(), 8, DType::kF32, ReduceOp::kSum);
      pending.Wait();
      if (c.rank() == n() - 1) throw std::runtime_error("rank failed on purpose");
      try {
        c.AllReduce(x.data(), 8, DType::kF32, ReduceOp::kSum);  // never completes
        float y = 0;
        c.Recv(&y, 1, DType::kF32, n() - 1, 3);                 // never sent
      } catch (const LocalAborted&) {
        ++aborted;
        throw;
      }
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank failed on purpose");
  }
  EXPECT_EQ(aborted.load(), n() - 1);
}

TEST_P(LocalCommTest, ExceptionWhileAsyncWorkIsQueued) {
  std::vector<std::vector<float>> bufs(n(), std::vector<float>(64));
  EXPECT_THROW(RunLocalRanks(n(), [&](Comm& c) {
                 if (c.rank() == 0) throw std::logic_error("early");
                 // Queued on rank != 0 only: the job must still finish.
                 Request r = c.IAllReduce(bufs[c.rank()].data(), 64, DType::kF32, ReduceOp::kSum);
                 r.Wait();
               }),
               std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalCommTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(LocalComm, SelfCommAndWorldWithoutMpirun) {
  std::unique_ptr<Comm> self = MakeSelfComm();
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
  std::vector<double> x = {1.5, -2};
  self->AllReduce(x.data(), 2, DType::kF64, ReduceOp::kMax);
  EXPECT_EQ(x, (std::vector<double>{1.5, -2}));
  std::unique_ptr<Comm> sub = self->Split(3, 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(self->stats().bytes_sent, 0);

  if (!LaunchedByMpirun()) {
    std::unique_ptr<Comm> world = InitWorld(nullptr, nullptr);
    EXPECT_EQ(world->size(), 1);
    EXPECT_EQ(world->rank(), 0);
    FinalizeWorld();  // nothing to finalize; must be harmless
  }
}

TEST(CommStats, BytesModel) {
  EXPECT_EQ(sent_bytes::AllReduce(1000, 1), 0);
  EXPECT_EQ(sent_bytes::AllReduce(1000, 4), 1500);
  EXPECT_EQ(sent_bytes::AllGather(100, 4), 300);
  EXPECT_EQ(sent_bytes::ReduceScatter(100, 3), 200);
  EXPECT_EQ(sent_bytes::Broadcast(100, 4, 0, 3), 100);  // chain 3,0,1,2
  EXPECT_EQ(sent_bytes::Broadcast(100, 4, 1, 2), 0);  // last of the chain 2,3,0,1
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
}

}  // namespace
}  // namespace myriad::comm
