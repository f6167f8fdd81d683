// The decay gate of Gated DeltaNet and KDA (see ops.h). On a kernel device one kernel each way
// (ops/cuda/softplus_decay.cu) behind an autograd node that keeps f and the two parameters; elsewhere (or for
// dtypes the kernels do not take) the libtorch formula, which is the reference the kernels are tested
// against.
#include <torch/torch.h>

#include "io/error.h"
#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops {

torch::Tensor softplus_decay(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log) {
  const int64_t H = A_log.numel(), C = f.dim() > 0 ? f.size(-1) : 0;
  if (f.dim() < 1 || A_log.dim() != 1 || H == 0 || C % H != 0 || dt_bias.dim() != 1 || dt_bias.size(0) != C)
    throw Error("softplus_decay: expected f [..., C], dt_bias [C] and A_log [H] with H dividing C; got f " +
                detail::shape_of(f) + ", dt_bias " + detail::shape_of(dt_bias) + ", A_log " + detail::shape_of(A_log));
  if (auto fused = detail::fused_softplus_decay(f, dt_bias, A_log)) return *fused;
  auto sizes = f.sizes().vec();
  auto per_head = sizes;
  per_head.back() = H;
  per_head.push_back(C / H);
  auto z = (f.to(torch::kFloat) + dt_bias.to(torch::kFloat)).view(per_head);   // [..., H, K]
  auto g = -A_log.to(torch::kFloat).exp().view({H, 1}) * torch::softplus(z);  // [..., H, K]
  return g.view(sizes);
}

torch::Tensor lower_bound_decay(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log,
                                double lower_bound) {
  const int64_t H = A_log.numel(), C = f.dim() > 0 ? f.size(-1) : 0;
  if (f.dim() < 1 || A_log.dim() != 1 || H == 0 || C % H != 0 || dt_bias.dim() != 1 || dt_bias.size(0) != C)
    throw Error("lower_bound_decay: expected f [..., C], dt_bias [C] and A_log [H] with H dividing C; got f " +
                detail::shape_of(f) + ", dt_bias " + detail::shape_of(dt_bias) + ", A_log " + detail::shape_of(A_log));
  auto sizes = f.sizes().vec();
  auto per_head = sizes;
  per_head.back() = H;
  per_head.push_back(C / H);
  auto z = (f.to(torch::kFloat) + dt_bias.to(torch::kFloat)).view(per_head);  // [..., H, K]
  auto g = lower_bound * torch::sigmoid(A_log.to(torch::kFloat).exp().view({H, 1}) * z);
  return g.view(sizes);
}

}  // namespace linearize::ops
