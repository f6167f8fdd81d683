// The mLSTM, chunked form (docs/design.md, "Chunked mLSTM"): the stabilised mLSTM in chunks of C; reproduces the
// recurrence exactly, including the max state m.
//
// Per chunk, with b_r = Σ_{r' <= r} log f (chunk-local, fp32), i = input gate pre-activation and
// (C, n, m) the state entering the chunk:
//   logD[r,j] = b_r - b_j + i_j (j <= r);  M_r = max(b_r + m, max_j logD[r,j])
//   num_r = e^{b_r + m - M_r} q^_r^T C + Σ_j (q^_r . k_j) e^{logD[r,j] - M_r} v_j
//   den_r = e^{b_r + m - M_r} q^_r^T n + Σ_j (q^_r . k_j) e^{logD[r,j] - M_r}
//   h_r   = num_r / (max(|den_r|, e^{-M_r}) + eps)
//   a_j = b_last - b_j + i_j,  m' = max(b_last + m, max_j a_j)
//   C' = e^{b_last + m - m'} C + Σ_j e^{a_j - m'} k_j v_j^T   (n' likewise with v = 1)
// The intra-chunk sums are batched over all chunks, taken relative to max_j a_j. The max state m
// depends only on the gates, so it comes first (a loop over per-head scalars); then C and n are one
// decayed scan over chunks (detail::state_pass, the GLA family: one CUDA kernel each way on the GPU).
// Padding: igate = -inf, log f = 0 (fgate = +inf), zero q, k, v.
//
// Shapes: q, k [B,T,H,K]; v [B,T,H,V]; igate, fgate [B,T,H]; inside [B,H,N,C,D]; state c [B,H,K,V],
// n [B,H,K], m [B,H]. Autograd flows through (including max and abs in the normaliser).
#include <limits>
#include <vector>

#include "io/error.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/mlstm/mlstm.h"
#include "ops/ops.h"

namespace linearize::ops {

namespace {

// The gate quantities of the chunked form, in the compute dtype, over N chunks of C (padded):
struct ChunkGates {
  torch::Tensor ig, lf;      // input gate pre-activation, log forget gate [B,H,N,C]
  torch::Tensor b, b_last;   // chunk-local cumulative log f [B,H,N,C], its last entry [B,H,N]
  torch::Tensor logD;        // b_r - b_j + i_j for j <= r, -inf above [B,H,N,C,C]
  torch::Tensor m_intra;     // max_j logD[r, j] [B,H,N,C]
  torch::Tensor a_max;       // max_j (b_last - b_j + i_j) [B,H,N]
  torch::Tensor m_all;       // max state entering each chunk, then the final one [B,H,N+1]
};

ChunkGates chunk_gates(const torch::Tensor& igate, const torch::Tensor& fgate, const torch::Tensor& m0, int64_t B,
                       int64_t H, int64_t C, int64_t Tp, torch::ScalarType dt) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t N = Tp / C;
  ChunkGates g;
  g.ig = detail::pad_dim(igate.to(dt).transpose(1, 2), 2, Tp, -inf).reshape({B, H, N, C});
  g.lf = detail::pad_dim(torch::log_sigmoid(fgate.to(dt)).transpose(1, 2), 2, Tp, 0.0).reshape({B, H, N, C});
  g.b = g.lf.cumsum(-1);
  g.b_last = g.b.select(-1, C - 1);
  auto mask = detail::causal_mask(C, /*strict=*/false, igate.device());
  g.logD = (g.b.unsqueeze(-1) - g.b.unsqueeze(-2) + g.ig.unsqueeze(-2)).masked_fill(~mask, -inf);
  g.m_intra = std::get<0>(g.logD.max(-1));
  g.a_max = std::get<0>((g.b_last.unsqueeze(-1) - g.b + g.ig).max(-1));
  // The max state depends on the gates only (a loop over [B,H] scalars per chunk).
  std::vector<torch::Tensor> ms;
  ms.reserve(N + 1);
  ms.push_back(m0);
  const auto bls = g.b_last.unbind(2), ams = g.a_max.unbind(2);  // N x [B,H]
  for (int64_t j = 0; j < N; ++j) ms.push_back(torch::maximum(bls[j] + ms.back(), ams[j]));
  g.m_all = torch::stack(ms, 2);
  return g;
}

}  // namespace

