// Stage-3 distillation's per-token cross-entropy and KL terms over the vocabulary, and the cross-entropy alone
// (see ops.h). On a kernel
// device one kernel each way (ops/cuda/distill_loss.cu) behind an autograd node that keeps the logits and
// three logsumexps a row; elsewhere (or when the teacher's logits need a gradient) the libtorch formula, which
// is the reference the kernels are tested against.
#include <torch/torch.h>

#include "io/error.h"
#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops {

namespace {

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
  if (auto fused = detail::fused_distill_loss_terms(s, t, targets, temperature)) return *fused;
  return formula(s, t, targets, temperature);
}

torch::Tensor cross_entropy_terms(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0))
    throw Error("cross_entropy_terms: expected logits [N, V] and targets [N]; got " + detail::shape_of(logits) +
                " and " + detail::shape_of(targets));
  if (auto fused = detail::fused_cross_entropy_terms(logits, targets)) return *fused;
  return ce_formula(logits.to(torch::kFloat), targets);
}

}  // namespace linearize::ops
