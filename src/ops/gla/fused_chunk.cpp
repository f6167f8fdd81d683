// The GLA family with no decay, a fixed decay per head or a scalar decay per step, chunked through the fused
// CUDA kernels of ops/cuda/chunk_scalar_decay.cu (see common.h, detail::fused_scalar_decay_chunk).
//
// The kernels give o, the final state, dq, dk, dv and dh0. The decay's gradient comes from those: with
// b_t the cumulative log decay (b_t = Σ_{s<=t} g_s), every term of o_t and of the final state S_T
// carries exp(b_t - b_j) with j the key's step (exp(b_t) for h0), so
//   dL/db_t = q_t·dq_t - k_t·dk_t  (+ <dS_T, S_T> at t = T)
// and dL/dg_s = Σ_{t >= s} dL/db_t: a reverse cumulative sum over time, in fp32 (the kernels give the
// row sums q_t·dq_t and k_t·dk_t in fp32, taken before dq and dk are rounded); detail::walk_decay_gradient
// with no w rows.
#include <cstdint>

#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

#include "ops/cuda/chunk_scalar_decay.h"
#include "ops/cuda/placeholder.h"

namespace linearize::ops::detail {

namespace {

using cuda_kernels::present;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs q, k, v (one 16-bit dtype, [B,T,H,D] contiguous), g [B,H,T] fp32 or empty, h0 fp32 or empty.
struct ScalarDecayChunkFunction : public torch::autograd::Function<ScalarDecayChunkFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& g, const torch::Tensor& h0,
                               double scale) {
    auto [o, final_state] = cuda_kernels::scalar_decay_chunk_forward(q, k, v, present(g), present(h0), scale);
    ctx->save_for_backward({q, k, v, g, h0, final_state});
    ctx->saved_data["scale"] = scale;
    return {o, final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &final_state = saved[5];
    const auto g = present(saved[3]), h0 = present(saved[4]);
    auto d_out = grads[0].defined() ? aligned_rows(grads[0].to(q.scalar_type())) : torch::zeros_like(v);
    auto d_final = grads[1].defined() ? aligned_rows(grads[1].to(torch::kFloat)) : torch::Tensor();
    const bool want_dg = g.defined() && ctx->needs_input_grad(3);
    auto r = cuda_kernels::scalar_decay_chunk_backward(q, k, v, g, h0, d_out, d_final, ctx->saved_data["scale"].toDouble(),
                                                       h0.defined(), want_dg);
    torch::Tensor dg;
    if (want_dg) dg = walk_decay_gradient(r.dot_q, r.dot_k, torch::Tensor(), 64, d_final, final_state);
    return {r.dq, r.dk, r.dv, dg, h0.defined() ? r.d_initial : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::optional<OpResult> fused_scalar_decay_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& g, GateKind kind,
                                                 const torch::Tensor& h0, double scale, int64_t chunk) {
  if (kind == GateKind::Vector) return std::nullopt;
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  if (!dt || !cuda_kernels::scalar_decay_chunk_supported(q.size(3), v.size(3), *dt)) return std::nullopt;
  auto operand = [&](const torch::Tensor& t) { return aligned_rows(t.to(*dt)); };
  auto out = ScalarDecayChunkFunction::apply(operand(q), operand(k), operand(v),
                                             kernel_gate(g, kind, q.size(0), q.size(1), q.options()),
                                             kernel_state(h0, q.options()), scale);
  return OpResult{out[0].to(v.scalar_type()), out[1]};
}

}  // namespace linearize::ops::detail
