// The delta rule with no decay or a scalar decay per step through fused CUDA kernels, head size 64: the UT
// transform per chunk (ops/cuda/ut_transform.cu: W, U and their backward) and the walk over the chunks
// from W and U on (ops/cuda/chunk_delta_rule.cu: V' = U - W S, the output, the state; one reverse walk
// back). Two autograd functions, so autograd carries dW and dU from the walk into the transform.
//
// The walk's kernels give o, the final state, dq, dk, dW, dU and dh0; its share of the decay's gradient
// comes from the row sums q·dq, k·dk and w·dw (walk_decay_gradient, common.h, says why). The transform's
// backward kernel gives its own dk, dv, dbeta and dg.
#include <cstdint>
#include <stdexcept>

#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/ops.h"

#include "ops/cuda/chunk_delta_rule.h"
#include "ops/cuda/placeholder.h"
#include "ops/cuda/ut_transform.h"

namespace linearize::ops::detail {

namespace {

using cuda_kernels::present;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs q, k [B,T,H,64], w, u [B,H,N*64,64] (one 16-bit dtype, contiguous), g [B,H,T] fp32 or empty, h0
// fp32 or empty.
struct DeltaWalkFunction : public torch::autograd::Function<DeltaWalkFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& w, const torch::Tensor& u, const torch::Tensor& g,
                               const torch::Tensor& h0, double scale) {
    auto r = cuda_kernels::delta_walk_forward(q, k, w, u, present(g), present(h0), scale);
    ctx->save_for_backward({q, k, w, g, h0, r.final_state});  // the backward reads V', not u
    ctx->saved_data["states"] = r.states;
    ctx->saved_data["scores"] = r.scores;
    ctx->saved_data["values"] = r.values;
    ctx->saved_data["scale"] = scale;
    return {r.o, r.final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &w = saved[2], &final_state = saved[5];
    const auto g = present(saved[3]), h0 = present(saved[4]);
    auto d_out = grads[0].defined() ? aligned_rows(grads[0].to(q.scalar_type())) : torch::zeros_like(q);
    auto d_final = grads[1].defined() ? aligned_rows(grads[1].to(torch::kFloat)) : torch::Tensor();
    const bool want_dg = g.defined() && ctx->needs_input_grad(4);
    cuda_kernels::DeltaWalkForward forward;
    forward.states = ctx->saved_data["states"].toTensor();
    forward.scores = ctx->saved_data["scores"].toTensor();
    forward.values = ctx->saved_data["values"].toTensor();
    auto r = cuda_kernels::delta_walk_backward(q, k, w, g, forward, d_out, d_final, ctx->saved_data["scale"].toDouble(),
                                               h0.defined(), want_dg);
    torch::Tensor dg;
    if (want_dg) dg = walk_decay_gradient(r.dot_q, r.dot_k, r.dot_w, 64, d_final, final_state);
    return {r.dq, r.dk, r.dw, r.du, dg, h0.defined() ? r.d_initial : torch::Tensor(), torch::Tensor()};
  }
};

// Inputs k, v [B,T,H,64] (one 16-bit dtype, contiguous), beta [B,H,T] fp32, g [B,H,T] fp32 or empty.
struct UtTransformFunction : public torch::autograd::Function<UtTransformFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& beta, const torch::Tensor& g) {
    auto r = cuda_kernels::ut_transform_forward(k, v, beta, present(g));
    ctx->save_for_backward({k, v, beta, g});
    ctx->saved_data["inverse"] = r.inverse;
    return {r.w, r.u};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &k = saved[0], &v = saved[1], &beta = saved[2];
    const auto g = present(saved[3]);
    const auto inverse = ctx->saved_data["inverse"].toTensor();  // [B,H,N,64,64]
    auto as_grad = [&](const torch::Tensor& d) {  // [B,H,N*64,64] in k's dtype
      if (d.defined()) return aligned_rows(d.to(k.scalar_type()));
      return torch::zeros({k.size(0), k.size(2), inverse.size(2) * inverse.size(3), k.size(3)}, k.options());
    };
    auto r = cuda_kernels::ut_transform_backward(k, v, beta, g, inverse, as_grad(grads[0]), as_grad(grads[1]));
    return {r.dk, r.dv, r.dbeta, g.defined() ? r.dg : torch::Tensor()};
  }
};

}  // namespace

std::optional<torch::ScalarType> fused_delta_rule_dtype(const torch::Tensor& q, const torch::Tensor& k,
                                                        const torch::Tensor& v, GateKind kind, int64_t chunk) {
  // A fixed decay per head takes the libtorch form: its gradient is the sum of the per-step ones over B
  // and T, where the row-sum identity's cancelling terms cost too much precision (6e-2 against fp32 on
  // bf16 inputs, where the scalar decay gets 6e-3). No mixer uses a fixed decay with the delta rule.
  if (kind == GateKind::Vector || kind == GateKind::Fixed) return std::nullopt;
  // The UT kernels' grid has one row per (batch, head): at most 65535 of them.
  if (q.size(0) * q.size(2) > 65535) return std::nullopt;
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  if (!dt || !cuda_kernels::delta_walk_supported(q.size(3), v.size(3), *dt)) return std::nullopt;
  return dt;
}

namespace {

// W, U [B,H,N*64,64] from k, v already in the kernels' dtype and layout (aligned_rows), beta [B,T,H] and
// the gate as kernel_gate gives it.
std::pair<torch::Tensor, torch::Tensor> ut_transform(const torch::Tensor& k, const torch::Tensor& v,
                                                     const torch::Tensor& beta, const torch::Tensor& gh) {
  auto bh = beta.to(torch::kFloat).transpose(1, 2).contiguous();  // [B,H,T]
  auto out = UtTransformFunction::apply(k, v, bh, gh);
  return {out[0], out[1]};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> fused_ut_transform(const torch::Tensor& k, const torch::Tensor& v,
                                                           const torch::Tensor& beta, const torch::Tensor& g,
                                                           GateKind kind, torch::ScalarType dt) {
  return ut_transform(aligned_rows(k.to(dt)), aligned_rows(v.to(dt)), beta,
                      kernel_gate(g, kind, k.size(0), k.size(1), k.options()));
}

OpResult fused_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                const torch::Tensor& h0, double scale, torch::ScalarType dt) {
  // k and the gate feed both the transform and the walk: converted once.
  auto operand = [&](const torch::Tensor& t) { return aligned_rows(t.to(dt)); };
  auto kd = operand(k), gh = kernel_gate(g, kind, q.size(0), q.size(1), q.options());
  auto [W, U] = ut_transform(kd, operand(v), beta, gh);  // [B,H,N*64,64]
  auto out = DeltaWalkFunction::apply(operand(q), kd, W, U, gh, kernel_state(h0, q.options()), scale);
  return OpResult{out[0].to(v.scalar_type()), out[1]};
}

}  // namespace linearize::ops::detail
