// Building blocks shared by every CPU kernel translation unit (generic,
// isa_avx2, isa_avx512). Everything here lives in an anonymous namespace on
// purpose: each ISA TU is compiled with different -m flags, and inline
// functions with external linkage would be merged by the linker (COMDAT), so
// an AVX-512 copy could end up called on a CPU without AVX-512. Internal
// linkage gives every TU its own copy. For the same reason kernel code avoids
// std:: templates that may be emitted out of line (std::vector, std::sort).
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/half.h"

namespace myriad::cpu {

// Below these sizes an OpenMP fork/join costs more than the work it splits
// (batch-1 decode of small models runs dozens of such ops per token): the
// kernels then run on the calling thread.
constexpr int64_t kMinParallelElems = int64_t{1} << 15;      // elementwise ops
constexpr int64_t kMinParallelGemvElems = int64_t{1} << 16;  // weights read by a GEMV
namespace {

// An owned, 64-byte aligned, uninitialised scratch array.
template <typename T>
struct Scratch {
  T* p = nullptr;
  explicit Scratch(int64_t n) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(T) + 63) & ~(size_t)63;
    p = static_cast<T*>(std::aligned_alloc(64, bytes));
  }
  ~Scratch() { std::free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T& operator[](int64_t i) { return p[i]; }
};

// Grow-only scratch of the calling thread, by slot (0..15): for per-call
// buffers of megabytes (packed attention operands). Fresh allocations of
// that size come from mmap and page-fault on every call, which costs more
// than the kernel; these stay mapped until the thread exits. A slot's
// contents are undefined on return and valid until the next call with the
// same slot on the same thread.
inline float* ThreadWorkspace(int slot, int64_t n_floats) {
  struct Slots {
    void* p[16] = {};
    size_t cap[16] = {};
    ~Slots() {
      for (void* q : p) std::free(q);
    }
  };
  static thread_local Slots slots;
  size_t bytes = ((size_t)(n_floats > 0 ? n_floats : 1) * sizeof(float) + 63) & ~(size_t)63;
  if (slots.cap[slot] < bytes) {
    std::free(slots.p[slot]);
    slots.p[slot] = std::aligned_alloc(64, bytes);
    slots.cap[slot] = bytes;
  }
  return static_cast<float*>(slots.p[slot]);
}

inline int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t MaxI(int64_t a, int64_t b) { return a > b ? a : b; }
inline float MaxF(float a, float b) { return a > b ? a : b; }

inline float AsFloat(uint32_t u) { return __builtin_bit_cast(float, u); }
inline uint32_t AsU32(float f) { return __builtin_bit_cast(uint32_t, f); }

// exp(x) for float, branch-free so that `omp simd` loops vectorise it:
// x = n ln2 + f with |f| <= ln2/2 (Cody-Waite split of ln2), exp(f) by a
// degree-7 Taylor polynomial (truncation < 1e-8 relative), 2^n via the
// exponent bits. Relative error about 2 ulp; exp(x) = 0 for x < -87.3
// (including -inf), x > 88.7 clamps (no inf).
#pragma omp declare simd notinbranch
inline float ExpF(float x) {
  float xc = x > 88.7f ? 88.7f : x;
  xc = xc < -87.3f ? -87.3f : xc;
  float t = xc * 1.44269504088896341f;
  float r = t + 12582912.f;  // 1.5*2^23: rounds t to an integer in the low bits
  float n = r - 12582912.f;
  int32_t ni = (int32_t)(AsU32(r) - 0x4B400000u);
  float f = xc - n * 0.693145751953125f;
  f = f - n * 1.42860682030941723212e-6f;
  float p = 1.f / 5040.f;
  p = p * f + 1.f / 720.f;
  p = p * f + 1.f / 120.f;
  p = p * f + 1.f / 24.f;
  p = p * f + 1.f / 6.f;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  float scale = AsFloat((uint32_t)(ni + 127) << 23);
  float y = p * scale;
  return x < -87.3f ? 0.f : y;
}

// IEEE half bits -> float (core/half.h's, vectorizable).
#pragma omp declare simd notinbranch
inline float HalfToFloatF(uint16_t h) { return HalfToFloat(h); }

}  // namespace
}  // namespace myriad::cpu
