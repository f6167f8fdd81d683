// The mLSTM as linear attention with a scalar decay (see common.h, detail::mlstm_as_linear_attention),
// the form that takes the fused kernels of the GLA family on CUDA (detail::fused_mlstm_chunk).
// Once the max state m_t is known, the stabilised recurrence is linear attention with a scalar decay:
//   m_t  = max(log f_t + m_{t-1}, i_t)                  (the gates only)
//   g_t  = log f_t + m_{t-1} - m_t <= 0,   k'_t = e^{i_t - m_t} k_t
//   C_t  = e^{g_t} C_{t-1} + k'_t v_t^T,   n_t = e^{g_t} n_{t-1} + k'_t
//   h_t  = C_t^T q^_t / (max(|n_t · q^_t|, e^{-m_t}) + eps)
// The numerator C_t^T q^_t is gla_chunk's (on CUDA with 16-bit inputs the scalar-decay chunk kernels,
// ops/cuda/chunk_scalar_decay.cu: 16-bit products, fp32 state). The normaliser n_t · q^_t is a signed
// sum that can cancel, and the kernels' 16-bit products lose it, so it is taken in full precision:
//   - on CUDA (fused_mlstm_chunk), together with m, g and k', by ops/cuda/mlstm_normaliser.cu in fp32;
//   - in libtorch (mlstm_as_linear_attention, any device) in the compute dtype with autocast off: the
//     intra-chunk row sums of the decayed scores plus the chunk's decayed q^ against n, n carried over
//     the chunks by the decayed scan of detail::state_pass.
//
// h is invariant to a common shift of m in everything but eps: with N, D the unstabilised numerator and
// normaliser, h = N / (max(|D|, 1) + eps e^{m}). So the stabilised parts take m as a constant (no gradient
// flows through them: in 16-bit products the cancelling terms would swamp the gates' gradients), and m's
// own gradient is added where it is not zero: dh/dm = -h eps / (max(|n·q^|, e^{-m}) + eps), and for the
// returned state, stabilised as c = e^{-m_T} C, dc/dm_T = -c (n likewise).
//
// m_t per chunk, from the chunk-local cumulative log f (b): m_t = max(b_t + m_in, b_t + max_{s <= t}
// (i_s - b_s)) with m_in the max state entering the chunk; a chunk maps its m_in to
// max(m_in + alpha, beta) (alpha = b at its last step, beta = its own maximum there), and the maps compose
// associatively, so the m_in of every chunk come from a log-depth scan over the chunks. Every sum in it
// spans the steps between a term and the step it is read at, as in the recurrence itself.
#include <functional>
#include <cstdint>
#include <limits>
#include <optional>

#include "compat/torch_compat.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/mlstm/mlstm.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The max state m_t [B,H,N*C] from the per-step log f and input gate [B,H,N*C] (heads first, padded with
// log f = 0 and i = -inf) and the max state before the first step, m0 [B,H].
torch::Tensor max_state(const torch::Tensor& lf, const torch::Tensor& ig, const torch::Tensor& m0, int64_t C) {
  const int64_t B = lf.size(0), H = lf.size(1), N = lf.size(2) / C;
  auto b = lf.reshape({B, H, N, C}).cumsum(-1);
  auto own = b + std::get<0>(torch::cummax(ig.reshape({B, H, N, C}) - b, -1));  // from the chunk's own steps
  auto alpha = b.select(-1, C - 1), beta = own.select(-1, C - 1);               // [B,H,N]
  // Inclusive scan of the maps m -> max(m + alpha, beta): afterwards entry j composes chunks 0..j.
  for (int64_t d = 1; d < N; d *= 2) {
    auto a_prev = alpha.narrow(2, 0, N - d), b_prev = beta.narrow(2, 0, N - d);
    auto a_cur = alpha.narrow(2, d, N - d), b_cur = beta.narrow(2, d, N - d);
    auto a_new = a_prev + a_cur, b_new = torch::maximum(b_prev + a_cur, b_cur);
    alpha = torch::cat({alpha.narrow(2, 0, d), a_new}, 2);
    beta = torch::cat({beta.narrow(2, 0, d), b_new}, 2);
  }
  auto m_out = torch::maximum(m0.unsqueeze(-1) + alpha, beta);                  // leaving chunk j
  auto m_in = torch::cat({m0.unsqueeze(-1), m_out.narrow(2, 0, N - 1)}, 2);    // entering chunk j
  return torch::maximum(b + m_in.unsqueeze(-1), own).reshape({B, H, N * C});
}

// n_t · q^_t [B,H,Tp] and the final n [B,H,K] in Q's dtype: q^ [B,H,N,C,K] (scaled), k' [B,H,N,C,K], the
// chunk-local cumulative decay G [B,H,N,C], n0 [B,H,K].
std::pair<torch::Tensor, torch::Tensor> normaliser(const torch::Tensor& Q, const torch::Tensor& Kp,
                                                   const torch::Tensor& G, const torch::Tensor& n0) {
  const int64_t B = Q.size(0), H = Q.size(1), N = Q.size(2), C = Q.size(3);
  auto P = gated_scores(Q, Kp, G, /*strict=*/false);                        // [B,H,N,C,C]
  auto Gl = G.narrow(-1, C - 1, 1);                                          // [B,H,N,1]
  auto KdT = (Kp * (Gl - G).exp().unsqueeze(-1)).transpose(-1, -2);          // [B,H,N,K,C]
  auto pass = state_pass({}, torch::ones({B, H, N, C, 1}, Q.options()), KdT, Gl.exp().unsqueeze(-1),
                         n0.unsqueeze(-1));                                  // n entering each chunk [B,H,N,K,1]
  auto inter = (Q * G.exp().unsqueeze(-1)).matmul(pass.states).squeeze(-1);  // [B,H,N,C]
  return {(P.sum(-1) + inter).reshape({B, H, N * C}), pass.final_state.squeeze(-1)};
}

