// Stage-3 distillation's per-token cross-entropy and KL terms over the vocabulary, and the cross-entropy alone
// (see ops.h). On a kernel
// device one kernel each way (ops/cuda/distill_loss.cu) behind an autograd node that keeps the logits and
// three logsumexps a row; elsewhere (or when the teacher's logits need a gradient) the libtorch formula, which
// is the reference the kernels are tested against.
#include <torch/torch.h>

#include "io/error.h"
#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/distill_loss.h"
#endif

namespace linearize::ops {

namespace {

#ifdef LINEARIZE_WITH_KERNELS
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
#endif

// t undefined: no teacher.
bool kernel_applies(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y) {
#ifdef LINEARIZE_WITH_KERNELS
  const bool teacher_ok = !t.defined() || (t.device() == s.device() && !t.requires_grad() &&
                                           cuda_kernels::distill_loss_supported(t.scalar_type()));
  return fused_kernels_enabled() && on_kernel_device(s) && teacher_ok && y.device() == s.device() &&
         y.scalar_type() == torch::kLong && cuda_kernels::distill_loss_supported(s.scalar_type());
#else
  (void)s, (void)t, (void)y;
  return false;
#endif
}

torch::Tensor ce_formula(const torch::Tensor& s32, const torch::Tensor& y) {
  const int64_t V = s32.size(1);
  auto valid = y.ge(0).logical_and(y.lt(V));
  auto picked = s32.gather(1, y.clamp(0, V - 1).unsqueeze(1)).squeeze(1);
  return torch::where(valid, s32.logsumexp(-1) - picked, torch::zeros_like(picked));
}

DistillTerms formula(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y, double temperature) {
  auto s32 = s.to(torch::kFloat), t32 = t.to(torch::kFloat);
  auto ce = ce_formula(s32, y);
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

torch::Tensor cross_entropy_terms(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0))
    throw Error("cross_entropy_terms: expected logits [N, V] and targets [N]; got " + detail::shape_of(logits) +
                " and " + detail::shape_of(targets));
#ifdef LINEARIZE_WITH_KERNELS
  if (kernel_applies(logits, torch::Tensor(), targets))
    return CrossEntropyFunction::apply(logits.contiguous(), targets.contiguous())[0];
#endif
  return ce_formula(logits.to(torch::kFloat), targets);
}

}  // namespace linearize::ops
