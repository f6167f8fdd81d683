// The state pass over chunks through ops/cuda/state_pass.cu (chunk.h, detail::fused_state_pass): a custom
// autograd function around the kernels (a walk with the products inside for the delta rule, a batched
// product and a decayed scan for the GLA family).
#include <optional>

#include "compat/torch_compat.h"
#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "ops/cuda/placeholder.h"
#include "ops/cuda/state_pass.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using cuda_kernels::present;  // an absent W, D or S0 arrives as an empty placeholder

// Inputs W (the delta rule; empty for A), U, KdT, D [B,H,N,K] (empty: no decay), S0; outputs states, writes
// (the delta rule; empty for A), final state. The delta rule walks the chunks with the products inside one kernel;
// the GLA family forms every chunk's contribution KdT_n U_n in one batched product and scans them.
// `low_precision` (bf16 inputs or autocast): the backward's products may use TF32.
struct StatePassFunction : public torch::autograd::Function<StatePassFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& W, const torch::Tensor& U,
                               const torch::Tensor& KdT, const torch::Tensor& D, const torch::Tensor& S0,
                               bool low_precision) {
    ctx->saved_data["low_precision"] = low_precision;
    const bool delta = present(W).defined();
    StatePass out;
    if (delta) {
      auto pass = cuda_kernels::delta_pass_forward(W, U, KdT, present(D), present(S0));
      out.states = pass.states, out.writes = pass.writes, out.final_state = pass.final_state;
    } else {
      // The state contributions in fp32 (TF32 for low-precision inputs), not in autocast's bf16.
      torch::Tensor dS;
      {
        const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
        const compat::Tf32Guard tf32(low_precision);
        dS = KdT.matmul(U);  // [B,H,N,K,V]
      }
      auto [states, final_state] = cuda_kernels::decay_scan_forward(dS, present(D), present(S0));
      out.states = states, out.final_state = final_state;
    }
    auto writes = delta ? out.writes : torch::empty({0}, U.options());
    ctx->save_for_backward({W, U, KdT, D, out.states, writes});
    if (!delta) ctx->mark_non_differentiable({writes});
    return {out.states, writes, out.final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto W = present(saved[0]), D = present(saved[3]);
    const auto &U = saved[1], &KdT = saved[2], &states = saved[4], &writes = saved[5];
    const bool delta = W.defined();
    const compat::Tf32Guard tf32(ctx->saved_data["low_precision"].toBool());
    cuda_kernels::StatePassGrads g;
    if (delta) {
      g = cuda_kernels::delta_pass_backward(W, KdT, D, grads[0], grads[1], grads[2], U.size(4));
    } else {
      auto [lambda, d_initial] = cuda_kernels::decay_scan_backward(D, grads[0], grads[2], U.size(0), U.size(1),
                                                                   U.size(2), KdT.size(3), U.size(4), U.options());
      g.lambda = lambda, g.d_initial = d_initial;
      g.d_writes_total = KdT.transpose(-1, -2).matmul(lambda);  // dU [B,H,N,C,V]
    }
    const auto& X = delta ? writes : U;  // [B,H,N,C,V]
    torch::Tensor dW, dD;
    if (delta) dW = -g.d_writes_total.matmul(states.transpose(-1, -2));  // [B,H,N,C,K]
    auto dKdT = g.lambda.matmul(X.transpose(-1, -2));                     // [B,H,N,K,C]
    if (D.defined()) dD = (g.lambda * states).sum(-1);                     // [B,H,N,K]
    return {dW, g.d_writes_total, dKdT, dD, g.d_initial, torch::Tensor()};
  }
};

}  // namespace

std::optional<StatePass> fused_state_pass(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                                          const torch::Tensor& D, const torch::Tensor& S0) {
  if (fused_kernels_enabled() && on_kernel_device(U) && U.scalar_type() != torch::kDouble) {
    const int64_t B = U.size(0), H = U.size(1), N = U.size(2), K = KdT.size(3);
    // The kernels work in fp32 (under autocast the products feeding them may be bf16); D arrives as
    // [B,H,N,K,1] (vector gate) or [B,H,N,1,1] (scalar or fixed gate) and goes in per key channel.
    const auto empty = torch::empty({0}, U.options().dtype(torch::kFloat));
    auto f32 = [&](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : empty; };
    auto Dk = D.defined() ? f32(D).squeeze(-1).expand({B, H, N, K}).contiguous() : empty;
    const bool low = low_precision(U.scalar_type()) || compat::autocast_state(torch::kCUDA).enabled;
    auto out = StatePassFunction::apply(f32(W), f32(U), f32(KdT), Dk, f32(S0), low);
    return StatePass{out[0], W.defined() ? out[1] : torch::Tensor(), out[2]};
  }
  return std::nullopt;
}

}  // namespace linearize::ops::detail
