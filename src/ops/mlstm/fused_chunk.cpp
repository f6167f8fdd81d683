// The mLSTM (mLSTM) as linear attention with a scalar decay (see common.h, detail::mlstm_as_linear_attention),
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
#include <cstdint>
#include <limits>
#include <optional>

#include "compat/torch_compat.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/mlstm/mlstm.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/chunk_scalar_decay.h"
#include "ops/cuda/mlstm_normaliser.h"
#include "ops/cuda/placeholder.h"
#endif

namespace linearize::ops::detail {

namespace {

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

// The parts of the mLSTM around its numerator: the keys k' = e^{i - m} k [B,T,H,K] in the numerator's
// dtype, the numerator's decay g [B,H,T], the max state m [B,H,T], the normaliser den = n·q^ [B,H,T] and
// the final n [B,H,K]. m carries its own gradient; inside g and k' it is held constant (m0 excepted).
// q is the queries as the numerator takes them: q itself, or q passed through the kernels' node, which
// then adds the numerator's gradient of q to its own in one pass.
struct Parts {
  torch::Tensor kp, g, m, den, n_final, q;
};

// The parts in libtorch, on any device: the max state by the scan over chunks, the normaliser in the
// compute dtype with autocast off.
Parts libtorch_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& igate,
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

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef LINEARIZE_WITH_KERNELS
using cuda_kernels::present;

// The parts through ops/cuda/mlstm_normaliser.cu. Inputs q, k [B,T,H,K] (fp32 or the 16-bit kp_dtype),
// igate, fgate [B,T,H] fp32, m0 [B,H] fp32, n0 [B,H,K] fp32 or empty; outputs kp, g, m, den, n_final and q
// itself (autograd makes it a view of q with this node as its source), for the numerator: the gradient
// that comes back to it is added into dq by the normaliser's backward kernel.
struct GatesNormaliserFunction : public torch::autograd::Function<GatesNormaliserFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& igate, const torch::Tensor& fgate, const torch::Tensor& m0,
                               const torch::Tensor& n0, double scale, int64_t kp_dtype) {
    const auto lo = static_cast<torch::ScalarType>(kp_dtype);
    auto r = cuda_kernels::mlstm_normaliser_forward(q, k, igate, fgate, m0, present(n0), scale, lo);
    ctx->save_for_backward({q, k, igate, fgate, m0, r.kp, r.g, r.m, r.w, r.gsum, r.entering});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["n0"] = n0.numel() > 0;
    return {r.kp, r.g, r.m, r.den, r.n_final, q};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    cuda_kernels::MlstmNormaliserForward fw;
    fw.kp = s[5], fw.g = s[6], fw.m = s[7], fw.w = s[8], fw.gsum = s[9], fw.entering = s[10];
    auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat).contiguous() : t; };
    const bool want_d_n0 = ctx->saved_data["n0"].toBool() && ctx->needs_input_grad(5);
    auto d_kp = grads[0].defined() ? aligned_rows(grads[0].to(fw.kp.scalar_type())) : grads[0];
    auto dq_add = grads[5].defined() ? grads[5].to(s[0].scalar_type()).contiguous() : grads[5];
    auto r = cuda_kernels::mlstm_normaliser_backward(s[0], s[1], s[2], s[3], s[4], fw, d_kp, f32(grads[1]),
                                                     f32(grads[2]), f32(grads[3]), f32(grads[4]),
                                                     ctx->saved_data["scale"].toDouble(), want_d_n0, dq_add);
    return {r.dq, r.dk, r.d_igate, r.d_fgate, r.d_m0, r.d_n0, torch::Tensor(), torch::Tensor()};
  }
};

