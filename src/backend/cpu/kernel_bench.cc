#include "backend/cpu/kernel_bench.h"

#include "core/half.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/cpu_info.h"
#include "core/rng.h"

namespace myriad {
namespace {

double Seconds(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs a and b alternately (A B A B ...) after one warm-up each; returns the
// median seconds of each (BENCHMARKS.md rule 1).
std::pair<double, double> AlternateMedians(const std::function<void()>& a,
                                           const std::function<void()>& b, int reps) {
  a();
  b();
  std::vector<double> ta, tb;
  for (int r = 0; r < reps; ++r) {
    ta.push_back(Seconds(a));
    tb.push_back(Seconds(b));
  }
  return {Median(ta), Median(tb)};
}

std::vector<float> Randn(size_t n, uint64_t seed, float scale = 1.f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.Normal() * scale;
  return v;
}


void Appendf(std::string* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Appendf(std::string* s, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *s += buf;
}

}  // namespace

double MeasureSgemmPeakGflops(int n) {
  std::vector<float> A = Randn((size_t)n * n, 1), B = Randn((size_t)n * n, 2), C((size_t)n * n);
  auto run = [&] {
    BlasSgemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, C.data(), n);
  };
  run();
  double best = 1e30;
  for (int r = 0; r < 3; ++r) best = std::min(best, Seconds(run));
  return 2.0 * n * n * (double)n / best * 1e-9;
}

double MeasureReadBandwidthGBs() {
  const int64_t n = (256ll << 20) / sizeof(float);  // a multiple of 32
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[i] = (float)(i & 7);  // first touch on the reading thread
  volatile float sink = 0;
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    double t = Seconds([&] {
      float total = 0;
#pragma omp parallel reduction(+ : total)
      {
        // Each thread reads its quarter-slices as 4 interleaved streams (more
        // prefetch streams in flight, as a GEMV over several rows has), with
        // 32 independent partial sums so the adds never limit the load rate.
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t per = n / nt / 4 / 32 * 32;
        const float* base = buf + (int64_t)t * per * 4;
        float part[32] = {};
        for (int64_t i = 0; i < per; i += 8) {
#pragma omp simd
          for (int k = 0; k < 8; ++k)
            part[k] += base[i + k], part[8 + k] += base[per + i + k], part[16 + k] += base[2 * per + i + k],
                part[24 + k] += base[3 * per + i + k];
        }
        for (float v : part) total += v;
      }
      sink = total;
    });
    if (r > 0) best = std::min(best, t);
  }
  (void)sink;
  std::free(buf);
  const int64_t read = (n / omp_get_max_threads() / 4 / 32 * 32) * 4 * omp_get_max_threads();
  return read * sizeof(float) / best * 1e-9;
}

std::string RunKernelMicrobench() {
  std::string out;
  const CpuInfo& cpu = GetCpuInfo();
  const BlasInfo& blas = GetBlasInfo();
  Backend* be = CpuBackend("");
  const BackendOps& ops = be->ops();
  const int threads = omp_get_max_threads();
  Appendf(&out, "kernel microbench: %s, %d threads, backend %s, BLAS %s (%s)\n",
          cpu.model_name.c_str(), threads, be->name().c_str(), blas.library.c_str(),
          blas.corename.c_str());
  std::string json;

  // --- memory
  double bw = MeasureReadBandwidthGBs();
  Appendf(&out, "read bandwidth (256 MB, %d threads): %.1f GB/s\n", threads, bw);

  // --- SGEMM
  for (int n : {1024, 2048}) {
    double g = MeasureSgemmPeakGflops(n);
    Appendf(&out, "sgemm n=%d: %.1f GFLOP/s (best of 3)\n", n, g);
    Appendf(&json, "{\"bench\": \"sgemm\", \"config\": {\"n\": %d, \"threads\": %d}, \"myriad\": %.2f, "
            "\"unit\": \"GFLOP/s\"}\n", n, threads, g);
  }

  // --- attention fwd+bwd, B=4 T=256 H=12 D=64, causal, vs the scalar oracle
  {
    const int B = 4, T = 256, H = 12, D = 64;
    const size_t n = (size_t)B * T * H * D;
    std::vector<float> q = Randn(n, 3), k = Randn(n, 4), v = Randn(n, 5), o(n), dout = Randn(n, 6),
                       dq(n), dk(n), dv(n), lse((size_t)B * H * T);
    AttentionParams p;
    p.B = B, p.Tq = T, p.Tk = T, p.H = H, p.Hkv = H, p.D = D, p.scale = 1.f / std::sqrt((float)D);
    p.causal = true;
    p.q_batch_stride = p.kv_batch_stride = p.out_batch_stride = (int64_t)T * H * D;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = o.data(), p.lse = lse.data();
    AttentionBackwardParams bp;
    bp.fwd = p, bp.dout = dout.data(), bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
    auto fast = [&](const BackendOps& x) {
      return [&x, &p, &bp] {
        x.attention_fwd(p);
        x.attention_bwd(bp);
      };
    };
    auto [t_fast, t_ref] = AlternateMedians(fast(ops), fast(RefOps()), 3);
    double t_fwd = 1e30;
    for (int r = 0; r < 5; ++r) t_fwd = std::min(t_fwd, Seconds([&] { ops.attention_fwd(p); }));
    // Causal FLOPs: fwd 2 matmuls, bwd 5 matmuls (dV, dP, dQ, dK, S), each 2*B*H*T*T*D/2.
    double mm = 2.0 * B * H * (double)T * T * D / 2;
    double gflops = 7 * mm / t_fast * 1e-9;
    Appendf(&out, "attention fwd+bwd B=%d T=%d H=%d D=%d causal: %.2f ms (fwd %.2f ms), %.1f GFLOP/s "
            "(7 causal matmuls); ref %.1f ms; speedup %.1fx\n",
            B, T, H, D, t_fast * 1e3, t_fwd * 1e3, gflops, t_ref * 1e3, t_ref / t_fast);
    Appendf(&json, "{\"bench\": \"attention_fwd_bwd\", \"config\": {\"B\": %d, \"T\": %d, \"H\": %d, "
            "\"D\": %d, \"causal\": true, \"threads\": %d}, \"myriad\": %.3f, \"peer\": %.3f, \"unit\": \"ms\", "
            "\"ratio\": %.4f, \"peer_name\": \"cpu/ref scalar oracle\"}\n",
            B, T, H, D, threads, t_fast * 1e3, t_ref * 1e3, t_fast / t_ref);
  }

  // --- GEMV 50257 x 768
  {
    const int64_t O = 50257, I = 768;
    std::vector<float> W = Randn((size_t)O * I, 7, 0.05f), x = Randn(I, 8), y(O), y2(O);
    std::vector<uint16_t> Wh(W.size());
    for (size_t i = 0; i < W.size(); ++i) Wh[i] = FloatToHalf(W[i]);
    std::vector<int8_t> Wq(W.size());
    std::vector<float> scale(O);
    for (int64_t o = 0; o < O; ++o) {
      float amax = 1e-12f;
      for (int64_t i = 0; i < I; ++i) amax = std::max(amax, std::fabs(W[o * I + i]));
      scale[o] = amax / 127;
      for (int64_t i = 0; i < I; ++i) Wq[o * I + i] = (int8_t)std::nearbyint(W[o * I + i] / scale[o]);
    }
    auto blas_m1 = [&] {
      BlasSgemm(Trans::kNo, Trans::kYes, 1, O, I, 1.f, x.data(), I, W.data(), I, 0.f, y2.data(), O);
    };
    struct Case { const char* name; double bytes; std::function<void()> fn; };
    Case cases[] = {
        {"f32", 4.0 * O * I, [&] { ops.gemv_f32(W.data(), x.data(), 1, O, I, y.data()); }},
        {"f16", 2.0 * O * I, [&] { ops.gemv_f16(Wh.data(), x.data(), 1, O, I, y.data()); }},
        {"q8", 1.0 * O * I + 4.0 * O, [&] { ops.gemv_q8(Wq.data(), scale.data(), x.data(), 1, O, I, y.data()); }},
    };
    for (auto& c : cases) {
      auto [t, t_peer] = AlternateMedians(c.fn, blas_m1, 7);
      double gbs = c.bytes / t * 1e-9;
      double peer_gbs = 4.0 * O * I / t_peer * 1e-9;
      Appendf(&out, "gemv_%s %lldx%lld: %.3f ms, %.1f GB/s of weights (%.0f%% of read roofline); "
              "OpenBLAS M=1 sgemm %.3f ms (%.1f GB/s); speedup %.2fx\n",
              c.name, (long long)O, (long long)I, t * 1e3, gbs, 100 * gbs / bw, t_peer * 1e3, peer_gbs,
              t_peer / t);
      Appendf(&json, "{\"bench\": \"gemv_%s\", \"config\": {\"out\": %lld, \"in\": %lld, \"threads\": %d}, "
              "\"myriad\": %.3f, \"peer\": %.3f, \"unit\": \"ms\", \"ratio\": %.4f, \"roofline_fraction\": %.3f, "
              "\"peer_name\": \"OpenBLAS sgemm M=1 (fp32)\"}\n",
              c.name, (long long)O, (long long)I, threads, t * 1e3, t_peer * 1e3, t / t_peer, gbs / bw);
    }
  }
  Appendf(&json, "{\"bench\": \"read_bandwidth\", \"config\": {\"bytes\": 268435456, \"threads\": %d}, "
          "\"myriad\": %.2f, \"unit\": \"GB/s\"}\n", threads, bw);
  return out + json;
}

}  // namespace myriad
