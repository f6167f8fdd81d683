// The delta rule's triangular solve (see common.h). On CUDA with fused kernels on, the chunk's
// inverse (I + L)^{-1} comes from one kernel (ops/cuda/unit_lower_inverse.cu) and is applied as a
// batched product, which runs on tensor cores under autocast; its backward is
//   dL = -tril_{-1}(T^T dT T^T),  T = (I + L)^{-1}.
// Elsewhere linalg_solve_triangular (unit lower), differentiated by autograd.
#include "compat/torch_compat.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/unit_lower_inverse.h"
#endif

namespace linearize::ops::detail {

namespace {

#ifdef LINEARIZE_WITH_KERNELS
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
#endif

}  // namespace

torch::Tensor solve_unit_lower(const torch::Tensor& L, const torch::Tensor& R) {
#ifdef LINEARIZE_WITH_KERNELS
  if (fused_kernels_enabled() && on_kernel_device(L) && L.scalar_type() != torch::kDouble &&
      L.size(-1) <= cuda_kernels::kMaxInverseSize)
    return UnitLowerInverseFunction::apply(L.to(torch::kFloat)).matmul(R);
#endif
  const auto dt = compute_dtype(L);  // bf16 L: solve in fp32
  auto eye = torch::eye(L.size(-1), L.options().dtype(dt));
  return torch::linalg_solve_triangular(L.to(dt) + eye, R.to(dt), /*upper=*/false, /*left=*/true,
                                        /*unitriangular=*/true);
}

}  // namespace linearize::ops::detail