// h = o / (max(|den|, e^{-m}) + eps) through ops/cuda/mlstm_normaliser.cu, with m's gradient that of the
// eps term (see the top of this file): o [B,T,H,V] 16-bit, den and m [B,H,T] fp32, h in out_dtype, with
// no fp32 copy of o and no element-wise kernels for the denominator on the way.
struct DivideRowsFunction : public torch::autograd::Function<DivideRowsFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& o, const torch::Tensor& den,
                               const torch::Tensor& m, double eps, int64_t out_dtype) {
    ctx->save_for_backward({o, den, m});
    ctx->saved_data["eps"] = eps;
    return cuda_kernels::divide_rows_forward(o, den, m, eps, static_cast<torch::ScalarType>(out_dtype));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(5);
    const auto s = ctx->get_saved_variables();
    auto r = cuda_kernels::divide_rows_backward(s[0], s[1], s[2], ctx->saved_data["eps"].toDouble(),
                                                grads[0].contiguous());
    return {r.d_o, r.d_den, r.d_m, torch::Tensor(), torch::Tensor()};
  }
};

// The parts through the kernels, k' in the 16-bit dtype lo. q and k stay fp32 when they are (autocast):
// the normaliser then sees them unrounded, as libtorch_parts does.
Parts kernel_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& igate,
                   const torch::Tensor& fgate, const torch::Tensor& m0, const torch::Tensor& n0, double scale,
                   torch::ScalarType lo) {
  auto gate = [](const torch::Tensor& x) { return x.to(torch::kFloat).contiguous(); };
  auto rows = [&](const torch::Tensor& x) {
    return aligned_rows(x.scalar_type() == torch::kFloat || x.scalar_type() == lo ? x : x.to(torch::kFloat));
  };
  auto none = torch::empty({0}, q.options().dtype(torch::kFloat));
  auto out = GatesNormaliserFunction::apply(rows(q), rows(k), gate(igate), gate(fgate), gate(m0),
                                            n0.defined() ? gate(n0) : none, scale, static_cast<int64_t>(lo));
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}
#endif

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

// h and the final state from the parts: the numerator through gla_chunk (in k''s dtype), then
// h = numerator / (max(|den|, e^{-m}) + eps) with m's own gradient added (see the top of this file), the
// division by DivideRowsFunction when `kernels`.
MlstmResult join(const Parts& p, const torch::Tensor& v, const MlstmState& init, double scale, double eps,
                 int64_t chunk, bool kernels) {
  const int64_t T = p.q.size(1);
  const auto lo = p.kp.scalar_type();
  auto num = ops::gla_chunk(p.q.to(lo), p.kp, v.to(lo), p.g.transpose(1, 2),
                            init.defined() ? init.c : torch::Tensor(), scale, chunk);
  torch::Tensor h;  // [B,T,H,V]
#ifdef LINEARIZE_WITH_KERNELS
  if (kernels)
    h = DivideRowsFunction::apply(aligned_rows(num.o), p.den.contiguous(), p.m.contiguous(), eps,
                                  static_cast<int64_t>(v.scalar_type()));
#endif
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

}  // namespace

MlstmResult mlstm_as_linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                                      double scale, double eps, int64_t chunk) {
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3);
  const auto opts = q.options().dtype(compute_dtype(v));
  auto n0 = init.defined() ? init.n.to(opts.dtype()) : torch::zeros({B, H, K}, opts);
  auto m0 = init.defined() ? init.m.to(opts.dtype()) : torch::zeros({B, H}, opts);
  return join(libtorch_parts(q, k, igate, fgate, m0, n0, scale, chunk), v, init, scale, eps, chunk, false);
}

std::optional<MlstmResult> fused_mlstm_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const torch::Tensor& igate, const torch::Tensor& fgate,
                                             const MlstmState& init, double scale, double eps, int64_t chunk) {
#ifdef LINEARIZE_WITH_KERNELS
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  if (!dt || !cuda_kernels::scalar_decay_chunk_supported(K, v.size(3), *dt) ||
      !cuda_kernels::mlstm_normaliser_supported(K) || T == 0)
    return std::nullopt;
  const auto f32 = q.options().dtype(torch::kFloat);
  auto m0 = init.defined() ? init.m : torch::zeros({B, H}, f32);
  auto n0 = init.defined() ? init.n : torch::Tensor();
  return join(kernel_parts(q, k, igate, fgate, m0, n0, scale, *dt), v, init, scale, eps, chunk, true);
#else
  (void)q, (void)k, (void)v, (void)igate, (void)fgate, (void)init, (void)scale, (void)eps, (void)chunk;
  return std::nullopt;
#endif
}

}  // namespace linearize::ops::detail
