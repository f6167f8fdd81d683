// Diagonal sub-blocks of the vector-gated intra-chunk scores (see common.h). On CUDA with fused
// kernels on, a custom autograd function around the two kernels of ops/cuda/diagonal_scores.cu, which
// keep the pairwise decay factors in registers; elsewhere pairwise libtorch ops, [.., c, c, K].
#include <cmath>
#include <limits>

#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

namespace {

std::vector<torch::Tensor> diagonal_scores_libtorch(const std::vector<torch::Tensor>& Xs, const torch::Tensor& Y,
                                                    const torch::Tensor& G, bool strict) {
  const int64_t c = Y.size(-2);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  // EY[.., r, j, d] = exp(G_r - G_j) Y[j, d] for j <= r (j < r when strict), masked before the exp.
  auto mask = causal_mask(c, strict, Y.device()).view({c, c, 1});
  auto EY = (G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~mask, kNegInf).exp() * Y.unsqueeze(-3);  // [..,c,c,K]
  std::vector<torch::Tensor> out;
  for (const auto& X : Xs) out.push_back((EY * X.unsqueeze(-2)).sum(-1));  // [.., c, c]
  return out;
}

}  // namespace

std::vector<torch::Tensor> diagonal_block_scores(const std::vector<torch::Tensor>& Xs, const torch::Tensor& Y,
                                                 const torch::Tensor& G, bool strict) {
  if (auto fused = fused_diagonal_block_scores(Xs, Y, G, strict)) return *fused;
  return diagonal_scores_libtorch(Xs, Y, G, strict);
}

}  // namespace linearize::ops::detail
