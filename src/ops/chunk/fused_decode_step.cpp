// One decode step (T = 1) of the GLA or delta-rule family through the fused kernel (chunk.h,
// ops/cuda/recurrent_step.cu), when it applies; the recurrent forms fall back to libtorch otherwise.
#include <optional>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"

#include "ops/cuda/recurrent_step.h"

namespace linearize::ops::detail {

std::optional<OpResult> fused_decode_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                          const torch::Tensor& h0, double scale, int64_t groups, bool in_place,
                                          double gate_logits, double beta_logit_scale, double l2_eps) {
  if (!fused_kernels_enabled() || !on_kernel_device(q) || q.size(1) != 1 || v.scalar_type() == torch::kDouble)
    return std::nullopt;
  if (gate_logits > 0 && kind != GateKind::Vector) return std::nullopt;
  // The kernel has no backward: a step that autograd must see runs as libtorch ops.
  if (torch::GradMode::is_enabled())
    for (const auto* t : {&q, &k, &v, &beta, &g, &h0})
      if (t->defined() && t->requires_grad()) return std::nullopt;
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), V = v.size(3);
  auto S = h0.defined() ? h0 : torch::zeros({B, H, K, V}, v.options().dtype(torch::kFloat));
  torch::Tensor gs;  // [H], [B,H] or [B,H,K]
  if (kind == GateKind::Fixed) gs = g;
  else if (kind == GateKind::Scalar || kind == GateKind::Vector) gs = g.select(1, 0);
  auto [o, S_new] = cuda_kernels::recurrent_step(q.select(1, 0), k.select(1, 0), v.select(1, 0), gs,
                                                 beta.defined() ? beta.select(1, 0) : torch::Tensor(), S, scale,
                                                 groups, in_place && h0.defined(), gate_logits, beta_logit_scale,
                                                 l2_eps);
  return OpResult{o.unsqueeze(1), S_new};
}

}  // namespace linearize::ops::detail
