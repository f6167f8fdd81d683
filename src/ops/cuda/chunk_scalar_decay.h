// Host entry points of ops/cuda/chunk_scalar_decay.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>

#include <utility>

namespace linearize::ops::cuda_kernels {

// The GLA family with no decay or a scalar decay per step, chunked (C = 64) and fused: one block per (batch,
// head) walks the chunks with the state in shared memory, products on tensor cores (ops/cuda/
// chunk_scalar_decay.cu). q, k [B,T,H,K], v [B,T,H,V] contiguous, one 16-bit dtype; g [B,H,T] fp32 per-step
// log decay (undefined: none); h0 [B,H,K,V] fp32 contiguous or undefined. Returns o [B,T,H,V] (v's
// dtype) and the final state [B,H,K,V] fp32.
// Supported: K = V = 64 or 128, bf16 or fp16.
bool scalar_decay_chunk_supported(int64_t K, int64_t V, torch::ScalarType dt);
std::pair<torch::Tensor, torch::Tensor> scalar_decay_chunk_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                   const torch::Tensor& v, const torch::Tensor& g,
                                                                   const torch::Tensor& h0, double scale);
// Its backward given d_out [B,T,H,V] (q's dtype, contiguous) and d_final [B,H,K,V] fp32 contiguous or
// undefined: dq, dk, dv (q's dtype) and, when asked, dLoss/dh0 (fp32) and the row sums q_t·dq_t and
// k_t·dk_t [B,H,T] (fp32, taken before dq and dk are rounded), from which the decay's gradient follows:
// dg_t = Σ_{s >= t} (q_s·dq_s - k_s·dk_s) + <d_final, final state>.
struct ScalarDecayChunkGrads {
  torch::Tensor dq, dk, dv, d_initial, dot_q, dot_k;
};
ScalarDecayChunkGrads scalar_decay_chunk_backward(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v, const torch::Tensor& g,
                                                  const torch::Tensor& h0, const torch::Tensor& d_out,
                                                  const torch::Tensor& d_final, double scale, bool want_d_initial,
                                                  bool want_row_dots);

}  // namespace linearize::ops::cuda_kernels
