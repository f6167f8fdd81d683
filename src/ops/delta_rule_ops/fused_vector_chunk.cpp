// Family B with a decay per key channel (Kimi Delta Attention) through fused CUDA kernels, head size 64
// (see common.h, detail::fused_vector_delta_rule_chunk). The chunked form of chunk.cpp as three kernels
// each way:
//   Aqk, qd = scale e^G ⊙ q, kd = e^{Gl - G} ⊙ k, a = e^{Gl}   GLA's scores kernel, q against k, which
//   Akk, e^G ⊙ k                                               also gives the keys' own scores (scale 1)
//   [W U] = (I + L)^{-1} diag(beta) [e^G ⊙ k, v],  L = strictly lower diag(beta) Akk
//                                                             (ut_transform.cu, given the scores)
//   o, S_T = the walk from qd, kd, W, U, Aqk and a             (chunk_vector_decay.cu, the delta rule)
// Autograd joins the parts: the walk's dW and dU go back through the transform to Akk, beta, e^G ⊙ k
// and v, and the scores kernel's backward takes both scores' gradients (and those of the row factors)
// back to q, k and g in one pass.
#include <cstdint>
#include <stdexcept>

#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/kernels.h"
#endif

namespace linearize::ops::detail {

#ifdef LINEARIZE_WITH_KERNELS
namespace {

using cuda_kernels::present;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// qd, kd, w, u [B,H,N*64,64] and A [B,H,N,64,64] (one 16-bit dtype), a [B,H,N,64] fp32, h0 fp32 or empty,
// T the sequence length -> o [B,T,H,64], the final state.
struct VectorDeltaWalkFunction : public torch::autograd::Function<VectorDeltaWalkFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qd, const torch::Tensor& kd,
                               const torch::Tensor& w, const torch::Tensor& u, const torch::Tensor& A,
                               const torch::Tensor& a, const torch::Tensor& h0, int64_t T) {
    auto r = cuda_kernels::vector_delta_walk_forward(qd, kd, w, u, A, a, present(h0), T);
    ctx->save_for_backward({qd, kd, w, u, A, a, h0});
    ctx->saved_data["states"] = r.states;
    ctx->saved_data["T"] = T;
    return {r.o, r.final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &qd = saved[0], &kd = saved[1], &w = saved[2], &u = saved[3], &A = saved[4], &a = saved[5];
    const auto h0 = present(saved[6]);
    const int64_t B = w.size(0), H = w.size(1), T = ctx->saved_data["T"].toInt();
    auto d_out = grads[0].defined() ? aligned_rows(grads[0].to(qd.scalar_type()))
                                    : torch::zeros({B, T, H, w.size(3)}, qd.options());
    auto d_final = grads[1].defined() ? aligned_rows(grads[1].to(torch::kFloat)) : torch::Tensor();
    auto r = cuda_kernels::vector_delta_walk_backward(qd, kd, w, u, A, a, ctx->saved_data["states"].toTensor(), d_out,
                                                      d_final, h0.defined());
    return {r.dqd, r.dkd, r.dw, r.dv, r.dA, r.da, h0.defined() ? r.d_initial : torch::Tensor(), torch::Tensor()};
  }
};

// Akk [B,H,N,64,64] and ek = e^G ⊙ k [B,H,N*64,64] from the scores kernel, v [B,T,H,64] (one 16-bit dtype),
// beta [B,H,T] fp32 -> W, U [B,H,N*64,64].
struct UtGivenFunction : public torch::autograd::Function<UtGivenFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& Akk, const torch::Tensor& ek,
                               const torch::Tensor& v, const torch::Tensor& beta) {
    auto r = cuda_kernels::ut_transform_given_forward(Akk, ek, v, beta);
    ctx->save_for_backward({Akk, ek, v, beta});
    ctx->saved_data["inverse"] = r.inverse;
    return {r.w, r.u};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &Akk = saved[0], &ek = saved[1], &v = saved[2], &beta = saved[3];
    auto as_grad = [&](const torch::Tensor& d) {  // [B,H,N*64,64] in ek's dtype
      return d.defined() ? aligned_rows(d.to(ek.scalar_type())) : torch::zeros_like(ek);
    };
    auto r = cuda_kernels::ut_transform_given_backward(Akk, ek, v, beta, ctx->saved_data["inverse"].toTensor(),
                                                       as_grad(grads[0]), as_grad(grads[1]));
    return {r.d_scores, r.dk, r.dv, r.dbeta};
  }
};

}  // namespace
#endif

std::optional<OpResult> fused_vector_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const torch::Tensor& beta,
                                                      const torch::Tensor& g, GateKind kind, const torch::Tensor& h0,
                                                      double scale, int64_t chunk) {
#ifdef LINEARIZE_WITH_KERNELS
  if (kind != GateKind::Vector) return std::nullopt;
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  if (!dt || !cuda_kernels::vector_decay_chunk_supported(q.size(3), v.size(3), *dt)) return std::nullopt;
  if (q.size(0) * q.size(2) > 65535) return std::nullopt;  // the scores kernels' grid rows
  const int64_t T = q.size(1);
  auto operand = [&](const torch::Tensor& t, torch::ScalarType to) { return aligned_rows(t.to(to)); };
  auto qh = operand(q, *dt), kh = operand(k, *dt), gf = operand(g, torch::kFloat);
  auto s = fused_vector_scores(qh, kh, gf, scale, /*key_scores=*/true);  // Aqk, qd, kd, a, Akk, e^G ⊙ k
  auto WU = UtGivenFunction::apply(s[4], s[5], operand(v, *dt),
                                   beta.to(torch::kFloat).transpose(1, 2).contiguous());  // beta [B,H,T]
  auto out = VectorDeltaWalkFunction::apply(s[1], s[2], WU[0], WU[1], s[0], s[3], kernel_state(h0, q.options()), T);
  return OpResult{out[0].to(v.scalar_type()), out[1]};
#else
  (void)q, (void)k, (void)v, (void)beta, (void)g, (void)kind, (void)h0, (void)scale, (void)chunk;
  return std::nullopt;
#endif
}

}  // namespace linearize::ops::detail
