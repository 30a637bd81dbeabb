// HierarchicalComm and int8 compression on real MPI ranks (run by hier.sh:
// mpirun -np 4, emulated as 2 nodes x 2 ranks). Checks, against the flat
// MPI comm and against the exact sum each rank computes itself in double
// from every rank's (deterministic) data:
//   - hierarchical float sum == flat (1e-6 of sum |x|), integers exact,
//   - int8 inter stage within the quantisation bound (see
//     hierarchical_test.cc for its derivation), bitwise equal on all ranks,
//   - async compressed all-reduces in flight == the same ops issued sync,
//   - bytes across nodes drop >= 3.5x with int8 (the ratio is printed).
// With --funneled, MPI is first initialised with MPI_THREAD_FUNNELED, so the
// decorators must run their async ops at issue (DecoratorAsyncInline).
// Prints PASS/FAIL lines from rank 0; exits non-zero on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

// The C API only (OpenMPI's C++ bindings would need their own library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "core/rng.h"
#include "train/comm/hierarchical.h"
#include "train/comm/world.h"

using namespace myriad;
using namespace myriad::comm;

namespace {

std::vector<float> RankFloats(int rank, int64_t n) {
  Rng rng(1234 + rank);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.Normal();
  return v;
}

int failures = 0;

void Check(Comm& world, bool ok, const char* what) {
  int32_t bad = ok ? 0 : 1;
  world.AllReduce(&bad, 1, DType::kI32, ReduceOp::kMax);
  if (bad) ++failures;
  if (world.rank() == 0) std::printf("%s %s\n", bad ? "FAIL" : "PASS", what);
}

void RunChecks(const std::unique_ptr<Comm>& world) {
  const int n = world->size(), me = world->rank();
  const int per_node = n % 2 == 0 ? n / 2 : 1;
  HierarchicalComm hier(*world, HierOptions{per_node, {}});
  HierarchicalComm hier8(*world, HierOptions{per_node, {Compression::kInt8, true, 256}});
  const int L = hier.local_size(), N = hier.num_nodes();
  if (me == 0) std::printf("%s; %s\n", hier.name().c_str(), hier8.name().c_str());

  // Hierarchical == flat.
  bool ok = true;
  for (int64_t count : {int64_t{1}, int64_t{999}, int64_t{100003}}) {
    std::vector<float> a = RankFloats(me, count), b = a, mag(count);
    for (int64_t i = 0; i < count; ++i) mag[i] = std::fabs(a[i]);
    world->AllReduce(b.data(), count, DType::kF32, ReduceOp::kSum);
    world->AllReduce(mag.data(), count, DType::kF32, ReduceOp::kSum);
    hier.AllReduce(a.data(), count, DType::kF32, ReduceOp::kSum);
    for (int64_t i = 0; i < count; ++i) ok = ok && std::fabs(a[i] - b[i]) <= 1e-6 * mag[i];
    std::vector<int64_t> p(count), q(count);
    for (int64_t i = 0; i < count; ++i) p[i] = q[i] = (i * 7919 + me * 104729) % 20011 - 10000;
    world->AllReduce(q.data(), count, DType::kI64, ReduceOp::kSum);
    hier.AllReduce(p.data(), count, DType::kI64, ReduceOp::kSum);
    ok = ok && p == q;
  }
  Check(*world, ok, "hierarchical all-reduce == flat (float within 1e-6 of sum|x|, int64 exact)");

  // int8 within bound, and bytes across nodes.
  const int64_t count = 1 << 20;
  std::vector<std::vector<float>> all(n);
  for (int r = 0; r < n; ++r) all[r] = RankFloats(r, count);
  std::vector<float> a = all[me], b = a;
  hier.AllReduce(b.data(), count, DType::kF32, ReduceOp::kSum);
  const HierStats plain = hier.last_op_stats();
  hier8.AllReduce(a.data(), count, DType::kF32, ReduceOp::kSum);
  const HierStats packed = hier8.last_op_stats();
  const int64_t shard = (count + L - 1) / L;
  double worst_ratio = 0;  // error / bound
  for (int64_t i0 = 0; i0 < count; i0 += shard) {
    const int64_t i1 = std::min(count, i0 + shard);
    double sum_m = 0, big = 0;
    for (int k = 0; k < N; ++k) {
      double m = 0;
      for (int64_t i = i0; i < i1; ++i) {
        double part = 0;
        for (int r = k * L; r < (k + 1) * L; ++r) part += all[r][i];
        m = std::max(m, std::fabs(part));
      }
      sum_m += m;
    }
    for (int64_t i = i0; i < i1; ++i) big = std::max(big, std::fabs(static_cast<double>(b[i])));
    const double bound = sum_m / 254 + (big + sum_m / 254) / 254 + 1e-5;
    for (int64_t i = i0; i < i1; ++i) worst_ratio = std::max(worst_ratio, std::fabs(a[i] - b[i]) / bound);
  }
  std::vector<float> first(count);
  std::copy(a.begin(), a.end(), first.begin());
  world->Broadcast(first.data(), count, DType::kF32, 0);
  Check(*world, worst_ratio <= 1.0, "int8 inter stage within its quantisation bound");
  Check(*world, first == a, "int8 result bitwise equal on every rank");
  const double ratio = static_cast<double>(plain.inter_bytes) / static_cast<double>(packed.inter_bytes);
  if (me == 0) {
    std::printf("bytes per rank, %lld floats: intra %lld, inter fp32 %lld, inter int8 %lld: %.2fx fewer "
                "across nodes; max error / bound %.3f\n",
                static_cast<long long>(count), static_cast<long long>(plain.intra_bytes),
                static_cast<long long>(plain.inter_bytes), static_cast<long long>(packed.inter_bytes),
                ratio, worst_ratio);
  }
  Check(*world, N == 1 || ratio >= 3.5, "bytes across nodes drop >= 3.5x with int8");

  // Async (several buckets in flight) == sync, on fresh compressors.
  {
    HierarchicalComm ha(*world, HierOptions{per_node, {Compression::kInt8, true, 256}});
    HierarchicalComm hs(*world, HierOptions{per_node, {Compression::kInt8, true, 256}});
    std::vector<std::vector<float>> x, y;
    for (int k = 0; k < 5; ++k) x.push_back(RankFloats(me * 10 + k, 5000 + 777 * k));
    y = x;
    for (int round = 0; round < 3; ++round) {
      std::vector<Request> reqs;
      for (auto& v : x) reqs.push_back(ha.IAllReduce(v.data(), static_cast<int64_t>(v.size()), DType::kF32, ReduceOp::kSum));
      for (auto& v : y) hs.AllReduce(v.data(), static_cast<int64_t>(v.size()), DType::kF32, ReduceOp::kSum);
      for (auto& r : reqs) r.Wait();
    }
    Check(*world, x == y, "async compressed all-reduces (5 in flight, 3 rounds) == sync");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool funneled = argc > 1 && std::strcmp(argv[1], "--funneled") == 0;
  if (funneled) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  std::unique_ptr<Comm> world = InitWorld(&argc, &argv);
  if (funneled) Check(*world, DecoratorAsyncInline(), "decorators run async ops at issue under MPI_THREAD_FUNNELED");
  RunChecks(world);  // every communicator it made is gone before finalising
  world.reset();
  FinalizeWorld();
  return failures == 0 ? 0 : 1;
}