// The parts in libtorch, on any device: the max state by the scan over chunks, the normaliser in the
// compute dtype with autocast off.
MlstmParts libtorch_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& igate,
                     const torch::Tensor& fgate, const torch::Tensor& m0, const torch::Tensor& n0, double scale,
                     int64_t chunk) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), C = chunk;
  const int64_t Tp = round_up(T, C), N = Tp / C;
  const auto dt = m0.scalar_type();
  const double inf = std::numeric_limits<double>::infinity();
  auto lf = pad_dim(torch::log_sigmoid(fgate.to(dt)).transpose(1, 2), 2, Tp, 0.0);  // [B,H,Tp]
  auto ig = pad_dim(igate.to(dt).transpose(1, 2), 2, Tp, -inf);                    // [B,H,Tp]
  auto m_grad = max_state(lf, ig, m0, C), m = m_grad.detach();                      // [B,H,Tp]
  // m0 itself is an input (the initial state is stabilised by it), so it keeps its gradient here.
  auto m_before = torch::cat({m0.unsqueeze(-1), m.narrow(2, 0, Tp - 1)}, 2);
  auto g = lf + m_before - m;                                                       // <= 0, zero past T
  auto kp = k.to(dt) * (ig - m).narrow(2, 0, T).exp().transpose(1, 2).unsqueeze(-1);  // [B,T,H,K]
  torch::Tensor den, n_final;
  {
    compat::AutocastOffGuard full_precision(q.device().type());
    auto chunked = [&](const torch::Tensor& x) {  // [B,T,H,K] -> [B,H,N,C,K]
      return pad_dim(to_heads_first(x, dt), 2, Tp, 0.0).reshape({B, H, N, C, K});
    };
    std::tie(den, n_final) = normaliser(chunked(q) * scale, chunked(kp), g.reshape({B, H, N, C}).cumsum(-1), n0);
  }
  return {kp.to(q.scalar_type()), g.narrow(2, 0, T), m_grad.narrow(2, 0, T), den.narrow(2, 0, T), n_final, q};
}

// The returned state c, n unchanged in value, with the gradient of its stabilisation by e^{-m_T} (see the
// top of this file): dc/dm_T = -c, dn/dm_T = -n. One autograd node and no kernels in the forward.
struct StabilisedStateFunction : public torch::autograd::Function<StabilisedStateFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& c, const torch::Tensor& n,
                               const torch::Tensor& /*m_last: its gradient*/) {
    ctx->save_for_backward({c, n});
    return {c, n};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    torch::Tensor d_m;  // -Σ dc ⊙ c - Σ dn ⊙ n per (batch, head)
    if (grads[0].defined()) d_m = -(grads[0] * s[0]).sum({2, 3});
    if (grads[1].defined()) d_m = d_m.defined() ? d_m - (grads[1] * s[1]).sum(2) : -(grads[1] * s[1]).sum(2);
    return {grads[0], grads[1], d_m};
  }
};

}  // namespace

MlstmResult mlstm_join(const MlstmParts& p, const torch::Tensor& v, const MlstmState& init, double scale, double eps,
                       int64_t chunk, const std::function<torch::Tensor(const torch::Tensor&)>& divide) {
  const int64_t T = p.q.size(1);
  const auto lo = p.kp.scalar_type();
  auto num = ops::gla_chunk(p.q.to(lo), p.kp, v.to(lo), p.g.transpose(1, 2),
                            init.defined() ? init.c : torch::Tensor(), scale, chunk);
  torch::Tensor h = divide ? divide(num.o) : torch::Tensor();  // [B,T,H,V]
  if (!h.defined()) {
    // m's gradient through a term that is zero in value (shift = m - m.detach()): eps (1 + shift) in the
    // denominator gives dh/dm = -h eps / denominator.
    auto m = p.m.detach(), shift = p.m - m;
    auto denom = torch::maximum(p.den.abs(), (-m).exp()) + eps * (shift + 1);  // [B,H,T]
    h = num.o.to(p.den.scalar_type()) / denom.transpose(1, 2).unsqueeze(-1);
  }
  auto m_last = p.m.select(2, T - 1);  // [B,H]
  auto state = StabilisedStateFunction::apply(num.state, p.n_final, m_last);
  return MlstmResult{h.to(v.scalar_type()), {state[0], state[1], m_last}};
}

MlstmResult mlstm_as_linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                                      double scale, double eps, int64_t chunk) {
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3);
  const auto opts = q.options().dtype(compute_dtype(v));
  auto n0 = init.defined() ? init.n.to(opts.dtype()) : torch::zeros({B, H, K}, opts);
  auto m0 = init.defined() ? init.m.to(opts.dtype()) : torch::zeros({B, H}, opts);
  return mlstm_join(libtorch_parts(q, k, igate, fgate, m0, n0, scale, chunk), v, init, scale, eps, chunk, {});
}

}  // namespace linearize::ops::detail
