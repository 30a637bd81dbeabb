// The microbenchmark as a disabled test, so it can be run from the test
// binary without a main of its own:
//   myriad_backend_test --gtest_also_run_disabled_tests --gtest_filter='KernelBench.*'
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <utility>
#include <vector>

#include "backend/backend.h"

#include "backend/cpu/blas.h"
#include "backend/cpu/kernel_bench.h"
#include "core/half.h"

namespace myriad {
namespace {

TEST(KernelBench, DISABLED_Report) {
  std::string report = RunKernelMicrobench();
  std::printf("%s", report.c_str());
  EXPECT_NE(report.find("\"bench\": \"attention_fwd_bwd\""), std::string::npos);
  EXPECT_NE(report.find("\"bench\": \"gemv_q8\""), std::string::npos);
}

TEST(KernelBench, ProbesReturnPositiveRates) {
  EXPECT_GT(MeasureSgemmPeakGflops(64), 0.0);
}

}  // namespace
}  // namespace myriad

namespace myriad {
namespace {

// Attention fwd+bwd per ISA backend (B=4, T=256, H=12, D=64 and D=32), for
// quick iteration on the kernels; prints milliseconds.
TEST(KernelBench, DISABLED_AttentionPerIsa) {
  for (int D : {64, 32}) {
    const int B = 4, T = 256, H = 12;
    const size_t n = (size_t)B * T * H * D;
    std::vector<float> q(n, 0.1f), k(n, 0.2f), v(n, 0.3f), o(n), dout(n, 0.01f), dq(n), dk(n), dv(n),
        lse((size_t)B * H * T);
    for (size_t i = 0; i < n; ++i) q[i] = (float)((i * 7919) % 1000) / 1000.f - 0.5f;
    AttentionParams p;
    p.B = B, p.Tq = T, p.Tk = T, p.H = H, p.Hkv = H, p.D = D, p.scale = 1.f / std::sqrt((float)D);
    p.q_batch_stride = p.kv_batch_stride = p.out_batch_stride = (int64_t)T * H * D;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = o.data(), p.lse = lse.data();
    AttentionBackwardParams bp;
    bp.fwd = p, bp.dout = dout.data(), bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
    for (const char* isa : {"scalar", "avx2", "avx512"}) {
      Backend* be = CpuBackend(isa);
      if (!be) continue;
      double best_f = 1e30, best_b = 1e30;
      // Process CPU time: stable on a shared machine when run with
      // OMP_NUM_THREADS=1 (then it is the single core's busy time).
      auto cpu_now = [] {
        timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return ts.tv_sec + 1e-9 * ts.tv_nsec;
      };
      for (int r = 0; r < 5; ++r) {
        double t0 = cpu_now();
        be->ops().attention_fwd(p);
        double t1 = cpu_now();
        be->ops().attention_bwd(bp);
        double t2 = cpu_now();
        best_f = std::min(best_f, t1 - t0);
        best_b = std::min(best_b, t2 - t1);
      }
      double mm = 2.0 * B * H * (double)T * T * D / 2;
      std::printf("cpu-time D=%d %-7s fwd %7.2f ms (%5.1f GFLOP/s)  bwd %7.2f ms (%5.1f GFLOP/s, 5 matmuls)\n", D, isa,
                  best_f * 1e3, 2 * mm / best_f * 1e-9, best_b * 1e3, 5 * mm / best_b * 1e-9);
      EXPECT_TRUE(std::isfinite(o[0]) && std::isfinite(dq[0]));
    }
  }
}

}  // namespace
}  // namespace myriad

