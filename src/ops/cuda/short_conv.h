// Host entry points of ops/cuda/short_conv.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The mixers' short convolutions (ops/cuda/short_conv.cu): over x̃ = [prefix; x] along time,
//   y[b, t, c] = act(bias[c] + Σ_{i < W} w[c, i] x̃[b, t + i, c]),   act = silu or none
// with w and bias rounded to x's dtype, the sum in fp32 and its result rounded before the silu, as the
// libtorch formula (cat, depthwise conv1d, silu). x [B, T, C] (fp32, bf16 or fp16) with each row's channels
// contiguous (its rows may be slices of wider ones, as a packed product's outputs are), w [C, W] fp32 or x's
// dtype, bias [C] (w's dtype) or undefined, prefix [B, C, W-1] (x's dtype) or undefined (zeros), these
// contiguous, kMinShortConvWidth <= W <= kMaxShortConvWidth. Returns y [B, T, C] and, with want_cache,
// x̃'s last W-1 steps [B, C, W-1]: the state the next call takes as its prefix; with cache_into_prefix (one
// step, T = 1, and a prefix given) written over the prefix, which is returned as the cache.
constexpr int64_t kMinShortConvWidth = 2, kMaxShortConvWidth = 4;
bool short_conv_supported(torch::ScalarType x_dtype, torch::ScalarType w_dtype, int64_t width);
struct ShortConvForward {
  torch::Tensor y, cache;
};
ShortConvForward short_conv_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                    const torch::Tensor& prefix, bool silu, bool want_cache,
                                    bool cache_into_prefix = false);
// Its backward given dy (x's shape and dtype, contiguous; x strided as the forward took it): dx, dw [C, W] and dbias (when bias is defined) in
// their inputs' dtypes, dw and dbias summed in fp32 the same way on every run. No gradient of the prefix.
struct ShortConvGrads {
  torch::Tensor dx, dw, dbias;
};
ShortConvGrads short_conv_backward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                   const torch::Tensor& prefix, const torch::Tensor& dy, bool silu);

}  // namespace linearize::ops::cuda_kernels
