// Myriad's side of bench/sparse_attention.py: DSA (cpu::dsa, src/backend/cpu/dsa/dsa.h)
// against Myriad's own dense flash attention (ops::Attention, causal) at one
// sequence length, prefill (Tq = Tk = T) and decode (one query against T
// keys). Inside the process the variants alternate rep by rep (DSA, dense,
// DSA, dense ...) and the medians are reported; one JSON line last.
//
//   bench_sparse_attention [--T 16384] [--B 1] [--H 8] [--Hkv 4] [--D 64] [--Hi 4] [--Di 32]
//       [--K 2048] [--reps 3] [--decode-reps 30] [--skip-dense-above 0] [--shared 4]
//       [--roofline 1] [--index-precision int8] [--json-out FILE]
//
// --index-precision int8|fp32: the indexer's arithmetic for the DSA figure
// (dsa.h, IndexerPrecision); the other precision's indexer is timed too and
// reported beside it ("indexer_other"). The sparse attention schedule comes
// from the kernel lab's tuned table when there is one (tuned/kernels.json or
// $MYRIAD_TUNED_TABLE), else the built-in default; the JSON says which.
//
// --skip-dense-above T0 (0: never): for T > T0 the dense prefill is not run at
// T; it is measured at T0 and scaled by (T/T0)^2 (causal attention is O(T^2)),
// reported as "dense_extrapolated_s" with "dense_measured": false -- an
// extrapolation, not a measurement.
// Decode is timed with the process's OpenMP threads and again on one thread
// ("decode.one_thread").
// --shared N: also times the indexer run once for N layers of attention
// (IndexerTopK + N x SparseAttention) against N x (IndexerTopK + SparseAttention).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/kernel_bench.h"
#include "core/rng.h"
#include "lab/lab.h"
#include "backend/cpu/dsa/dsa.h"
#include "ops/ops.h"

using namespace myriad;
namespace dsa = myriad::cpu::dsa;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void Fill(std::vector<float>* v, Rng* rng, float scale) {
  for (auto& x : *v) x = scale * rng->Normal();
}

struct Shape {
  int B, H, Hkv, D, Hi, Di, K;
};

dsa::IndexerPrecision g_precision = dsa::IndexerPrecision::kInt8;

// Inputs and outputs of one (B, Tq, Tk) problem, allocated and touched once.
struct Problem {
  Shape s;
  int Tq, Tk;
  std::vector<float> q, k, v, qi, ki, wi, out, lse, dense_out;
  std::vector<int32_t> idx;

  Problem(const Shape& sh, int Tq_, int Tk_, uint64_t seed) : s(sh), Tq(Tq_), Tk(Tk_) {
    Rng rng(seed);
    q.resize(int64_t{s.B} * Tq * s.H * s.D);
    k.resize(int64_t{s.B} * Tk * s.Hkv * s.D);
    v.resize(k.size());
    qi.resize(int64_t{s.B} * Tq * s.Hi * s.Di);
    ki.resize(int64_t{s.B} * Tk * s.Di);
    wi.resize(int64_t{s.B} * Tq * s.Hi);
    Fill(&q, &rng, 1.f), Fill(&k, &rng, 1.f), Fill(&v, &rng, 1.f);
    Fill(&qi, &rng, 0.5f), Fill(&ki, &rng, 0.5f), Fill(&wi, &rng, 0.5f);
    out.assign(q.size(), 0.f);
    dense_out.assign(q.size(), 0.f);
    lse.assign(int64_t{s.B} * s.H * Tq, 0.f);
    idx.assign(int64_t{s.B} * Tq * s.K, 0);
  }

  dsa::IndexerParams Indexer() {
    dsa::IndexerParams p;
    p.B = s.B, p.Tq = Tq, p.Tk = Tk, p.Hi = s.Hi, p.Di = s.Di, p.K = s.K;
    p.qi_batch_stride = int64_t{Tq} * s.Hi * s.Di, p.ki_batch_stride = int64_t{Tk} * s.Di;
    p.wi_batch_stride = int64_t{Tq} * s.Hi, p.idx_batch_stride = int64_t{Tq} * s.K;
    p.qi = qi.data(), p.ki = ki.data(), p.wi = wi.data(), p.idx = idx.data();
    p.precision = g_precision;
    return p;
  }
  dsa::SparseAttentionParams Sparse() {
    dsa::SparseAttentionParams p;
    p.B = s.B, p.Tq = Tq, p.Tk = Tk, p.H = s.H, p.Hkv = s.Hkv, p.D = s.D, p.K = s.K;
    p.scale = 1.f / std::sqrt(static_cast<float>(s.D));
    p.q_batch_stride = int64_t{Tq} * s.H * s.D, p.kv_batch_stride = int64_t{Tk} * s.Hkv * s.D;
    p.out_batch_stride = p.q_batch_stride, p.idx_batch_stride = int64_t{Tq} * s.K;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.idx = idx.data();
    p.out = out.data(), p.lse = lse.data();
    return p;
  }
  AttentionParams Dense() {
    AttentionParams p;
    p.B = s.B, p.Tq = Tq, p.Tk = Tk, p.H = s.H, p.Hkv = s.Hkv, p.D = s.D;
    p.scale = 1.f / std::sqrt(static_cast<float>(s.D));
    p.causal = true;
    p.q_batch_stride = int64_t{Tq} * s.H * s.D, p.kv_batch_stride = int64_t{Tk} * s.Hkv * s.D;
    p.out_batch_stride = p.q_batch_stride;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = dense_out.data(), p.lse = lse.data();
    return p;
  }