namespace myriad {
namespace {

// GEMV per ISA backend on a 50257 x 768 matrix; prints GB/s of weights by
// process CPU time (run with OMP_NUM_THREADS=1 for a per-core figure).
TEST(KernelBench, DISABLED_GemvPerIsa) {
  const int64_t O = 50257, I = 768;
  std::vector<float> W(O * I), x(I), y(O);
  for (size_t i = 0; i < W.size(); ++i) W[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
  for (int64_t i = 0; i < I; ++i) x[i] = (float)(i % 17) / 17.f - 0.5f;
  std::vector<uint16_t> Wh(W.size(), 0x3c00);
  std::vector<int8_t> Wq(W.size());
  for (size_t i = 0; i < W.size(); ++i) Wq[i] = (int8_t)(W[i] * 127);
  std::vector<float> scale(O, 0.01f);
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    Backend* be = CpuBackend(isa);
    if (!be) continue;
    const BackendOps& o = be->ops();
    auto time = [&](auto fn) {
      fn();
      double best = 1e30;
      for (int r = 0; r < 5; ++r) {
        double t0 = cpu_now();
        fn();
        best = std::min(best, cpu_now() - t0);
      }
      return best;
    };
    double tf = time([&] { o.gemv_f32(W.data(), x.data(), 1, O, I, y.data()); });
    double th = time([&] { o.gemv_f16(Wh.data(), x.data(), 1, O, I, y.data()); });
    double tq = time([&] { o.gemv_q8(Wq.data(), scale.data(), x.data(), 1, O, I, y.data()); });
    std::printf("cpu-time gemv %-7s f32 %6.2f ms %5.1f GB/s | f16 %6.2f ms %5.1f GB/s | q8 %6.2f ms %5.1f GB/s\n",
                isa, tf * 1e3, 4e-9 * O * I / tf, th * 1e3, 2e-9 * O * I / th, tq * 1e3, 1e-9 * O * I / tq);
    EXPECT_TRUE(std::isfinite(y[0]));
  }
}

}  // namespace
}  // namespace myriad

namespace myriad {
namespace {
// Row/element-wise ops per ISA backend, process CPU time (OMP_NUM_THREADS=1).
TEST(KernelBench, DISABLED_ElementwisePerIsa) {
  const int64_t N = 512, C = 768, F = 2048, V = 50257, NX = 64, P = 1 << 22;
  std::vector<float> x(N * F), w(F, 1.f), out(N * F), rstd(N), gu(N * 2 * F), dgu(N * 2 * F);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 2654435761u) % 2001) / 500.f - 2.f;
  for (size_t i = 0; i < gu.size(); ++i) gu[i] = (float)((i * 2654435761u) % 2001) / 500.f - 2.f;
  std::vector<float> logits(NX * V), losses(NX), dlogits(NX * V);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = (float)((i * 40503u) % 1001) / 100.f - 5.f;
  std::vector<int32_t> tgt(NX, 7);
  std::vector<float> prm(P, 0.1f), grd(P, 0.01f), m(P, 0.f), vv(P, 0.f);
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  auto time = [&](auto fn) {
    fn();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      double t0 = cpu_now();
      fn();
      best = std::min(best, cpu_now() - t0);
    }
    return best * 1e3;
  };
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    Backend* be = CpuBackend(isa);
    if (!be) continue;
    const BackendOps& o = be->ops();
    double t_rf = time([&] { o.rmsnorm_fwd(x.data(), w.data(), 1e-5f, N, C, out.data(), rstd.data()); });
    double t_rb = time([&] { o.rmsnorm_bwd(x.data(), x.data(), w.data(), rstd.data(), N, C, out.data(), w.data()); });
    double t_sf = time([&] { o.swiglu_fwd(gu.data(), N, F, out.data()); });
    double t_sb = time([&] { o.swiglu_bwd(x.data(), gu.data(), N, F, dgu.data()); });
    double t_x = time([&] { o.softmax_xent(logits.data(), tgt.data(), NX, V, 1.f, losses.data(), dlogits.data()); });
    AdamWParams ap;
    ap.n = P, ap.lr = 1e-3f, ap.param = prm.data(), ap.grad = grd.data(), ap.m = m.data(), ap.v = vv.data();
    double t_a = time([&] { o.adamw(ap); });
    std::printf("cpu-time %-7s rmsnorm f/b %.3f/%.3f ms  swiglu f/b %.3f/%.3f ms  xent %.3f ms  adamw %.3f ms\n",
                isa, t_rf, t_rb, t_sf, t_sb, t_x, t_a);
    EXPECT_TRUE(std::isfinite(losses[0]));
  }
}

