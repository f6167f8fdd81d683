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
    for (const auto* one : {&u.grad_scale, &u.skip_unless_finite, &u.factors})
      if (one->defined() && (one->scalar_type() != torch::kFloat || one->device() != u.p[0].device() ||
                             !one->is_contiguous()))
        return false;
    return true;
  }();
  if (!applies) return false;
  cuda_kernels::adamw_update(u);
  return true;
}

}  // namespace linearize::ops::detail
