// Norms over the last dim: the L2 norm of the delta-rule mixers' q and k and the RMS norm of the Llama
// blocks and the mixers' outputs (see ops.h). On a kernel device each is one kernel each way
// (ops/cuda/row_norms.cu) behind an autograd node that keeps x, the weight and the per-row factor; elsewhere
// (or for dtypes and sizes the kernels do not take) the libtorch formula, which is the reference the
// kernels are tested against.
#include <torch/torch.h>

#include <optional>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops {

torch::Tensor l2_norm(const torch::Tensor& x, double eps) {
  if (auto y = detail::fused_row_norm(x, torch::Tensor(), 1.0, eps)) return *y;
  const auto dt = detail::compute_dtype(x);
  auto xf = x.to(dt);
  auto y = xf * torch::rsqrt(xf.pow(2).sum(-1, /*keepdim=*/true) + eps);
  return y.to(x.scalar_type());
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, const torch::Tensor& gate,
                       Gate act) {
  if (x.dim() >= 1) {
    if (auto y = detail::fused_row_norm(x, weight, 1.0 / static_cast<double>(x.size(-1)), eps, gate, act)) return *y;
  }
  auto xf = x.to(torch::kFloat);  // fp32 as Hugging Face's, fp64 inputs included
  auto y = weight * (xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
  switch (act) {
    case Gate::none: return y;
    case Gate::sigmoid: return y * torch::sigmoid(gate);
    case Gate::silu: return y * torch::silu(gate);
  }
  return y;
}

AddNorm add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps) {
  if (auto r = detail::fused_add_rms_norm(x, residual, weight, eps)) return *r;
  auto sum = x + residual;
  return {sum, rms_norm(sum, weight, eps)};
}

}  // namespace linearize::ops
