// The delta rule's triangular solve through ops/cuda/unit_lower_inverse.cu (chunk.h,
// detail::fused_solve_unit_lower): the chunk's inverse from one kernel, applied as a batched product.
#include <optional>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "ops/cuda/unit_lower_inverse.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct UnitLowerInverseFunction : public torch::autograd::Function<UnitLowerInverseFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& L) {
    auto T = cuda_kernels::unit_lower_inverse(L);  // [..., C, C] fp32
    ctx->save_for_backward({T});
    return T;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto T = ctx->get_saved_variables()[0];
    const auto Tt = T.transpose(-1, -2);
    return {-Tt.matmul(grads[0].to(torch::kFloat)).matmul(Tt).tril(-1)};
  }
};

}  // namespace

std::optional<torch::Tensor> fused_solve_unit_lower(const torch::Tensor& L, const torch::Tensor& R) {
  if (fused_kernels_enabled() && on_kernel_device(L) && L.scalar_type() != torch::kDouble &&
      L.size(-1) <= cuda_kernels::kMaxInverseSize)
    return std::optional<torch::Tensor>(UnitLowerInverseFunction::apply(L.to(torch::kFloat)).matmul(R));
  return std::nullopt;
}

}  // namespace linearize::ops::detail
