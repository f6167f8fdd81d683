// Stand-in for cuda_fp16.h in the emulated build of ops/cuda (see ../simt.h): IEEE half precision as
// 16 bits, converted from fp32 to nearest even. Only what the kernels use.
#pragma once
#include "ops/cuda/emulation/simt.h"

struct __half {
  uint16_t bits;
};
struct __half2 {
  __half x, y;
};

namespace linearize::simt {
inline uint16_t half_from_float(float f) {
  const uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000, mag = x & 0x7fffffff;
  if (mag >= 0x7f800000) return static_cast<uint16_t>(sign | (mag > 0x7f800000 ? 0x7e00 : 0x7c00));
  if (mag >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // 65520 and up round to infinity
  if (mag < 0x38800000)  // below 2^-14: a multiple of 2^-24, rounded to even by the default mode
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::fabs(f) * 16777216.0f)));
  uint32_t h = ((((mag >> 23) - 112) << 10) | ((mag & 0x7fffff) >> 13));
  const uint32_t rest = mag & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}
inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return __uint_as_float(sign | 0x7f800000 | (m << 13));
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}
}  // namespace linearize::simt

inline __half __float2half_rn(float f) { return {linearize::simt::half_from_float(f)}; }
inline float __half2float(__half h) { return linearize::simt::half_to_float(h.bits); }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
