// The fenced backend: ops work through it with the same bits as the backend
// it wraps, its allocator reuses and coalesces blocks, and a planted host
// access to device memory dies of SIGSEGV with the fenced message.
#include "backend/fenced/fenced_backend.h"
#include "core/transport_access.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"

namespace myriad {
namespace {

Backend* Fenced() { return FencedBackend(CpuBackend("")); }

template <typename T>
T* Upload(const BackendOps& o, const std::vector<T>& host) {
  T* d = static_cast<T*>(o.mem_alloc(host.size() * sizeof(T)));
  o.mem_copy(d, host.data(), host.size() * sizeof(T), CopyKind::kHostToDevice);
  return d;
}
template <typename T>
std::vector<T> Download(const BackendOps& o, const T* d, size_t n) {
  std::vector<T> h(n);
  o.mem_copy(h.data(), d, n * sizeof(T), CopyKind::kDeviceToHost);
  return h;
}

TEST(Fenced, WrapsEverySlotOfTheInnerBackend) {
  Backend* f = Fenced();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->name(), "fenced-" + CpuBackend("")->name());
  for (int i = 0; i < kNumBackendSlots; ++i) {
    const BackendSlot& s = BackendSlots()[i];
    EXPECT_EQ(f->supports(s.name), CpuBackend("")->supports(s.name)) << s.name;
  }
  EXPECT_EQ(FencedBackend(CpuBackend("scalar")) == nullptr, CpuBackend("scalar") != CpuBackend(""));
}

// A norm, a GEMM and the router on fenced buffers give the inner backend's
// bits on host buffers.
TEST(Fenced, OpsGiveTheInnerBackendsBits) {
  const BackendOps& f = Fenced()->ops();
  const BackendOps& in = CpuBackend("")->ops();
  Rng rng(5);
  const int64_t N = 37, C = 64, E = 16, K = 4;
  std::vector<float> x(N * C), w(C), router(E * C);
  for (auto& v : x) v = rng.Normal();
  for (auto& v : w) v = 1 + 0.1f * rng.Normal();
  for (auto& v : router) v = 0.2f * rng.Normal();

  auto run = [&](const BackendOps& o, bool device) {
    auto put = [&](const std::vector<float>& h) { return device ? Upload(o, h) : const_cast<float*>(h.data()); };
    std::vector<float> hy(N * C), hr(N), hl(N * E), hs(N * E), hw(N * K);
    std::vector<int32_t> hsel(N * K), hpos(N * K), hperm(N * K);
    std::vector<int64_t> hoff(E + 1);
    float* dx = put(x); float* dw = put(w); float* drouter = put(router);
    float* y = device ? static_cast<float*>(o.mem_alloc(hy.size() * 4)) : hy.data();
    float* r = device ? static_cast<float*>(o.mem_alloc(hr.size() * 4)) : hr.data();
    float* l = device ? static_cast<float*>(o.mem_alloc(hl.size() * 4)) : hl.data();
    o.rmsnorm_fwd(dx, dw, 1e-5f, N, C, y, r);
    o.gemm(Trans::kNo, Trans::kYes, N, E, C, 1.f, y, C, drouter, C, 0.f, l, E);
    MoeRouteParams p;
    p.N = N, p.E = E, p.K = K, p.logits = l;
    p.scores = device ? static_cast<float*>(o.mem_alloc(hs.size() * 4)) : hs.data();
    p.weights = device ? static_cast<float*>(o.mem_alloc(hw.size() * 4)) : hw.data();
    p.sel = device ? static_cast<int32_t*>(o.mem_alloc(hsel.size() * 4)) : hsel.data();
    p.pos = device ? static_cast<int32_t*>(o.mem_alloc(hpos.size() * 4)) : hpos.data();
    p.perm = device ? static_cast<int32_t*>(o.mem_alloc(hperm.size() * 4)) : hperm.data();
    p.expert_offset = device ? static_cast<int64_t*>(o.mem_alloc(hoff.size() * 8)) : hoff.data();
    o.moe_route(p);
    o.synchronize();
    if (device) {
      hy = Download(o, y, hy.size());
      hw = Download(o, p.weights, hw.size());
      hperm = Download(o, p.perm, hperm.size());
      hoff = Download(o, p.expert_offset, hoff.size());
      for (void* q : {(void*)dx, (void*)dw, (void*)drouter, (void*)y, (void*)r, (void*)l, (void*)p.scores,
                      (void*)p.weights, (void*)p.sel, (void*)p.pos, (void*)p.perm, (void*)p.expert_offset})
        o.mem_free(q);
    }
    return std::make_tuple(hy, hw, hperm, hoff);
  };
  auto [y1, w1, perm1, off1] = run(f, true);
  auto [y2, w2, perm2, off2] = run(in, false);
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), w1.size() * 4));
  EXPECT_EQ(perm1, perm2);
  EXPECT_EQ(off1, off2);
}

TEST(Fenced, AllocatorReusesAndCoalesces) {
  const BackendOps& f = Fenced()->ops();
  const size_t before = FencedBytesInUse();
  void* a = f.mem_alloc(10000);
  void* b = f.mem_alloc(10000);
  void* c = f.mem_alloc(100);
  EXPECT_TRUE(IsFencedPointer(a) && IsFencedPointer(b) && IsFencedPointer(c));
  EXPECT_EQ((uintptr_t)a % 4096, 0u);
  EXPECT_GE(FencedBytesInUse(), before + 20100);
  f.mem_free(a);
  f.mem_free(b);  // a and b coalesce: one 20000-byte block fits where they were
  void* d = f.mem_alloc(20000);
  EXPECT_EQ(d, a);
  f.mem_free(c);
  f.mem_free(d);
  EXPECT_EQ(FencedBytesInUse(), before);
  int host = 0;
  EXPECT_FALSE(IsFencedPointer(&host));
}

// The point of the fence: host code that touches device memory outside a
// backend call dies, and says where.
TEST(FencedDeathTest, PlantedHostAccessIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const BackendOps& f = Fenced()->ops();
  float* d = static_cast<float*>(f.mem_alloc(64 * sizeof(float)));
  f.mem_set(d, 0, 64 * sizeof(float));  // inside a backend call: fine
  EXPECT_EXIT({ volatile float* p = d; p[3] = 1.f; }, ::testing::KilledBySignal(SIGSEGV),
              "host access to device memory");
  EXPECT_EXIT({ volatile float* p = d; std::fprintf(stderr, "%f", (double)p[0]); },
              ::testing::KilledBySignal(SIGSEGV), "host access to device memory");
  f.mem_free(d);
}

// Transports (comm) read device memory directly: inside a
// ScopedTransportAccess the arena is open, and closed again after it.
TEST(FencedDeathTest, TransportScopeOpensTheArenaOnlyForItsSpan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const BackendOps& f = Fenced()->ops();
  float* d = static_cast<float*>(f.mem_alloc(64 * sizeof(float)));
  {
    ScopedTransportAccess access;
    volatile float* p = d;
    p[5] = 2.f;  // as an MPI call writing a receive buffer would
    EXPECT_EQ(p[5], 2.f);
  }
  EXPECT_EXIT({ volatile float* p = d; p[5] = 1.f; }, ::testing::KilledBySignal(SIGSEGV),
              "host access to device memory");
  f.mem_free(d);
}

}  // namespace
}  // namespace myriad
