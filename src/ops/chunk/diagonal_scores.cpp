// Diagonal sub-blocks of the vector-gated intra-chunk scores (see common.h). On CUDA with fused
// kernels on, a custom autograd function around the two kernels of ops/cuda/diagonal_scores.cu, which
// keep the pairwise decay factors in registers; elsewhere pairwise libtorch ops, [.., c, c, K].
#include <cmath>
#include <limits>

#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/diagonal_scores.h"
#endif

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

#ifdef LINEARIZE_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct DiagonalScoresFunction : public torch::autograd::Function<DiagonalScoresFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& X, const torch::Tensor& Y,
                               const torch::Tensor& G, bool strict) {
    ctx->save_for_backward({X, Y, G});
    ctx->saved_data["strict"] = strict;
    return cuda_kernels::diagonal_scores_forward(X, Y, G, strict);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto g = cuda_kernels::diagonal_scores_backward(saved[0], saved[1], saved[2], grads[0],
                                                    ctx->saved_data["strict"].toBool());
    return {g.dX, g.dY, g.dG, torch::Tensor()};
  }
};
#endif

}  // namespace

std::vector<torch::Tensor> diagonal_block_scores(const std::vector<torch::Tensor>& Xs, const torch::Tensor& Y,
                                                 const torch::Tensor& G, bool strict) {
#ifdef LINEARIZE_WITH_KERNELS
  if (fused_kernels_enabled() && on_kernel_device(Y) && G.scalar_type() == torch::kFloat && Y.size(-2) == 16) {
    auto Yc = Y.to(torch::kFloat).contiguous(), Gc = G.contiguous();
    std::vector<torch::Tensor> out;
    for (const auto& X : Xs) out.push_back(DiagonalScoresFunction::apply(X.to(torch::kFloat).contiguous(), Yc, Gc, strict));
    return out;
  }
#endif
  return diagonal_scores_libtorch(Xs, Y, G, strict);
}

}  // namespace linearize::ops::detail
