// Stand-in for cuda_bf16.h in the emulated build of ops/cuda (see ../simt.h): bfloat16 as the upper 16
// bits of an fp32, converted to nearest even. Only what the kernels use.
#pragma once
#include "ops/cuda/emulation/simt.h"

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffff) > 0x7f800000) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN stays NaN
  return {static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(static_cast<uint32_t>(h.bits) << 16); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