MlstmResult mlstm_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                        double scale, double eps, int64_t chunk) {
  detail::check_qkv(q, k, v, "mlstm_chunk");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  for (const auto* gate : {&igate, &fgate})
    if (!gate->defined() || gate->dim() != 3 || gate->size(0) != B || gate->size(1) != T ||
        gate->size(2) != H)
      throw Error("mlstm_chunk: expected igate and fgate [B,T,H] = [" + std::to_string(B) + ", " +
                  std::to_string(T) + ", " + std::to_string(H) + "]");
  // On CUDA in bf16/fp16 (or under autocast) with head size 64 or 128: the same math through the fused
  // kernels of the GLA family, the normaliser in fp32 (mlstm/fused_chunk.cpp).
  if (auto fused = detail::fused_mlstm_chunk(q, k, v, igate, fgate, init, scale, eps, chunk)) return *fused;
  const auto dt = detail::compute_dtype(v), op_dt = detail::operand_dtype(v);
  const auto opts = v.options().dtype(dt);
  const int64_t C = chunk, Tp = detail::round_up(T, C), N = Tp / C;

  auto c = init.defined() ? init.c.to(dt) : torch::zeros({B, H, K, V}, opts);  // [B,H,K,V]
  auto n = init.defined() ? init.n.to(dt) : torch::zeros({B, H, K}, opts);     // [B,H,K]
  auto m = init.defined() ? init.m.to(dt) : torch::zeros({B, H}, opts);        // [B,H]
  const auto gates = chunk_gates(igate, fgate, m, B, H, C, Tp, dt);

  auto chunked = [&](const torch::Tensor& x) {  // [B,T,H,D] -> [B,H,N,C,D]
    return detail::pad_dim(detail::to_heads_first(x, op_dt), 2, Tp, 0.0).reshape({B, H, N, C, x.size(3)});
  };
  auto Q = chunked(q) * scale, Kc = chunked(k), Vc = chunked(v);
  const auto &b = gates.b, &b_last = gates.b_last, &logD = gates.logD, &a_max = gates.a_max;

  // Per-chunk state contributions relative to their own maximum a_max.
  auto a = b_last.unsqueeze(-1) - b + gates.ig;                  // [B,H,N,C]
  auto Kw = Kc * (a - a_max.unsqueeze(-1)).exp().unsqueeze(-1);  // [B,H,N,C,K]

  auto mn = gates.m_all.narrow(2, 0, N), m_next = gates.m_all.narrow(2, 1, N);  // [B,H,N]
  auto decay = (b_last + mn - m_next).exp();              // [B,H,N]
  auto w = (a_max - m_next).exp();                        // [B,H,N]

  // Then (C, n) together as one decayed scan over [K, V+1] (the last column carries n):
  //   [C n]^(j+1) = decay_j [C n]^(j) + (w_j Kw_j)^T [V_j 1]
  auto U = torch::cat({Vc, torch::ones({B, H, N, C, 1}, opts)}, -1);   // [B,H,N,C,V+1]
  auto KdT = (Kw * w.unsqueeze(-1).unsqueeze(-1)).transpose(-1, -2);  // [B,H,N,K,C]
  auto S0 = torch::cat({c, n.unsqueeze(-1)}, -1);                     // [B,H,K,V+1]
  auto pass = detail::state_pass({}, U, KdT, decay.unsqueeze(-1).unsqueeze(-1), S0);
  auto Cn = pass.states.narrow(-1, 0, V);                 // [B,H,N,K,V]: C entering chunk j
  auto Nn = pass.states.select(-1, V);                    // [B,H,N,K]
  c = pass.final_state.narrow(-1, 0, V);
  n = pass.final_state.select(-1, V);
  m = gates.m_all.select(2, N);

  auto m_inter = b + mn.unsqueeze(-1);                   // [B,H,N,C]
  auto M = torch::maximum(m_inter, gates.m_intra);       // [B,H,N,C]
  auto inter_w = (m_inter - M).exp();                    // [B,H,N,C]
  auto P = detail::product(Q, Kc.transpose(-1, -2)) * (logD - M.unsqueeze(-1)).exp();  // [B,H,N,C,C]
  auto num = inter_w.unsqueeze(-1) * detail::product(Q, Cn) + detail::product(P, Vc);     // [B,H,N,C,V]
  auto den = inter_w * Q.to(dt).matmul(Nn.unsqueeze(-1)).squeeze(-1) + P.sum(-1);        // [B,H,N,C]
  auto hc = num / (torch::maximum(den.abs(), (-M).exp()) + eps).unsqueeze(-1);  // [B,H,N,C,V]
  auto h = hc.reshape({B, H, Tp, V}).narrow(2, 0, T).transpose(1, 2).to(v.scalar_type());  // [B,T,H,V]
  return {h, {c, n, m}};
}

}  // namespace linearize::ops
