// The GLA family, chunked form (docs/design.md, "Chunked gated linear attention"): gated linear attention in chunks of C, for
// training and prefill.
//
// Per chunk n, with G the chunk-local cumulative log decay (fp32, reset every chunk):
//   A[r,j]  = scale Σ_d Q[r,d] K[j,d] exp(G[r,d] - G[j,d])   for j <= r          (intra-chunk scores)
//   O       = scale (Q ⊙ e^G) S^(n) + A V
//   S^(n+1) = Diag(e^{G_last}) S^(n) + (K ⊙ e^{G_last - G})^T V
// Everything but the state recurrence is one batched op over all chunks; the recurrence is
// detail::state_pass (a loop over chunks, or one CUDA kernel each way). All exponents are <= 0 (vector gates: see
// detail::gated_scores). On CUDA, 16-bit inputs take the fused kernels instead: fused_chunk.cpp without a per-channel
// gate, fused_vector_chunk.cpp with one (head size 64).
//
// Shapes: q, k [B,T,H,K]; v [B,T,H,V]; g undefined / [H] / [B,T,H] / [B,T,H,K]; inside, [B,H,N,C,D]
// with N = ceil(T/C). T is zero-padded to N*C: zero q, k, v and zero log decay on padded steps (a
// fixed decay too), so padding changes neither o nor the final state. Autograd flows to q, k, v, g, h0.
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

namespace linearize::ops {

OpResult gla_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& g, const torch::Tensor& h0, double scale, int64_t chunk) {
  using detail::GateKind;
  detail::check_qkv(q, k, v, "gla_chunk");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const auto kind = detail::gate_kind(g, B, T, H, K, "gla_chunk");
  if (auto fused = detail::fused_scalar_decay_chunk(q, k, v, g, kind, h0, scale, chunk)) return *fused;
  if (auto fused = detail::fused_vector_decay_chunk(q, k, v, g, kind, h0, scale, chunk)) return *fused;
  const auto dt = detail::compute_dtype(v), op_dt = detail::operand_dtype(v);
  const int64_t C = chunk, Tp = detail::round_up(T, C), N = Tp / C;

  auto chunked = [&](const torch::Tensor& x) {  // [B,T,H,D] -> [B,H,N,C,D]
    return detail::pad_dim(detail::to_heads_first(x, op_dt), 2, Tp, 0.0).reshape({B, H, N, C, x.size(3)});
  };
  auto Q = chunked(q), Kc = chunked(k), Vc = chunked(v);

  torch::Tensor G;  // chunk-local cumulative log decay: [B,H,N,C] or [B,H,N,C,K]
  if (kind != GateKind::None) {
    auto gh = detail::pad_dim(detail::gate_heads_first(g, kind, B, T, dt), 2, Tp, 0.0);
    G = (kind == GateKind::Vector ? gh.reshape({B, H, N, C, K}) : gh.reshape({B, H, N, C})).cumsum(3);
  }

  auto A = detail::gated_scores(Q, Kc, G, /*strict=*/false) * scale;  // [B,H,N,C,C]

  torch::Tensor Qg = Q * scale, Kd = Kc, D;  // D: per-chunk decay of the state
  if (kind == GateKind::Vector) {
    auto Glast = G.select(3, C - 1).unsqueeze(3);  // [B,H,N,1,K]
    Qg = Qg * G.exp();
    Kd = Kc * (Glast - G).exp();
    D = Glast.squeeze(3).exp().unsqueeze(-1);  // [B,H,N,K,1]
  } else if (kind != GateKind::None) {
    auto Glast = G.select(3, C - 1).unsqueeze(3);  // [B,H,N,1]
    Qg = Qg * G.exp().unsqueeze(-1);
    Kd = Kc * (Glast - G).exp().unsqueeze(-1);
    D = Glast.exp().unsqueeze(-1);  // [B,H,N,1,1]
  }
  auto S0 = h0.defined() ? h0.to(dt) : torch::zeros({B, H, K, V}, v.options().dtype(dt));  // [B,H,K,V]
  auto pass = detail::state_pass({}, Vc, Kd.transpose(-1, -2), D, S0);
  auto Sn = pass.states;  // [B,H,N,K,V]: S^(n), the state entering chunk n
  auto S = pass.final_state;
  auto O = detail::product(Qg, Sn) + detail::product(A, Vc);  // [B,H,N,C,V]
  auto o = O.reshape({B, H, Tp, V}).narrow(2, 0, T).transpose(1, 2).to(v.scalar_type());  // [B,T,H,V]
  return {o, S};
}

}  // namespace linearize::ops
