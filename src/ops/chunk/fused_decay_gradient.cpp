// A scalar decay's gradient from a fused walk's row sums in one kernel (chunk.h,
// detail::fused_walk_decay_gradient; ops/cuda/decay_gradient.cu).
#include <optional>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "ops/cuda/decay_gradient.h"

namespace linearize::ops::detail {

std::optional<torch::Tensor> fused_walk_decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k,
                                                       const torch::Tensor& dot_w, int64_t chunk,
                                                       const torch::Tensor& d_final, const torch::Tensor& final_state) {
  if (on_kernel_device(dot_q) && cuda_kernels::decay_gradient_supported(chunk))
    return std::optional<torch::Tensor>(cuda_kernels::decay_gradient(dot_q, dot_k, dot_w, chunk, d_final, final_state));
  return std::nullopt;
}

}  // namespace linearize::ops::detail
