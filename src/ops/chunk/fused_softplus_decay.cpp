// The decay gate of Gated DeltaNet and KDA through ops/cuda/softplus_decay.cu (chunk.h,
// detail::fused_softplus_decay): one kernel each way behind an autograd node.
#include <optional>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "ops/cuda/softplus_decay.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// f [rows, C], dt_bias [C], A_log [H], contiguous -> g [rows, C] fp32.
struct SoftplusDecayFunction : public torch::autograd::Function<SoftplusDecayFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& f, const torch::Tensor& dt_bias,
                               const torch::Tensor& A_log) {
    ctx->save_for_backward({f, dt_bias, A_log});
    return {cuda_kernels::softplus_decay_forward(f, dt_bias, A_log)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dg = grads[0].to(torch::kFloat).contiguous();
    auto r = cuda_kernels::softplus_decay_backward(saved[0], saved[1], saved[2], dg);
    return {r.df, r.d_dt_bias, r.dA_log};
  }
};

}  // namespace

std::optional<torch::Tensor> fused_softplus_decay(const torch::Tensor& f, const torch::Tensor& dt_bias,
                                                  const torch::Tensor& A_log) {
  const int64_t C = f.size(-1);
  if (fused_kernels_enabled() && on_kernel_device(f) && f.numel() > 0 && dt_bias.device() == f.device() &&
      A_log.device() == f.device() &&
      cuda_kernels::softplus_decay_supported(f.scalar_type(), dt_bias.scalar_type(), A_log.scalar_type())) {
    auto g = SoftplusDecayFunction::apply(f.contiguous().view({-1, C}), dt_bias.contiguous(), A_log.contiguous())[0];
    return std::optional<torch::Tensor>(g.view(f.sizes()));
  }
  return std::nullopt;
}

}  // namespace linearize::ops::detail
