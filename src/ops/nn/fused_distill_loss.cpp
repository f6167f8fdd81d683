// The stage-3 loss terms and the plain cross-entropy through ops/cuda/distill_loss.cu (nn.h,
// detail::fused_distill_loss_terms, detail::fused_cross_entropy_terms): one kernel each way behind an autograd node.
#include <optional>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"
#include "ops/cuda/distill_loss.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The gradient in s from the saved s, t (undefined: no teacher), y, lse and the outputs' gradients (an unused
// output's comes undefined).
torch::Tensor grad_in_s(const variable_list& saved, const variable_list& grads, double temperature) {
  const auto& s = saved[0];
  auto grad_of = [&](const torch::Tensor& g) {
    return g.defined() ? g.to(torch::kFloat).contiguous()
                       : torch::zeros({s.size(0)}, s.options().dtype(torch::kFloat));
  };
  const torch::Tensor t = saved.size() == 4 ? saved[1] : torch::Tensor();
  const auto dkl = t.defined() ? grad_of(grads[1]) : torch::Tensor();
  return cuda_kernels::distill_loss_backward(s, t, saved[saved.size() - 2], saved.back(), grad_of(grads[0]), dkl,
                                             temperature);
}

// s, t [N, V] of one dtype, contiguous; y [N] int64 -> ce, kl [N] fp32.
struct DistillLossFunction : public torch::autograd::Function<DistillLossFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& s, const torch::Tensor& t,
                               const torch::Tensor& y, double temperature) {
    auto r = cuda_kernels::distill_loss_forward(s, t, y, temperature);
    ctx->save_for_backward({s, t, y, r.lse});
    ctx->saved_data["temperature"] = temperature;
    return {r.ce, r.kl};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto ds = grad_in_s(ctx->get_saved_variables(), grads, ctx->saved_data["temperature"].toDouble());
    return {ds, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The same without a teacher: s [N, V] contiguous, y [N] int64 -> ce [N] fp32.
struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& s, const torch::Tensor& y) {
    auto r = cuda_kernels::distill_loss_forward(s, torch::Tensor(), y, 1.0);
    ctx->save_for_backward({s, y, r.lse});
    return {r.ce};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grad_in_s(ctx->get_saved_variables(), grads, 1.0), torch::Tensor()};
  }
};

// t undefined: no teacher.
bool kernel_applies(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y) {
  const bool teacher_ok = !t.defined() || (t.device() == s.device() && !t.requires_grad() &&
                                           cuda_kernels::distill_loss_supported(t.scalar_type()));
  return fused_kernels_enabled() && on_kernel_device(s) && teacher_ok && y.device() == s.device() &&
         y.scalar_type() == torch::kLong && cuda_kernels::distill_loss_supported(s.scalar_type());
}

}  // namespace

std::optional<DistillTerms> fused_distill_loss_terms(const torch::Tensor& s, const torch::Tensor& t,
                                                     const torch::Tensor& targets, double temperature) {
  if (!kernel_applies(s, t, targets)) return std::nullopt;
  // One dtype for both: fp32 where they differ (exact for either).
  const auto dt = s.scalar_type() == t.scalar_type() ? s.scalar_type() : torch::kFloat;
  auto r = DistillLossFunction::apply(s.to(dt).contiguous(), t.to(dt).contiguous(), targets.contiguous(),
                                      temperature);
  return DistillTerms{r[0], r[1]};
}

std::optional<torch::Tensor> fused_cross_entropy_terms(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (!kernel_applies(logits, torch::Tensor(), targets)) return std::nullopt;
  return CrossEntropyFunction::apply(logits.contiguous(), targets.contiguous())[0];
}

}  // namespace linearize::ops::detail
