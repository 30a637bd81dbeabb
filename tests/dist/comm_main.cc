// MpiComm on real ranks: `mpirun -np N dist_comm` (any N; without mpirun it
// checks the size-1 world; with --funneled, MPI is first initialised with
// MPI_THREAD_FUNNELED so async collectives take the run-at-issue path). Every check builds its data from Val(rank, i),
// computes the answer serially, and prints one PASS/FAIL line from rank 0;
// the exit status is non-zero when any rank saw a mismatch.
//
// Val is a small multiple of 1/8, so float sums are exact in any order and
// MPI's reduction order cannot change the bits.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "train/comm/comm.h"
#include "train/comm/mpi_comm.h"
#include "train/comm/world.h"

using namespace myriad::comm;

namespace {

double Val(int rank, int64_t i) { return (rank + 1) * 0.5 + static_cast<double>(i % 97) * 0.125 - 3.0; }

// Val scaled to an integer (exact in every type; uint8 wraps).
template <typename T>
T Scaled(int rank, int64_t i) {
  return static_cast<T>(static_cast<int64_t>(Val(rank, i) * 8));
}

// Collects mismatches of one check on this rank.
struct Errors {
  std::string first;
  int64_t count = 0;
  void Expect(bool ok, const std::string& what) {
    if (ok) return;
    if (count++ == 0) first = what;
  }
};

int g_failed = 0;

// Runs one check on every rank; rank 0 prints whether all ranks passed.
void Check(Comm& world, const std::string& name, const std::function<void(Errors&)>& body) {
  Errors errors;
  body(errors);
  int64_t bad = errors.count;
  world.AllReduce(&bad, 1, DType::kI64, ReduceOp::kSum);
  if (bad != 0) {
    ++g_failed;
    if (errors.count > 0) std::printf("FAIL %s (rank %d): %s\n", name.c_str(), world.rank(), errors.first.c_str());
  }
  world.Barrier();
  if (world.rank() == 0) std::printf("%s %s\n", bad == 0 ? "PASS" : "FAIL", name.c_str());
  std::fflush(stdout);
}

template <typename T>
std::vector<T> Filled(int rank, int64_t count) {
  std::vector<T> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = Scaled<T>(rank, i);
  return v;
}

template <typename T>
T Expected(int n, int64_t i, ReduceOp op) {
  T acc = Scaled<T>(0, i);
  for (int r = 1; r < n; ++r) {
    const T x = Scaled<T>(r, i);
    acc = op == ReduceOp::kSum ? static_cast<T>(acc + x) : op == ReduceOp::kMax ? std::max(acc, x) : std::min(acc, x);
  }
  return acc;
}

template <typename T>
void AllReduceAllOps(Comm& c, DType t, Errors& e) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int64_t count : {0, 1, 7, 1001}) {
      std::vector<T> buf = Filled<T>(c.rank(), count);
      c.AllReduce(buf.data(), count, t, op);
      for (int64_t i = 0; i < count; ++i) {
        e.Expect(buf[i] == Expected<T>(c.size(), i, op), "dtype " + std::to_string(static_cast<int>(t)) + " op " +
                 std::to_string(static_cast<int>(op)) + " count " + std::to_string(count) + " i " +
                 std::to_string(i) + " got " + std::to_string(buf[i]) + " want " +
                 std::to_string(Expected<T>(c.size(), i, op)));
      }
    }
  }
}

