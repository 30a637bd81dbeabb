// Peak arithmetic rate of fp32 FMA vs bf16 dot products (vdpbf16ps) on one
// core: the measurement behind docs/precision.md. Prints one JSON line.
// Twelve independent accumulator chains hide latency; both loops do the same
// number of instructions.
#include <immintrin.h>

#include <chrono>
#include <cstdio>

#include "backend/cpu/cpu_info.h"

namespace {

__attribute__((target("avx512f"))) double Fp32Gflops(long iters) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_set1_ps(0.f);
  __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    __asm__ volatile("" : "+v"(a));
  }
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float s = 0;
  for (auto& x : acc) s += _mm512_reduce_add_ps(x);
  __asm__ volatile("" ::"x"(s));
  return iters * 12 * 32.0 / t / 1e9;  // 16 lanes x 2 flops
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) double Bf16Gflops(long iters) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_set1_ps(0.f);
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80);
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float s = 0;
  for (auto& x : acc) s += _mm512_reduce_add_ps(x);
  __asm__ volatile("" ::"x"(s));
  return iters * 12 * 64.0 / t / 1e9;  // 16 lanes x 2 pairs x 2 flops
}

}  // namespace

int main() {
  const auto& cpu = myriad::GetCpuInfo();
  if (!cpu.avx512f || !cpu.avx512_bf16) {
    std::printf("{\"bench\": \"precision_probe\", \"skipped\": \"no AVX-512 BF16 on this CPU\"}\n");
    return 0;
  }
  const long iters = 20'000'000;
  double f = 0, b = 0;
  for (int r = 0; r < 3; ++r) {  // alternate, keep the best of each
    f = std::max(f, Fp32Gflops(iters));
    b = std::max(b, Bf16Gflops(iters));
  }
  std::printf("{\"bench\": \"precision_probe\", \"cpu\": \"%s\", \"fp32_fma_gflops\": %.1f, "
              "\"bf16_dot_gflops\": %.1f, \"ratio\": %.2f}\n",
              cpu.model_name.c_str(), f, b, b / f);
  return 0;
}
