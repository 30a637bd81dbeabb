// IEEE binary16 and bfloat16 conversions: from fp32 with round to nearest
// even, and back exactly; subnormals, infinities and NaN handled (weights converted for
// decode, the KV host tier's fp16 format, test and benchmark data).
#pragma once

#include <cstdint>
#include <cstring>

namespace myriad {

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

// binary16 bits -> fp32, exact and branch-free (normals, subnormals,
// infinities, NaN); vectorizable in loops (the backend's GEMV uses it too).
#pragma omp declare simd notinbranch
inline float HalfToFloat(uint16_t h) {
  const uint32_t mag = static_cast<uint32_t>(h & 0x7fff) << 13;
  float f;
  std::memcpy(&f, &mag, 4);
  f *= 0x1p112f;  // rebias 15 -> 127; exact for subnormals too
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits = (h & 0x7c00) == 0x7c00 ? (mag | 0x7f800000u) : bits;
  bits |= static_cast<uint32_t>(h & 0x8000) << 16;
  std::memcpy(&f, &bits, 4);
  return f;
}

// bfloat16: the top half of an fp32, rounded to nearest even (NaN stays a
// quiet NaN); back exactly (gradient compression, Hugging Face weights).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (overflow rounds to inf)
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace myriad