// Decode attention (Tq = 1 against a KV cache) per ISA backend.
TEST(KernelBench, DISABLED_DecodeAttentionPerIsa) {
  const int B = 1, Tk = 1024, H = 12, Hkv = 12, D = 64;
  std::vector<float> q((size_t)H * D, 0.1f), k((size_t)Tk * Hkv * D, 0.2f), v(k.size(), 0.3f), o(q.size()),
      lse(H);
  for (size_t i = 0; i < k.size(); ++i) k[i] = (float)((i * 7919) % 1000) / 1000.f - 0.5f;
  AttentionParams p;
  p.B = B, p.Tq = 1, p.Tk = Tk, p.H = H, p.Hkv = Hkv, p.D = D, p.scale = 0.125f;
  p.q_batch_stride = p.out_batch_stride = (int64_t)H * D, p.kv_batch_stride = (int64_t)Tk * Hkv * D;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = o.data(), p.lse = lse.data();
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    Backend* be = CpuBackend(isa);
    if (!be) continue;
    double best = 1e30;
    for (int r = 0; r < 20; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      be->ops().attention_fwd(p);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("decode attention %-7s Tk=%d H=%d D=%d: %.3f ms (%.1f GB/s of K+V)\n", isa, Tk, H, D,
                best * 1e3, 2.0 * k.size() * 4 / best * 1e-9);
    EXPECT_TRUE(std::isfinite(o[0]));
  }
}

TEST(KernelBench, DISABLED_ReadBandwidth) {
  double bw = MeasureReadBandwidthGBs();
  std::printf("read bandwidth %.1f GB/s\n", bw);
  EXPECT_GT(bw, 0);
}
}  // namespace
}  // namespace myriad

namespace myriad {
namespace {
// The gemv_* slots over `rows` rows of x against OpenBLAS's sgemm of the same
// fp32 product, per ISA backend, process CPU time (run with
// OMP_NUM_THREADS=1 for a per-core figure; the median of 7 runs): below kSkinnyRows the one-pass kernels, above it fp32
// is sgemm itself and fp16 / int8 the converted tiles (prefill). GPT-2's
// MLP shapes (3072 x 768 and 768 x 3072).
TEST(KernelBench, DISABLED_GemvRowsPerIsa) {
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  for (auto [O, I] : {std::pair<int64_t, int64_t>{3072, 768}, {768, 3072}}) {
    const int64_t Mmax = 256;
    std::vector<float> W(O * I), x(Mmax * I), y(Mmax * O), y2(Mmax * O), scale(O, 0.01f);
    for (size_t i = 0; i < W.size(); ++i) W[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)(i % 17) / 17.f - 0.5f;
    std::vector<uint16_t> Wh(W.size());
    for (size_t i = 0; i < W.size(); ++i) Wh[i] = FloatToHalf(W[i]);
    std::vector<int8_t> Wq(W.size());
    for (size_t i = 0; i < W.size(); ++i) Wq[i] = (int8_t)(W[i] * 127);
    for (const char* isa : {"avx2", "avx512"}) {
      Backend* be = CpuBackend(isa);
      if (!be) continue;
      const BackendOps& o = be->ops();
      for (int64_t M : {1, 2, 4, 8, 16, 24, 32, 33, 64, 128, 256}) {
        auto med = [&](auto fn) {
          std::vector<double> t;
          fn();
          for (int r = 0; r < 7; ++r) {
            double t0 = now();
            fn();
            t.push_back(now() - t0);
          }
          std::sort(t.begin(), t.end());
          return t[3];
        };
        double tb = med([&] { BlasSgemm(Trans::kNo, Trans::kYes, M, O, I, 1.f, x.data(), I, W.data(), I, 0.f, y2.data(), O); });
        double tf = med([&] { o.gemv_f32(W.data(), x.data(), M, O, I, y.data()); });
        double th = med([&] { o.gemv_f16(Wh.data(), x.data(), M, O, I, y.data()); });
        double tq = med([&] { o.gemv_q8(Wq.data(), scale.data(), x.data(), M, O, I, y.data()); });
        std::printf("%-6s %4lldx%-4lld M %3lld: sgemm %7.3f ms | f32 %7.3f ms (%.2fx) | f16 %7.3f ms (%.2fx) | q8 %7.3f ms (%.2fx)\n",
                    isa, (long long)O, (long long)I, (long long)M, tb * 1e3, tf * 1e3, tb / tf, th * 1e3, tb / th,
                    tq * 1e3, tb / tq);
        EXPECT_TRUE(std::isfinite(y[0]));
      }
    }
  }
}
}  // namespace
}  // namespace myriad
