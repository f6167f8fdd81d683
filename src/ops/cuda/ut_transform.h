// Host entry points of ops/cuda/ut_transform.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The delta rule's UT transform per chunk of 64 (ops/cuda/ut_transform.cu), no decay or a scalar decay:
// W = (I + L)^{-1} diag(beta e^G) k and U = (I + L)^{-1} diag(beta) v with L the strictly lower
// diag(beta) k k^T ⊙ exp(G_i - G_j). k, v [B,T,H,64] contiguous, one 16-bit dtype; beta [B,H,T] fp32; g
// [B,H,T] fp32 per-step log decay or undefined. Returns w, u [B,H,N*64,64] (k's dtype, zero past T: the
// layout delta_walk_forward reads) and every chunk's (I + L)^{-1} [B,H,N,64,64] fp32 for the backward (lower
// triangular: what lies above the diagonal is left unwritten, and the backward does not read it).
struct UtForward {
  torch::Tensor w, u, inverse;
};
UtForward ut_transform_forward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                               const torch::Tensor& g);
// Its backward given dw, du [B,H,N*64,64] (k's dtype): dk, dv (k's dtype), dbeta and, with g, dg [B,H,T] fp32.
struct UtGrads {
  torch::Tensor dk, dv, dbeta, dg, d_scores;  // d_scores: given the scores only
};
UtGrads ut_transform_backward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                              const torch::Tensor& g, const torch::Tensor& inverse, const torch::Tensor& dw,
                              const torch::Tensor& du);

// The same transform given the decayed scores (a decay per key channel: Kimi Delta Attention), from
// vector_scores_forward with key_scores: scores = its Akk, scores[i,j] = Σ_d k_id k_jd exp(G_id - G_jd)
// (only the part below the diagonal is read), and k = its ek = e^G ⊙ k by 64-channel part [B,H,N*64,64],
// both in v's dtype; v [B,T,H,64]; beta [B,H,T] fp32. W = (I + L)^{-1} diag(beta) k, U = (I + L)^{-1}
// diag(beta) v with L = diag(beta) scores, strictly lower. The H heads may be the parts of H / p wider key
// heads, whose scores [B,H/p,N,64,64] they share (p = 1: scores [B,H,N,64,64]); part j of key head h is
// head h p + j. W is stored from the first w_parts parts of each key head, side by side in the walk's rows
// [B,H/p,N*64,64 w_parts], and U from the first u_parts, [B,H/p*u_parts,N*64,64] (head h u_parts + j); the
// other parts' go unused. Returns w, u and the inverses as above ([B,H,N,64,64]).
UtForward ut_transform_given_forward(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& beta, int64_t w_parts = 1, int64_t u_parts = 1);
// Its backward from dW, dU in W's and U's shapes: d_scores in the scores' shape (the parts' added up; zeros
// on and above the diagonal), dk [B,H,N*64,64], dv, dbeta.
UtGrads ut_transform_given_backward(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                                    const torch::Tensor& beta, const torch::Tensor& inverse, const torch::Tensor& dw,
                                    const torch::Tensor& du, int64_t w_parts = 1, int64_t u_parts = 1);

}  // namespace linearize::ops::cuda_kernels
