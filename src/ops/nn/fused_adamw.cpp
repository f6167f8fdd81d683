// AdamW's update of many fp32 tensors in a few launches of ops/cuda/adamw.cu (nn.h, detail::fused_adamw_update).
#include <torch/torch.h>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"
#include "ops/cuda/adamw.h"

namespace linearize::ops::detail {

bool fused_adamw_update(const AdamWUpdate& u) {
  const bool applies = [&] {
    if (!fused_kernels_enabled()) return false;
    for (size_t i = 0; i < u.p.size(); ++i)
      if (!on_kernel_device(u.p[i]) || !cuda_kernels::adamw_supported(u.p[i], u.g[i]) ||
          !cuda_kernels::adamw_supported(u.m[i], u.g[i]) || !cuda_kernels::adamw_supported(u.v[i], u.g[i]) ||
          u.p[i].device() != u.p[0].device())
        return false;
    return !u.grad_scale.defined() ||
           (u.grad_scale.scalar_type() == torch::kFloat && u.grad_scale.device() == u.p[0].device());
  }();
  if (!applies) return false;
  cuda_kernels::adamw_update(u);
  return true;
}

}  // namespace linearize::ops::detail
