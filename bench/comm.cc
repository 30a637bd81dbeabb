// Gradient all-reduce under mpirun (bench/comm.sh: 4 ranks as 2 emulated
// nodes x 2): the flat MPI all-reduce (the peer: OpenMPI's own algorithm)
// against HierarchicalComm, plain and with bf16 / int8 inter-node stages, and
// the fraction of the reduction hidden under an emulated backward pass.
//
//   mpirun -np 4 bench_comm [--sizes-kib 256,1024,4096,16384,65536] [--reps 7]
//       [--ranks-per-node 2] [--layers 8] [--bucket-kib 4096] [--json-out FILE]
//
// Every figure is the median over reps of the slowest rank's time, the
// variants alternating within each rep (A B C D A B C D ...). Prints a table
// (rank 0, stdout), one JSON line per measurement, and the summary JSON line
// last (BENCHMARKS.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_args.h"
#include "backend/cpu/kernel_bench.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "train/comm/hierarchical.h"
#include "train/comm/world.h"

using namespace myriad;
using namespace myriad::comm;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds of fn on the slowest rank, from a barrier. A collective ends at
// about the same moment on every rank, so each rank timing its own call and
// taking the largest is right; work without a final synchronisation (the
// emulated backward) sets until_all, adding a barrier before the clock stops
// so that time a rank spends descheduled (more ranks than cores) counts.
double TimeCollective(Comm& world, const std::function<void()>& fn, bool until_all = false) {
  world.Barrier();
  const double t0 = Now();
  fn();
  if (until_all) world.Barrier();
  double dt = Now() - t0;
  world.AllReduce(&dt, 1, DType::kF64, ReduceOp::kMax);
  return dt;
}

