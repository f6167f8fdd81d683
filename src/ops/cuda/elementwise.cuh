// Helpers of the element-wise kernels (row_norms.cu, swiglu.cu, short_conv.cu, softplus_decay.cu,
// distill_loss.cu), which take fp32, bf16 and fp16 tensors as c10's types and compute in fp32.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace linearize::ops::cuda_kernels {

__device__ __forceinline__ float sigmoid_of(float v) { return 1.f / (1.f + expf(-v)); }

// silu's slope at v, given s = sigmoid(v): d(v s)/dv = s (1 + v (1 - s)).
__device__ __forceinline__ float silu_slope(float v, float s) { return s * (1.f + v * (1.f - s)); }

// Whether the element-wise kernels take dtype dt: fp32, bf16 or fp16.
inline bool float_type(torch::ScalarType dt) {
  return dt == torch::kFloat || dt == torch::kBFloat16 || dt == torch::kHalf;
}

// Calls fn with a value of the kernels' element type for dt: float, c10::BFloat16 or c10::Half (the caller
// checked float_type(dt)).
template <typename Fn>
void dispatch_float_types(torch::ScalarType dt, Fn fn) {
  if (dt == torch::kFloat) fn(float{});
  else if (dt == torch::kBFloat16) fn(c10::BFloat16{});
  else fn(c10::Half{});
}

// Calls fn(E{}, P{}) for a tensor's dtype dt (E, as dispatch_float_types) and its parameters' dtype, which
// is fp32 (P = float) or dt's own (P = E).
template <typename Fn>
void dispatch_with_params(torch::ScalarType dt, torch::ScalarType params, Fn fn) {
  dispatch_float_types(dt, [&](auto e) {
    if (params == torch::kFloat) fn(e, float{});
    else fn(e, e);
  });
}

// V elements of E that load and store as one 16-byte word (V = 1: one element).
template <typename E, int V>
struct alignas(V == 1 ? alignof(E) : 16) Word {
  E x[V];
};

// Calls fn(E{}, std::integral_constant<int, V>{}) for dt (E as dispatch_float_types), with V the elements of a
// 16-byte word when `wide` (see wide_words), else 1.
template <typename Fn>
void dispatch_words(torch::ScalarType dt, bool wide, Fn fn) {
  dispatch_float_types(dt, [&](auto e) {
    using E = decltype(e);
    constexpr int kWide = 16 / static_cast<int>(sizeof(E));
    if (wide) fn(e, std::integral_constant<int, kWide>{});
    else fn(e, std::integral_constant<int, 1>{});
  });
}

// Whether runs of n elements of dt (a tensor, or each row of one) at these tensors' pointers go 16 bytes at a
// time: n a whole number of words and every defined tensor 16-byte aligned.
inline bool wide_words(int64_t n, torch::ScalarType dt, std::initializer_list<const torch::Tensor*> ts) {
  const int64_t per_word = 16 / static_cast<int64_t>(c10::elementSize(dt));
  if (n % per_word != 0) return false;
  for (const torch::Tensor* t : ts)
    if (t->defined() && reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  return true;
}

}  // namespace linearize::ops::cuda_kernels
