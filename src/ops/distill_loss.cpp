// Stage-3 distillation's per-token cross-entropy and KL terms over the vocabulary (see ops.h). On a kernel
// device one kernel each way (ops/cuda/distill_loss.cu) behind an autograd node that keeps the logits and
// three logsumexps a row; elsewhere (or when the teacher's logits need a gradient) the libtorch formula, which
// is the reference the kernels are tested against.
#include <torch/torch.h>

#include "io/error.h"
#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/kernels.h"
#endif

namespace linearize::ops {

namespace {

#ifdef LINEARIZE_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
    const auto saved = ctx->get_saved_variables();
    const auto& s = saved[0];
    auto grad_of = [&](const torch::Tensor& g) {  // an unused output's gradient comes undefined
      return g.defined() ? g.to(torch::kFloat).contiguous() : torch::zeros({s.size(0)}, s.options().dtype(torch::kFloat));
    };
    auto ds = cuda_kernels::distill_loss_backward(s, saved[1], saved[2], saved[3], grad_of(grads[0]),
                                                  grad_of(grads[1]), ctx->saved_data["temperature"].toDouble());
    return {ds, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

bool kernel_applies(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y) {
#ifdef LINEARIZE_WITH_KERNELS
  return fused_kernels_enabled() && on_kernel_device(s) && t.device() == s.device() && y.device() == s.device() &&
         !t.requires_grad() && y.scalar_type() == torch::kLong && cuda_kernels::distill_loss_supported(s.scalar_type()) &&
         cuda_kernels::distill_loss_supported(t.scalar_type());
#else
  (void)s, (void)t, (void)y;
  return false;
#endif
}

DistillTerms formula(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y, double temperature) {
  const int64_t V = s.size(1);
  auto s32 = s.to(torch::kFloat), t32 = t.to(torch::kFloat);
  auto valid = y.ge(0).logical_and(y.lt(V));
  auto picked = s32.gather(1, y.clamp(0, V - 1).unsqueeze(1)).squeeze(1);
  auto ce = torch::where(valid, s32.logsumexp(-1) - picked, torch::zeros_like(picked));
  if (temperature != 1.0) s32 = s32 / temperature, t32 = t32 / temperature;
  auto log_p_s = torch::log_softmax(s32, -1), log_p_t = torch::log_softmax(t32, -1);
  return {ce, (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)};
}

}  // namespace

DistillTerms distill_loss_terms(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& targets,
                                double temperature) {
  if (s.dim() != 2 || t.sizes() != s.sizes() || targets.dim() != 1 || targets.size(0) != s.size(0))
    throw Error("distill_loss_terms: expected student and teacher logits [N, V] and targets [N]; got " +
                detail::shape_of(s) + ", " + detail::shape_of(t) + " and " + detail::shape_of(targets));
  if (!(temperature > 0))
    throw Error("distill_loss_terms: the temperature must be positive, got " + std::to_string(temperature));
#ifdef LINEARIZE_WITH_KERNELS
  if (kernel_applies(s, t, targets)) {
    // One dtype for both: fp32 where they differ (exact for either).
    const auto dt = s.scalar_type() == t.scalar_type() ? s.scalar_type() : torch::kFloat;
    auto r = DistillLossFunction::apply(s.to(dt).contiguous(), t.to(dt).contiguous(), targets.contiguous(),
                                        temperature);
    return {r[0], r[1]};
  }
#endif
  return formula(s, t, targets, temperature);
}

}  // namespace linearize::ops