std::vector<int64_t> ParseSizes(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

struct Variant {
  std::string name;
  Comm* comm;
  HierarchicalComm* hier;  // null for the flat comm
};

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<Comm> world = InitWorld(&argc, &argv);
  BenchArgs args;
  args.config = "(none)";  // this benchmark has no model config
  args.opts = {{"--sizes-kib", "256,1024,4096,16384,65536"}, {"--reps", "7"},
               {"--ranks-per-node", "2"}, {"--layers", "8"}, {"--bucket-kib", "4096"},
               {"--json-out", ""}};
  if (!args.Parse(argc, argv)) return 2;
  const int reps = args.Int("--reps"), per_node = args.Int("--ranks-per-node");
  const int layers = args.Int("--layers");
  const int me = world->rank(), n = world->size();
  const bool root = me == 0;

  HierarchicalComm hier(*world, HierOptions{per_node, {}});
  HierarchicalComm hier_bf16(*world, HierOptions{per_node, {Compression::kBf16, true, 256}});
  HierarchicalComm hier_int8(*world, HierOptions{per_node, {Compression::kInt8, true, 256}});
  std::vector<Variant> variants = {{"flat", world.get(), nullptr},
                                   {"hier", &hier, &hier},
                                   {"hier+bf16", &hier_bf16, &hier_bf16},
                                   {"hier+int8", &hier_int8, &hier_int8}};
  nlohmann::json config = {{"ranks", n}, {"nodes", hier.num_nodes()}, {"ranks_per_node", hier.local_size()},
                           {"emulated_nodes", true}, {"reps", reps}, {"threads_per_rank", 1},
                           {"dtype", "f32"}, {"int8_block", 256}};
  const double read_bw = root ? MeasureReadBandwidthGBs() : 0;  // rough roofline for shared memory
  if (root) {
    std::printf("comm benchmark: %d ranks as %d emulated nodes x %d (one machine: every link is shared memory)\n",
                n, hier.num_nodes(), hier.local_size());
    std::printf("medians of %d reps of the slowest rank, variants alternating; DRAM read %.1f GB/s\n\n",
                reps, read_bw);
    std::printf("%10s %-10s %10s %8s %12s %12s %12s %10s\n", "size", "variant", "time ms", "vs flat",
                "bytes/rank", "intra", "inter", "max rel err");
  }
  std::vector<nlohmann::json> lines;

  // ---- All-reduce sweep.
  double headline_hier = 0, headline_flat = 0, headline_int8_ratio = 0;
  for (int64_t kib : ParseSizes(args.Str("--sizes-kib"))) {
    const int64_t count = kib * 1024 / 4;
    Rng rng(99 + me);
    std::vector<float> input(count), buf(count), exact(count);
    for (auto& x : input) x = rng.Normal();
    // Reference: plain hierarchical result, and the error of each variant on
    // one call with fresh error-feedback state.
    std::vector<double> max_err(variants.size(), 0.0);
    std::vector<HierStats> bytes(variants.size());
    std::vector<int64_t> flat_bytes(variants.size(), 0);
    exact = input;
    world->AllReduce(exact.data(), count, DType::kF32, ReduceOp::kSum);
    double scale = 0;
    for (float x : exact) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (size_t v = 0; v < variants.size(); ++v) {
      buf = input;
      const int64_t before = variants[v].comm->stats().bytes_sent;
      variants[v].comm->AllReduce(buf.data(), count, DType::kF32, ReduceOp::kSum);
      flat_bytes[v] = variants[v].comm->stats().bytes_sent - before;
      if (variants[v].hier) {
        bytes[v] = variants[v].hier->last_op_stats();
        variants[v].hier->inter_compressor().ForgetResiduals();
      }
      for (int64_t i = 0; i < count; ++i) {
        max_err[v] = std::max(max_err[v], std::fabs(static_cast<double>(buf[i]) - exact[i]) / scale);
      }
    }
    std::vector<std::vector<double>> times(variants.size());
    for (int r = 0; r < reps + 1; ++r) {  // rep 0 warms up
      for (size_t v = 0; v < variants.size(); ++v) {
        std::memcpy(buf.data(), input.data(), static_cast<size_t>(count) * 4);
        const double dt = TimeCollective(*world, [&] {
          variants[v].comm->AllReduce(buf.data(), count, DType::kF32, ReduceOp::kSum);
        });
        if (r > 0) times[v].push_back(dt);
      }
    }
    const double flat_t = Median(times[0]);
    for (size_t v = 0; v < variants.size(); ++v) {
      const double t = Median(times[v]);
      // Bytes of the flat comm: comm.h's ring model, the split between links unknown.
      const int64_t intra = variants[v].hier ? bytes[v].intra_bytes : -1;
      const int64_t inter = variants[v].hier ? bytes[v].inter_bytes : -1;
      if (root) {
        const std::string split = variants[v].hier ? std::to_string(intra) : "-";
        std::printf("%7lld KiB %-10s %10.3f %7.2fx %12lld %12s %12s %10.2e\n", static_cast<long long>(kib),
                    variants[v].name.c_str(), t * 1e3, flat_t / t, static_cast<long long>(flat_bytes[v]),
                    split.c_str(), variants[v].hier ? std::to_string(inter).c_str() : "-", max_err[v]);
      }
      if (v == 0) continue;
      const double algbw = count * 4.0 / t / 1e9, flat_algbw = count * 4.0 / flat_t / 1e9;
      const double busbw = 2.0 * (n - 1) / n * count * 4.0 / t / 1e9;
      nlohmann::json line = {{"bench", "comm_allreduce"},
                             {"config", config},
                             {"size_bytes", count * 4},
                             {"variant", variants[v].name},
                             {"myriad", algbw},
                             {"peer", flat_algbw},
                             {"unit", "GB/s (buffer bytes / median time; peer: flat MPI all-reduce)"},
                             {"ratio", algbw / flat_algbw},
                             {"roofline_fraction", read_bw > 0 ? busbw / read_bw : 0},
                             {"time_ms", t * 1e3},
                             {"flat_time_ms", flat_t * 1e3},
                             {"intra_bytes_per_rank", intra},
                             {"inter_bytes_per_rank", inter},
                             {"inter_bytes_vs_plain", static_cast<double>(bytes[1].inter_bytes) / std::max<int64_t>(1, inter)},
                             {"max_rel_err", max_err[v]}};
      lines.push_back(line);
      if (variants[v].name == "hier") {
        headline_hier = algbw;
        headline_flat = flat_algbw;
      }
      if (variants[v].name == "hier+int8") headline_int8_ratio = static_cast<double>(bytes[1].inter_bytes) / inter;
    }
    if (root) std::printf("\n");
  }

  // ---- Overlap with an emulated backward pass: `layers` layers, each a GEMM
  // followed by an async all-reduce of that layer's gradient bucket.
  const int64_t bucket = args.Int("--bucket-kib") * 1024 / 4;
  std::vector<std::vector<float>> grads(layers, std::vector<float>(bucket, 0.5f));
  auto all_reduce_buckets = [&](Comm& c) {
    std::vector<Request> reqs;
    for (int l = 0; l < layers; ++l) {
      reqs.push_back(c.IAllReduce(grads[l].data(), bucket, DType::kF32, ReduceOp::kSum));
    }
    for (auto& r : reqs) r.Wait();
  };
  // GEMM size: per-layer compute about equal to one bucket's all-reduce on the
  // plain hierarchical comm (both measured here, on this rank's share of the cores).
  double t_bucket = 0;
  {
    std::vector<double> ts;
    for (int r = 0; r < 3; ++r) {
      ts.push_back(TimeCollective(*world, [&] {
        hier.AllReduce(grads[0].data(), bucket, DType::kF32, ReduceOp::kSum);
      }, true));
    }
    t_bucket = Median(ts);
  }
  std::vector<float> A, B, C;
  auto gemm = [&](int m) {
    ops::Gemm(Trans::kNo, Trans::kNo, m, m, m, 1.0f, A.data(), m, B.data(), m, 0.0f, C.data(), m);
  };
  // Seconds of one m^3 GEMM with every rank computing at once (as in
  // training), after a warm-up call (the first loads the BLAS).
  auto time_gemm = [&](int m) {
    A.assign(static_cast<size_t>(m) * m, 0.01f);
    B = A;
    C = A;
    gemm(m);
    std::vector<double> ts;
    for (int r = 0; r < 3; ++r) ts.push_back(TimeCollective(*world, [&] { gemm(m); }, true));
    return Median(ts);
  };
  int gemm_n = 128;
  double t_gemm = time_gemm(gemm_n);
  while (t_gemm < t_bucket && gemm_n < 4096) {
    gemm_n = std::min(4096, std::max(gemm_n + 16, static_cast<int>(gemm_n * std::cbrt(t_bucket / t_gemm))));
    t_gemm = time_gemm(gemm_n);
  }
  auto backward = [&](Comm* c) {
    std::vector<Request> reqs;
    for (int l = 0; l < layers; ++l) {
      gemm(gemm_n);
      if (c) reqs.push_back(c->IAllReduce(grads[l].data(), bucket, DType::kF32, ReduceOp::kSum));
    }
    for (auto& r : reqs) r.Wait();
  };
  if (root) {
    std::printf("overlap: %d layers, bucket %lld KiB, GEMM %d^3 per layer (%.2f ms; one bucket all-reduce %.2f ms)\n",
                layers, static_cast<long long>(args.Int("--bucket-kib")), gemm_n, t_gemm * 1e3, t_bucket * 1e3);
    std::printf("%-10s %12s %12s %12s %8s\n", "variant", "compute ms", "comm ms", "overlap ms", "hidden");
  }
  double headline_hidden = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    if (variants[v].name == "hier+bf16") continue;
    std::vector<double> tc, tm, to;
    for (int r = 0; r < reps + 1; ++r) {  // compute, comm, overlapped: alternating
      const double a = TimeCollective(*world, [&] { backward(nullptr); }, true);
      const double b = TimeCollective(*world, [&] { all_reduce_buckets(*variants[v].comm); }, true);
      const double c = TimeCollective(*world, [&] { backward(variants[v].comm); }, true);
      if (r > 0) {
        tc.push_back(a);
        tm.push_back(b);
        to.push_back(c);
      }
    }
    const double c_only = Median(tc), m_only = Median(tm), both = Median(to);
    const double hidden = 1 - (both - c_only) / m_only;
    if (root) {
      std::printf("%-10s %12.2f %12.2f %12.2f %7.0f%%\n", variants[v].name.c_str(), c_only * 1e3,
                  m_only * 1e3, both * 1e3, 100 * hidden);
    }
    lines.push_back({{"bench", "comm_overlap"},
                     {"config", config},
                     {"variant", variants[v].name},
                     {"layers", layers},
                     {"bucket_bytes", bucket * 4},
                     {"gemm_n", gemm_n},
                     {"compute_ms", c_only * 1e3},
                     {"comm_ms", m_only * 1e3},
                     {"overlapped_ms", both * 1e3},
                     {"hidden_fraction", hidden}});
    if (variants[v].name == "hier") headline_hidden = hidden;
  }

  nlohmann::json summary = {{"bench", "comm"},
                            {"config", config},
                            {"myriad", headline_hier},
                            {"peer", headline_flat},
                            {"unit", "GB/s at the largest size (hierarchical vs flat MPI all-reduce)"},
                            {"ratio", headline_flat > 0 ? headline_hier / headline_flat : 0},
                            {"roofline_fraction", read_bw > 0 ? 2.0 * (n - 1) / n * headline_hier / read_bw : 0},
                            {"inter_bytes_ratio_int8", headline_int8_ratio},
                            {"hidden_fraction_hier", headline_hidden}};
  if (root) {
    std::printf("\n");
    for (const auto& l : lines) std::printf("%s\n", l.dump().c_str());
    std::printf("%s\n", summary.dump().c_str());
    if (!args.Str("--json-out").empty()) std::ofstream(args.Str("--json-out")) << summary.dump() << "\n";
  }
  return 0;
}
