// Host entry points of ops/cuda/row_norms.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


#include "ops/ops.h"

namespace linearize::ops::cuda_kernels {

// Norms over the last dim of x [rows, D] contiguous, one warp a row (ops/cuda/row_norms.cu), fp32 inside
// (x, and the gate, may also come as [G, H, D] with each group's H rows contiguous and the groups anywhere, as
// a packed product's heads lie; y, r and the gradients are [rows, D] and [rows] contiguous either way):
//   r = (mean_scale Σ_c x_c² + eps)^-1/2,  y = w ⊙ round(x r)  (w undefined: y = round(x r))
// round() to x's dtype; y in the promotion of x's and w's dtypes (fp32 if either is). mean_scale = 1/D gives
// the RMS norm (ops::rms_norm), 1 the L2 norm (ops::l2_norm). x fp32, bf16 or fp16; w [D] fp32 or x's dtype
// (or a 16-bit w with an fp32 x); D <= kMaxRowNormSize. Returns y and r [rows] fp32.
// With a gate of x's rows (x's dtype) and its activation act (ops.h's Gate), y becomes
// y ⊙ round(act(gate)) in y's dtype, with act in the gate's dtype: the mixers' `norm(o) * sigmoid(g)` and
// `norm(o) * silu(g)`.
constexpr int64_t kMaxRowNormSize = 8192;
bool row_norm_supported(torch::ScalarType x_dtype, torch::ScalarType w_dtype, int64_t D);
// With a residual [rows, D] (x's dtype, contiguous) the row normed is sum = round(x + residual), also
// returned: a residual connection's addition and the norm after it in one pass (forward only).
struct RowNormForward {
  torch::Tensor y, rstd, sum;
};
RowNormForward row_norm_forward(const torch::Tensor& x, const torch::Tensor& w, double mean_scale, double eps,
                                const torch::Tensor& gate = {}, Gate act = Gate::none,
                                const torch::Tensor& residual = {});
// Its backward given dy (y's dtype, contiguous): dx (x's dtype), with a gate dgate (the gate's dtype), and,
// when want_dw and w is defined, dw (w's dtype; summed over the rows in fp32, the same from run to run).
struct RowNormGrads {
  torch::Tensor dx, dw, dgate;
};
RowNormGrads row_norm_backward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& rstd,
                               const torch::Tensor& dy, double mean_scale, bool want_dw, const torch::Tensor& gate = {},
                               Gate act = Gate::none);

}  // namespace linearize::ops::cuda_kernels
