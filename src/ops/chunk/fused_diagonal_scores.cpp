// The diagonal sub-blocks of the vector-gated scores through ops/cuda/diagonal_scores.cu (chunk.h,
// detail::fused_diagonal_block_scores): a custom autograd function around the kernel pair.
#include <optional>
#include <vector>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "ops/cuda/diagonal_scores.h"

namespace linearize::ops::detail {

namespace {

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

}  // namespace

std::optional<std::vector<torch::Tensor>> fused_diagonal_block_scores(const std::vector<torch::Tensor>& Xs,
                                                                      const torch::Tensor& Y, const torch::Tensor& G,
                                                                      bool strict) {
  if (!fused_kernels_enabled() || !on_kernel_device(Y) || G.scalar_type() != torch::kFloat || Y.size(-2) != 16)
    return std::nullopt;
  auto Yc = Y.to(torch::kFloat).contiguous(), Gc = G.contiguous();
  std::vector<torch::Tensor> out;
  for (const auto& X : Xs) out.push_back(DiagonalScoresFunction::apply(X.to(torch::kFloat).contiguous(), Yc, Gc, strict));
  return out;
}

}  // namespace linearize::ops::detail