  // FLOPs (multiply-add = 2) of the three computations, causal counts exact.
  double IndexerFlops() const {
    double keys = 0;
    for (int t = 0; t < Tq; ++t) keys += Tk - Tq + t + 1;
    return s.B * keys * s.Hi * (2.0 * s.Di + 2.0);
  }
  double SparseFlops() const {
    double keys = 0;
    for (int t = 0; t < Tq; ++t) keys += std::min(s.K, Tk - Tq + t + 1);
    return s.B * keys * s.H * 4.0 * s.D;
  }
  double DenseFlops() const {
    double keys = 0;
    for (int t = 0; t < Tq; ++t) keys += Tk - Tq + t + 1;
    return s.B * keys * s.H * 4.0 * s.D;
  }
};

template <typename F>
double Time(F&& f) {
  const double t0 = Now();
  f();
  return Now() - t0;
}

std::string Arg(const std::map<std::string, std::string>& o, const std::string& k) { return o.at(k); }

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> o = {
      {"--T", "16384"}, {"--B", "1"},        {"--H", "8"},      {"--Hkv", "4"},
      {"--D", "64"},    {"--Hi", "4"},       {"--Di", "32"},    {"--K", "2048"},
      {"--reps", "3"},  {"--decode-reps", "30"}, {"--skip-dense-above", "0"},
      {"--shared", "4"}, {"--roofline", "1"}, {"--index-precision", "int8"}, {"--json-out", ""}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fprintf(stderr, "usage: bench_sparse_attention [--name value ...]; names and defaults:\n");
      for (const auto& [n, v] : o) std::fprintf(stderr, "  %s %s\n", n.c_str(), v.c_str());
      return 0;
    }
    if (!o.count(a) || i + 1 >= argc) {
      std::fprintf(stderr, "unknown flag or missing value: %s (try --help)\n", a.c_str());
      return 2;
    }
    o[a] = argv[++i];
  }
  auto I = [&](const char* n) { return std::atoi(Arg(o, n).c_str()); };
  if (o["--index-precision"] != "int8" && o["--index-precision"] != "fp32") {
    std::fprintf(stderr, "--index-precision must be int8 or fp32, not '%s'\n", o["--index-precision"].c_str());
    return 2;
  }
  g_precision = o["--index-precision"] == "int8" ? dsa::IndexerPrecision::kInt8 : dsa::IndexerPrecision::kFp32;
  const dsa::IndexerPrecision other_precision =
      g_precision == dsa::IndexerPrecision::kInt8 ? dsa::IndexerPrecision::kFp32 : dsa::IndexerPrecision::kInt8;
  const char* other_name = g_precision == dsa::IndexerPrecision::kInt8 ? "fp32" : "int8";
  Result<std::string> tuned = lab::InstallTunedKernelsFromDefaultPath();
  if (!tuned.ok()) {
    std::fprintf(stderr, "%s\n", tuned.status().message().c_str());
    return 2;
  }
  const int T = I("--T"), reps = std::max(1, I("--reps")), decode_reps = std::max(1, I("--decode-reps"));
  const int skip_dense_above = I("--skip-dense-above"), shared = I("--shared");
  const Shape sh{I("--B"), I("--H"), I("--Hkv"), I("--D"), I("--Hi"), I("--Di"), I("--K")};
  if (T < 1 || sh.H % sh.Hkv != 0 || sh.K < 1) {
    std::fprintf(stderr, "bad shape\n");
    return 2;
  }
  const int threads = ops::Active()->num_threads();

  // Warm-up at a small size: thread pool, code paths.
  {
    Problem w(sh, std::min(T, 2 * sh.K), std::min(T, 2 * sh.K), 1);
    for (int r = 0; r < 2; ++r) {
      auto ip = w.Indexer();
      dsa::IndexerTopK(ip);
      dsa::SparseAttention(w.Sparse());
      ops::Attention(w.Dense());
    }
  }

  // ---- prefill: Tq = Tk = T ------------------------------------------------
  Problem pf(sh, T, T, 42);
  const bool dense_at_T = skip_dense_above <= 0 || T <= skip_dense_above;
  const int Td = dense_at_T ? T : skip_dense_above;
  std::unique_ptr<Problem> pd;  // dense problem at Td when it differs from T
  if (!dense_at_T) pd = std::make_unique<Problem>(sh, Td, Td, 43);
  Problem& dense_pb = dense_at_T ? pf : *pd;
  std::vector<double> t_idx, t_att, t_dsa, t_dense, t_shared, t_other;
  for (int r = 0; r < reps; ++r) {
    t_other.push_back(Time([&] {
      dsa::IndexerParams ip = pf.Indexer();
      ip.precision = other_precision;
      dsa::IndexerTopK(ip);
    }));
    const double a = Time([&] { dsa::IndexerTopK(pf.Indexer()); });
    const double b = Time([&] { dsa::SparseAttention(pf.Sparse()); });
    t_idx.push_back(a), t_att.push_back(b), t_dsa.push_back(a + b);
    const double d = Time([&] { ops::Attention(dense_pb.Dense()); });
    t_dense.push_back(d);
    if (shared > 1) {
      t_shared.push_back(Time([&] {
        dsa::IndexerTopK(pf.Indexer());
        for (int l = 0; l < shared; ++l) dsa::SparseAttention(pf.Sparse());
      }));
    }
    std::fprintf(stderr, "  [myriad T=%d rep %d/%d] indexer %.3f s, sparse attention %.3f s, dsa %.3f s, "
                 "dense%s %.3f s%s\n", T, r + 1, reps, a, b, a + b,
                 dense_at_T ? "" : (" (at T=" + std::to_string(Td) + ")").c_str(), d,
                 shared > 1 ? (", indexer + " + std::to_string(shared) + " x attention " +
                               std::to_string(t_shared.back()) + " s").c_str() : "");
  }
  const double idx_s = Median(t_idx), att_s = Median(t_att), dsa_s = Median(t_dsa);
  const double dense_meas = Median(t_dense);
  const double dense_s = dense_at_T ? dense_meas : dense_meas * (double(T) / Td) * (double(T) / Td);

  // ---- decode: one query against T keys, alternating per call ----------------
  // Twice: with the process's OpenMP threads, and on one thread. On a busy
  // 2-core machine every parallel region of a sub-millisecond op can wait a
  // scheduler slice for its second thread; the one-thread figures show the
  // kernels' own cost (the PyTorch peer runs its small ops on one thread).
  Problem dc(sh, 1, T, 44);
  struct Decode {
    double idx, att, dsa, dense;
  };
  auto run_decode = [&](int nthreads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(nthreads);
    std::vector<double> d_idx, d_att, d_dsa, d_dense;
    for (int r = 0; r < decode_reps + 2; ++r) {
      const double a = Time([&] { dsa::IndexerTopK(dc.Indexer()); });
      const double b = Time([&] { dsa::SparseAttention(dc.Sparse()); });
      const double d = Time([&] { ops::Attention(dc.Dense()); });
      if (r < 2) continue;  // warm-up calls
      d_idx.push_back(a), d_att.push_back(b), d_dsa.push_back(a + b), d_dense.push_back(d);
    }
    omp_set_num_threads(saved);
    return Decode{Median(d_idx), Median(d_att), Median(d_dsa), Median(d_dense)};
  };
  const Decode dec = run_decode(threads);
  const Decode dec1 = threads > 1 ? run_decode(1) : dec;
  const double didx = dec.idx, datt = dec.att, ddsa = dec.dsa, ddense = dec.dense;

  // ---- rooflines ---------------------------------------------------------------
  double peak = 0, bw = 0;
  if (I("--roofline")) {
    peak = MeasureSgemmPeakGflops(2048);
    bw = MeasureReadBandwidthGBs();
  }
  const double f_idx = pf.IndexerFlops(), f_att = pf.SparseFlops(), f_dense = dense_pb.DenseFlops();
  // Decode bytes: dense reads every k, v row; DSA reads ki and the K selected k, v rows.
  const double kv_row = 2.0 * sh.Hkv * sh.D * 4;
  const double dense_bytes = double(sh.B) * T * kv_row;
  const double dsa_bytes = double(sh.B) * (double(T) * sh.Di * 4 + double(std::min(sh.K, T)) * kv_row);

  std::fprintf(stderr,
               "myriad T=%d: prefill indexer (%s) %.3f s [%s: %.3f s] + attention %.3f s = DSA %.3f s; dense %.3f s%s -> "
               "%.2fx; decode DSA %.3f ms (indexer %.3f), dense %.3f ms -> %.2fx; on one thread: DSA %.3f ms, "
               "dense %.3f ms\n",
               T, o["--index-precision"].c_str(), idx_s, other_name, Median(t_other), att_s, dsa_s, dense_s, dense_at_T ? "" : " (EXTRAPOLATED)", dense_s / dsa_s,
               1e3 * ddsa, 1e3 * didx, 1e3 * ddense, ddense / ddsa, 1e3 * dec1.dsa, 1e3 * dec1.dense);

  const dsa::SparseAttentionSchedule sched = dsa::ResolveSparseAttentionSchedule(pf.Sparse());
  const dsa::SparseAttentionSchedule dflt = dsa::DefaultSparseAttentionSchedule(pf.Sparse());
  const bool from_table = !tuned.value().empty() &&
                          (sched.q_block != dflt.q_block || sched.key_chunk != dflt.key_chunk ||
                           sched.dense_tile != dflt.dense_tile);
  nlohmann::json cfg = {{"T", T}, {"B", sh.B}, {"H", sh.H}, {"Hkv", sh.Hkv}, {"D", sh.D},
                        {"Hi", sh.Hi}, {"Di", sh.Di}, {"K", sh.K}, {"reps", reps},
                        {"decode_reps", decode_reps}, {"threads", threads},
                        {"backend", ops::Active()->name()}, {"precision", "fp32"},
                        {"index_precision", o["--index-precision"]},
                        {"schedule", {{"q_block", sched.q_block}, {"key_chunk", sched.key_chunk}, {"dense_tile", sched.dense_tile},
                                      {"from", from_table ? tuned.value() : std::string("default")}}}};
  nlohmann::json prefill = {
      {"indexer_s", idx_s}, {"attention_s", att_s}, {"dsa_s", dsa_s},
      {"indexer_share", idx_s / dsa_s},
      {"indexer_other", {{"precision", other_name}, {"indexer_s", Median(t_other)},
                         {"dsa_s", Median(t_other) + att_s}, {"reps", t_other}}},
      {"indexer_s_reps", t_idx}, {"attention_s_reps", t_att}, {"dsa_s_reps", t_dsa},
      {"dense_measured", dense_at_T}, {"dense_s_reps", t_dense},
      {"dense_vs_dsa", dense_s / dsa_s},
      {"indexer_gflops", f_idx / idx_s / 1e9}, {"attention_gflops", f_att / att_s / 1e9},
      {"dense_gflops", f_dense / dense_meas / 1e9}};
  if (dense_at_T) {
    prefill["dense_s"] = dense_s;
  } else {
    prefill["dense_extrapolated_s"] = dense_s;
    prefill["dense_measured_at_T"] = Td;
    prefill["dense_measured_s"] = dense_meas;
  }
  if (shared > 1) {
    const double sh_s = Median(t_shared);
    prefill["shared"] = {{"layers", shared},
                         {"indexer_once_s", sh_s},
                         {"indexer_every_layer_s", shared * dsa_s},
                         {"speedup", shared * dsa_s / sh_s},
                         {"indexer_time_removed", 1.0 - 1.0 / shared},
                         {"reps", t_shared}};
  }
  if (peak > 0) {
    prefill["sgemm_peak_gflops"] = peak;
    prefill["dense_roofline_fraction"] = f_dense / dense_meas / 1e9 / peak;
    prefill["dsa_roofline_fraction"] = (f_idx + f_att) / dsa_s / 1e9 / peak;
  }
  nlohmann::json decode = {{"indexer_s", didx}, {"attention_s", datt}, {"dsa_s", ddsa},
                           {"dense_s", ddense}, {"dense_vs_dsa", ddense / ddsa}, {"threads", threads}};
  decode["one_thread"] = {{"indexer_s", dec1.idx}, {"attention_s", dec1.att}, {"dsa_s", dec1.dsa},
                          {"dense_s", dec1.dense}, {"dense_vs_dsa", dec1.dense / dec1.dsa}};
  if (bw > 0) {
    decode["read_bw_gbs"] = bw;
    decode["dense_roofline_fraction"] = dense_bytes / ddense / 1e9 / bw;
    decode["dsa_roofline_fraction"] = dsa_bytes / ddsa / 1e9 / bw;
  }
  nlohmann::json out = {{"bench", "sparse_attention_myriad"}, {"config", cfg}, {"prefill", prefill},
                        {"decode", decode}, {"myriad", dsa_s}, {"peer", dense_s},
                        {"peer_name", "Myriad dense flash attention (ops::Attention, causal), prefill"},
                        {"unit", "s (prefill; ratio = dense / DSA)"},
                        {"ratio", dense_s / dsa_s},
                        {"roofline_fraction", peak > 0 ? (f_idx + f_att) / dsa_s / 1e9 / peak : 0.0}};
  const std::string line = out.dump();
  if (!o["--json-out"].empty()) {
    if (FILE* f = std::fopen(o["--json-out"].c_str(), "w")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
  }
  std::printf("%s\n", line.c_str());
  return 0;
}
