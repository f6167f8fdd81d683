// Host entry points of ops/cuda/vector_decay_scores.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The intra-chunk scores and the walk's row factors (ops/cuda/vector_decay_scores.cu), from q, k [B,T,H,K]
// with K = 64 m (one 16-bit dtype) and g the per-step log decay per key channel [B,T,H,K] fp32, with G its
// cumulative sum within each chunk: A [B,H,N,64,64] (q's dtype, zeros above the diagonal),
// A[i,j] = scale Σ_d q[i,d] k[j,d] exp(G[i,d] - G[j,d]) for j <= i (summed over the K channels in fp32, rounded
// once); qd = scale e^G ⊙ q and kd = e^{Gl - G} ⊙ k [B,H,N*64,K] (q's dtype); a = e^{Gl} [B,H,N,K] fp32, Gl
// the chunk's last row of G. With key_scores (Kimi Delta Attention) the same kernel also gives the keys' own
// scores Akk (A with k for q and scale 1) and ek = e^G ⊙ k by 64-channel part, [B,H m,N*64,64] (part j of
// head h is head h m + j), the UT transform's inputs; otherwise those two are left undefined.
struct VectorScoresForward {
  torch::Tensor A, qd, kd, a, Akk, ek;
};
VectorScoresForward vector_scores_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                          double scale, bool key_scores = false);
// Its backward given dA, dqd, dkd (q's dtype, contiguous; only dA's part on and below the diagonal is read)
// and da (fp32), and with the keys' scores dAkk and dek (both or neither), in the forward's shapes: dq, dk
// [B,T,H,K] (q's dtype) and dg [B,T,H,K] (fp32).
struct VectorScoresGrads {
  torch::Tensor dq, dk, dg;
};
VectorScoresGrads vector_scores_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                         const torch::Tensor& dA, const torch::Tensor& dqd, const torch::Tensor& dkd,
                                         const torch::Tensor& da, double scale, const torch::Tensor& dAkk = {},
                                         const torch::Tensor& dek = {});

}  // namespace linearize::ops::cuda_kernels
