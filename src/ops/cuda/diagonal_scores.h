// Host entry points of ops/cuda/diagonal_scores.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// Diagonal sub-blocks of the vector-gated scores (common.h, detail::diagonal_block_scores), fp32:
//   out[m, r, j] = Σ_d X[m,r,d] Y[m,j,d] exp(G[m,r,d] - G[m,j,d])  for j <= r (j < r when strict), else 0
// X, Y, G contiguous [..., 16, K] of one shape (16 rows per sub-chunk); out [..., 16, 16].
torch::Tensor diagonal_scores_forward(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                                      bool strict);
struct DiagonalScoresGrads {
  torch::Tensor dX, dY, dG;
};
DiagonalScoresGrads diagonal_scores_backward(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                                             const torch::Tensor& d_out, bool strict);

}  // namespace linearize::ops::cuda_kernels
