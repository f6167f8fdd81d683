// The decay gate of Gated DeltaNet and KDA (see ops.h). On a kernel device one kernel each way
// (ops/cuda/softplus_decay.cu) behind an autograd node that keeps f and the two parameters; elsewhere (or for
// dtypes the kernels do not take) the libtorch formula, which is the reference the kernels are tested
// against.
#include <torch/torch.h>

#include "io/error.h"
#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/softplus_decay.h"
#endif

namespace linearize::ops {

namespace {

#ifdef LINEARIZE_WITH_KERNELS
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
#endif

}  // namespace

torch::Tensor softplus_decay(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log) {
  const int64_t H = A_log.numel(), C = f.dim() > 0 ? f.size(-1) : 0;
  if (f.dim() < 1 || A_log.dim() != 1 || H == 0 || C % H != 0 || dt_bias.dim() != 1 || dt_bias.size(0) != C)
    throw Error("softplus_decay: expected f [..., C], dt_bias [C] and A_log [H] with H dividing C; got f " +
                detail::shape_of(f) + ", dt_bias " + detail::shape_of(dt_bias) + ", A_log " + detail::shape_of(A_log));
#ifdef LINEARIZE_WITH_KERNELS
  if (fused_kernels_enabled() && on_kernel_device(f) && f.numel() > 0 && dt_bias.device() == f.device() &&
      A_log.device() == f.device() &&
      cuda_kernels::softplus_decay_supported(f.scalar_type(), dt_bias.scalar_type(), A_log.scalar_type())) {
    auto g = SoftplusDecayFunction::apply(f.contiguous().view({-1, C}), dt_bias.contiguous(), A_log.contiguous())[0];
    return g.view(f.sizes());
  }
#endif
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
