// AdamW's update of many tensors at once (see ops.h). On a kernel device a few launches for all of them
// (ops/cuda/adamw.cu); elsewhere the element-wise ops of libtorch's AdamW step, tensor by tensor, which give its
// results to the bit.
#include <torch/torch.h>

#include <algorithm>

#include "io/error.h"
#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/adamw.h"
#endif

namespace linearize::ops {

namespace {

bool kernel_applies(const AdamWUpdate& u) {
#ifdef LINEARIZE_WITH_KERNELS
  if (!fused_kernels_enabled()) return false;
  for (size_t i = 0; i < u.p.size(); ++i)
    if (!on_kernel_device(u.p[i]) || !cuda_kernels::adamw_supported(u.p[i], u.g[i]) ||
        !cuda_kernels::adamw_supported(u.m[i], u.g[i]) || !cuda_kernels::adamw_supported(u.v[i], u.g[i]) ||
        u.p[i].device() != u.p[0].device())
      return false;
  return !u.grad_scale.defined() ||
         (u.grad_scale.scalar_type() == torch::kFloat && u.grad_scale.device() == u.p[0].device());
#else
  (void)u;
  return false;
#endif
}

}  // namespace

void adamw_update(const AdamWUpdate& u) {
  const size_t n = u.p.size();
  if (u.g.size() != n || u.m.size() != n || u.v.size() != n || u.decay.size() != n || u.step_size.size() != n ||
      u.bias2_sqrt.size() != n)
    throw Error("adamw_update: expected as many gradients, moments and factors as parameters (" + std::to_string(n) +
                ")");
  if (u.grad_scale.defined() && u.grad_scale.numel() != 1)
    throw Error("adamw_update: expected grad_scale to hold one number; got " + detail::shape_of(u.grad_scale));
  torch::NoGradGuard no_grad;
#ifdef LINEARIZE_WITH_KERNELS
  if (n > 0 && kernel_applies(u)) return cuda_kernels::adamw_update(u);
#endif
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
