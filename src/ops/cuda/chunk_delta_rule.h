// Host entry points of ops/cuda/chunk_delta_rule.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The delta rule with no decay or a scalar decay per step: the walk over the chunks (C = 64) from the UT
// transform's W and U on, fused (ops/cuda/chunk_delta_rule.cu): V' = U - W S, o = (scale e^G q) S + A V',
// S' = e^Gl S + (e^{Gl-G} k)^T V'. q, k [B,T,H,64] contiguous; w, u [B,H,N*64,64] contiguous (the UT
// transform's rows, zero past T), all one 16-bit dtype; g [B,H,T] fp32 per-step log decay or undefined;
// h0 [B,H,64,64] fp32 or undefined. Returns o [B,T,H,64] (q's dtype), the final state fp32 and, for the
// backward, the state entering every chunk and every chunk's masked scores A [B,H,N,64,64] (the 16-byte words
// that reach the diagonal or below; the rest is left unwritten) and the corrected values V' [B,H,N*64,64]
// (all in q's dtype).
bool delta_walk_supported(int64_t K, int64_t V, torch::ScalarType dt);
struct DeltaWalkForward {
  torch::Tensor o, final_state, states, scores, values;
};
DeltaWalkForward delta_walk_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                    const torch::Tensor& u, const torch::Tensor& g, const torch::Tensor& h0,
                                    double scale);
// Its backward given what the forward returned (o and the final state aside), d_out [B,T,H,64] (q's
// dtype) and d_final fp32 or undefined: dq, dk, dw, du (q's dtype) and, when asked, dLoss/dh0 and the row
// sums q·dq, k·dk [B,H,T] and w·dw [B,H,N*64] (fp32, taken before the gradients are rounded), from which
// the decay's gradient follows (detail::walk_decay_gradient).
struct DeltaWalkGrads {
  torch::Tensor dq, dk, dw, du, d_initial, dot_q, dot_k, dot_w;
};
DeltaWalkGrads delta_walk_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                   const torch::Tensor& g, const DeltaWalkForward& forward, const torch::Tensor& d_out,
                                   const torch::Tensor& d_final, double scale, bool want_d_initial,
                                   bool want_row_dots);

}  // namespace linearize::ops::cuda_kernels