void RunChecks(Comm& world) {
  const int n = world.size(), me = world.rank();

  Check(world, "allreduce f32/f64/i32/i64/u8 sum/max/min", [&](Errors& e) {
    AllReduceAllOps<float>(world, DType::kF32, e);
    AllReduceAllOps<double>(world, DType::kF64, e);
    AllReduceAllOps<int32_t>(world, DType::kI32, e);
    AllReduceAllOps<int64_t>(world, DType::kI64, e);
    AllReduceAllOps<uint8_t>(world, DType::kU8, e);
  });

  Check(world, "reduce-scatter", [&](Errors& e) {
    for (int64_t count : {0, 1, 5, 300}) {
      std::vector<float> send = Filled<float>(me, count * n), recv(count);
      world.ReduceScatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
      for (int64_t i = 0; i < count; ++i) e.Expect(recv[i] == Expected<float>(n, me * count + i, ReduceOp::kSum), "block");
    }
  });

  Check(world, "all-gather (and in place)", [&](Errors& e) {
    const int64_t count = 11;
    std::vector<double> send = Filled<double>(me, count), recv(count * n);
    world.AllGather(send.data(), recv.data(), count, DType::kF64);
    std::vector<double> inplace(count * n);
    std::copy(send.begin(), send.end(), inplace.begin() + me * count);
    world.AllGather(inplace.data() + me * count, inplace.data(), count, DType::kF64);
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        e.Expect(recv[r * count + i] == Scaled<double>(r, i), "separate");
        e.Expect(inplace[r * count + i] == Scaled<double>(r, i), "in place");
      }
    }
  });

  Check(world, "all-to-all-v ragged", [&](Errors& e) {
    // Rank s sends (s*3 + d) % 4 ints to rank d, each s*100000 + d*100 + i.
    auto count_of = [](int s, int d) { return static_cast<int64_t>((s * 3 + d) % 4); };
    std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
    std::vector<int32_t> send;
    for (int d = 0; d < n; ++d) {
      sc[d] = count_of(me, d);
      sd[d] = static_cast<int64_t>(send.size());
      for (int64_t i = 0; i < sc[d]; ++i) send.push_back(me * 100000 + d * 100 + static_cast<int>(i));
    }
    int64_t total = 0;
    for (int s = 0; s < n; ++s) {
      rc[s] = count_of(s, me);
      rd[s] = total;
      total += rc[s];
    }
    std::vector<int32_t> recv(total, -1);
    world.AllToAllV(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DType::kI32);
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < rc[s]; ++i) e.Expect(recv[rd[s] + i] == s * 100000 + me * 100 + i, "row from " + std::to_string(s));
    }
  });

  Check(world, "broadcast from every root", [&](Errors& e) {
    for (int root = 0; root < n; ++root) {
      std::vector<int64_t> buf = Filled<int64_t>(me, 9);
      world.Broadcast(buf.data(), 9, DType::kI64, root);
      for (int64_t i = 0; i < 9; ++i) e.Expect(buf[i] == Scaled<int64_t>(root, i), "root " + std::to_string(root));
    }
  });

  Check(world, "async collectives waited out of order, then a sync one", [&](Errors& e) {
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 6; ++k) bufs.push_back(Filled<float>(me, 500 + k));
    std::vector<double> g_in = Filled<double>(me, 4), g_out(4 * n);
    std::vector<Request> reqs;
    for (int k = 0; k < 6; ++k) reqs.push_back(world.IAllReduce(bufs[k].data(), 500 + k, DType::kF32, ReduceOp::kSum));
    Request rg = world.IAllGather(g_in.data(), g_out.data(), 4, DType::kF64);
    rg.Wait();
    for (int k = 5; k >= 0; --k) reqs[k].Wait();
    int32_t x = me;
    world.AllReduce(&x, 1, DType::kI32, ReduceOp::kMax);
    e.Expect(x == n - 1, "sync after async");
    for (int k = 0; k < 6; ++k) {
      for (int64_t i = 0; i < 500 + k; ++i) e.Expect(bufs[k][i] == Expected<float>(n, i, ReduceOp::kSum), "async allreduce");
    }
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 4; ++i) e.Expect(g_out[r * 4 + i] == Scaled<double>(r, i), "async allgather");
    }
  });

  Check(world, "p2p ring with tags (ISend/IRecv) and blocking Send/Recv", [&](Errors& e) {
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    int64_t got_a = -1, got_b[2] = {-1, -1};
    Request rb = world.IRecv(got_b, 2, DType::kI64, prev, 22);
    Request ra = world.IRecv(&got_a, 1, DType::kI64, prev, 11);
    int64_t a = me * 10, b[2] = {me * 10 + 1, me * 10 + 2};
    Request sa = world.ISend(&a, 1, DType::kI64, next, 11);
    Request sb = world.ISend(b, 2, DType::kI64, next, 22);
    ra.Wait();
    rb.Wait();
    sa.Wait();
    sb.Wait();
    e.Expect(got_a == prev * 10 && got_b[0] == prev * 10 + 1 && got_b[1] == prev * 10 + 2, "tagged ring");
    if (n > 1) {
      // Even ranks send first, odd ranks receive first: no deadlock on rendezvous sends.
      std::vector<float> out = Filled<float>(me, 100000), in(100000);
      if (me % 2 == 0) {
        world.Send(out.data(), 100000, DType::kF32, next, 5);
        world.Recv(in.data(), 100000, DType::kF32, prev, 5);
      } else {
        world.Recv(in.data(), 100000, DType::kF32, prev, 5);
        world.Send(out.data(), 100000, DType::kF32, next, 5);
      }
      for (int64_t i = 0; i < 100000; i += 997) e.Expect(in[i] == Scaled<float>(prev, i), "blocking ring");
    }
  });

  Check(world, "split 2x2 grid, both splits busy at once", [&](Errors& e) {
    std::unique_ptr<Comm> row = world.Split(me / 2, me), col = world.Split(me % 2, me);
    e.Expect(row->rank() == me % 2 && col->rank() == me / 2, "ranks in splits");
    std::vector<int64_t> on_row = {me}, on_col = {me};
    Request rr = row->IAllReduce(on_row.data(), 1, DType::kI64, ReduceOp::kSum);
    Request rc = col->IAllReduce(on_col.data(), 1, DType::kI64, ReduceOp::kSum);
    rc.Wait();
    rr.Wait();
    int64_t want_row = 0, want_col = 0;
    for (int r = 0; r < n; ++r) {
      if (r / 2 == me / 2) want_row += r;
      if (r % 2 == me % 2) want_col += r;
    }
    e.Expect(on_row[0] == want_row && on_col[0] == want_col, "row/col sums");
  });

  Check(world, "two-node emulation: node all-reduce then cross-node equals flat", [&](Errors& e) {
    // "Nodes" of two ranks (rank / 2); leaders (node rank 0) reduce across
    // nodes, then each node broadcasts from its leader.
    std::unique_ptr<Comm> node = world.Split(me / 2, me);
    std::unique_ptr<Comm> cross = world.Split(node->rank(), me);
    const int64_t count = 1000;
    std::vector<double> flat = Filled<double>(me, count), hier = flat;
    world.AllReduce(flat.data(), count, DType::kF64, ReduceOp::kSum);
    node->AllReduce(hier.data(), count, DType::kF64, ReduceOp::kSum);
    if (node->rank() == 0) cross->AllReduce(hier.data(), count, DType::kF64, ReduceOp::kSum);
    node->Broadcast(hier.data(), count, DType::kF64, 0);
    for (int64_t i = 0; i < count; ++i) e.Expect(hier[i] == flat[i] && flat[i] == Expected<double>(n, i, ReduceOp::kSum), "sum");
    e.Expect(node->name().find("split " + std::to_string(node->size())) != std::string::npos, "name " + node->name());
  });

  Check(world, "split-shared: one machine holds every rank", [&](Errors& e) {
    std::unique_ptr<Comm> shared = world.SplitShared();
    e.Expect(shared->size() == n && shared->rank() == me, "size/rank");
    int64_t s = 1;
    shared->AllReduce(&s, 1, DType::kI64, ReduceOp::kSum);
    e.Expect(s == n, "sum over shared");
  });

  Check(world, "stats follow the documented model", [&](Errors& e) {
    std::vector<float> big(64 * n), small(64);
    CommStats before = world.stats();
    world.stats().Reset();
    world.AllReduce(big.data(), 64, DType::kF32, ReduceOp::kSum);
    e.Expect(world.stats().bytes_sent == 2 * (n - 1) * 256 / n, "allreduce bytes");
    world.stats().Reset();
    world.IReduceScatter(big.data(), small.data(), 64, DType::kF32, ReduceOp::kSum).Wait();
    world.AllGather(small.data(), big.data(), 64, DType::kF32);
    e.Expect(world.stats().bytes_sent == 2 * (n - 1) * 256 && world.stats().ops == 2, "rs+ag bytes");
    world.stats() = before;
  });
}

}  // namespace

int main(int argc, char** argv) {
  const bool funneled = argc > 1 && std::strcmp(argv[1], "--funneled") == 0;
  if (funneled) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  std::unique_ptr<Comm> world = InitWorld(&argc, &argv);
  if (funneled && MpiThreadMultiple()) {
    std::printf("FAIL --funneled: MpiThreadMultiple() is true after MPI_THREAD_FUNNELED\n");
    return 1;
  }
  if (world->rank() == 0) {
    std::printf("world: %s, launched by mpirun: %s, MPI_THREAD_MULTIPLE: %s\n", world->name().c_str(),
                LaunchedByMpirun() ? "yes" : "no",
                LaunchedByMpirun() ? (MpiThreadMultiple() ? "yes" : "no") : "n/a");
  }
  RunChecks(*world);
  const int failed = g_failed;
  world.reset();
  FinalizeWorld();
  return failed == 0 ? 0 : 1;
}
