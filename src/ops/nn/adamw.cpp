// AdamW's update of many tensors at once (see ops.h). On a kernel device a few launches for all of them
// (ops/cuda/adamw.cu); elsewhere the element-wise ops of libtorch's AdamW step, tensor by tensor, which give its
// results to the bit.
#include <torch/torch.h>

#include <algorithm>

#include "io/error.h"
#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops {

void adamw_update(const AdamWUpdate& u) {
  const size_t n = u.p.size();
  if (u.g.size() != n || u.m.size() != n || u.v.size() != n || u.decay.size() != n || u.step_size.size() != n ||
      u.bias2_sqrt.size() != n)
    throw Error("adamw_update: expected as many gradients, moments and factors as parameters (" + std::to_string(n) +
                ")");
  if (u.grad_scale.defined() && u.grad_scale.numel() != 1)
    throw Error("adamw_update: expected grad_scale to hold one number; got " + detail::shape_of(u.grad_scale));
  torch::NoGradGuard no_grad;
  if (n > 0 && detail::fused_adamw_update(u)) return;
  for (size_t i = 0; i < n; ++i) {
    const auto g = u.grad_scale.defined() ? u.g[i].mul(u.grad_scale) : u.g[i];
    if (u.decay[i] != 1.0) u.p[i].mul_(u.decay[i]);
    u.m[i].mul_(u.beta1).add_(g, 1 - u.beta1);
    u.v[i].mul_(u.beta2).addcmul_(g, g, 1 - u.beta2);
    auto denom = (u.v[i].sqrt() / u.bias2_sqrt[i]).add_(u.eps);
    u.p[i].addcdiv_(u.m[i], denom, -u.step_size[i]);
  }
}

}  // namespace linearize::ops
