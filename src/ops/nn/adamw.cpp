// AdamW's update of many tensors at once (see ops.h). On a kernel device a few launches for all of them
// (ops/cuda/adamw.cu); elsewhere the element-wise ops of libtorch's AdamW step, tensor by tensor, which give its
// results to the bit.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "io/error.h"
#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops {

void adamw_update(const AdamWUpdate& u) {
  const size_t n = u.p.size();
  const size_t factors = u.factors.defined() ? 0 : n;  // the host vectors' length
  if (u.g.size() != n || u.m.size() != n || u.v.size() != n || u.decay.size() != factors ||
      u.step_size.size() != factors || u.bias2_sqrt.size() != factors)
    throw Error("adamw_update: expected as many gradients, moments and factors as parameters (" + std::to_string(n) +
                ")");
  if (u.factors.defined() && (u.factors.dim() != 2 || u.factors.size(0) != static_cast<int64_t>(n) ||
                              u.factors.size(1) != 3 || u.factors.scalar_type() != torch::kFloat))
    throw Error("adamw_update: expected factors [" + std::to_string(n) + ", 3] fp32; got " +
                detail::shape_of(u.factors));
  for (const auto* one : {&u.grad_scale, &u.skip_unless_finite})
    if (one->defined() && one->numel() != 1)
      throw Error("adamw_update: expected grad_scale and skip_unless_finite to hold one number each; got " +
                  detail::shape_of(*one));
  torch::NoGradGuard no_grad;
  if (n > 0 && detail::fused_adamw_update(u)) return;
  // libtorch's ops, which read device factors and the skip flag on the host (no CUDA graph takes this path).
  if (u.skip_unless_finite.defined() && !std::isfinite(u.skip_unless_finite.item<double>())) return;
  const auto host_factors = u.factors.defined() ? u.factors.to(torch::kCPU).contiguous() : torch::Tensor();
  const float* rows = host_factors.defined() ? host_factors.data_ptr<float>() : nullptr;  // [n, 3]
  auto factor = [&](const std::vector<double>& given, size_t i, int64_t column) {
    return rows ? static_cast<double>(rows[3 * i + column]) : given[i];
  };
  for (size_t i = 0; i < n; ++i) {
    const auto g = u.grad_scale.defined() ? u.g[i].mul(u.grad_scale) : u.g[i];
    const double decay = factor(u.decay, i, 0), step_size = factor(u.step_size, i, 1);
    const double bias2_sqrt = factor(u.bias2_sqrt, i, 2);
    if (decay != 1.0) u.p[i].mul_(decay);
    u.m[i].mul_(u.beta1).add_(g, 1 - u.beta1);
    u.v[i].mul_(u.beta2).addcmul_(g, g, 1 - u.beta2);
    auto denom = (u.v[i].sqrt() / bias2_sqrt).add_(u.eps);
    u.p[i].addcdiv_(u.m[i], denom, -step_size);
  }
}

}  // namespace linearize::ops
