// The delta rule's triangular solve (see common.h). On CUDA with fused kernels on, the chunk's
// inverse (I + L)^{-1} comes from one kernel (ops/cuda/unit_lower_inverse.cu) and is applied as a
// batched product, which runs on tensor cores under autocast; its backward is
//   dL = -tril_{-1}(T^T dT T^T),  T = (I + L)^{-1}.
// Elsewhere linalg_solve_triangular (unit lower), differentiated by autograd.
#include "compat/torch_compat.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

torch::Tensor solve_unit_lower(const torch::Tensor& L, const torch::Tensor& R) {
  if (auto fused = fused_solve_unit_lower(L, R)) return *fused;
  const auto dt = compute_dtype(L);  // bf16 L: solve in fp32
  auto eye = torch::eye(L.size(-1), L.options().dtype(dt));
  return torch::linalg_solve_triangular(L.to(dt) + eye, R.to(dt), /*upper=*/false, /*left=*/true,
                                        /*unitriangular=*/true);
}

}  // namespace linearize::ops::detail
