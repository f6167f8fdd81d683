// Family C, chunked form (spec §8.C): the stabilised mLSTM in chunks of C; reproduces the recurrence
// exactly, including the max state m.
//
// Per chunk, with b_r = Σ_{r' <= r} log f (chunk-local, fp32), i = input gate pre-activation and
// (C, n, m) the state entering the chunk:
//   logD[r,j] = b_r - b_j + i_j (j <= r);  M_r = max(b_r + m, max_j logD[r,j])
//   num_r = e^{b_r + m - M_r} q^_r^T C + Σ_j (q^_r . k_j) e^{logD[r,j] - M_r} v_j
//   den_r = e^{b_r + m - M_r} q^_r^T n + Σ_j (q^_r . k_j) e^{logD[r,j] - M_r}
//   h_r   = num_r / (max(|den_r|, e^{-M_r}) + eps)
//   a_j = b_last - b_j + i_j,  m' = max(b_last + m, max_j a_j)
//   C' = e^{b_last + m - m'} C + Σ_j e^{a_j - m'} k_j v_j^T   (n' likewise with v = 1)
// The intra-chunk sums are batched over all chunks, taken relative to max_j a_j; the loop over chunks
// only rescales and adds. Padding: igate = -inf, log f = 0 (fgate = +inf), zero q, k, v.
//
// Shapes: q, k [B,T,H,K]; v [B,T,H,V]; igate, fgate [B,T,H]; inside [B,H,N,C,D]; state c [B,H,K,V],
// n [B,H,K], m [B,H]. Autograd flows through (including max and abs in the normaliser).
#include <limits>

#include "io/error.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops {

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
  const auto dt = detail::compute_dtype(v);
  const auto opts = v.options().dtype(dt);
  const int64_t C = chunk, Tp = detail::round_up(T, C), N = Tp / C;
  const double inf = std::numeric_limits<double>::infinity();

  auto chunked = [&](const torch::Tensor& x) {  // [B,T,H,D] -> [B,H,N,C,D]
    return detail::pad_dim(detail::to_heads_first(x, dt), 2, Tp, 0.0).reshape({B, H, N, C, x.size(3)});
  };
  auto Q = chunked(q) * scale, Kc = chunked(k), Vc = chunked(v);
  auto ig = detail::pad_dim(igate.to(dt).transpose(1, 2), 2, Tp, -inf).reshape({B, H, N, C});  // [B,H,N,C]
  auto lf = detail::pad_dim(torch::log_sigmoid(fgate.to(dt)).transpose(1, 2), 2, Tp, 0.0)
                .reshape({B, H, N, C});  // [B,H,N,C]
  auto b = lf.cumsum(-1);                // [B,H,N,C]
  auto b_last = b.select(-1, C - 1);     // [B,H,N]

  // Intra-chunk log weights and their row maxima.
  auto mask = detail::causal_mask(C, /*strict=*/false, Q.device());
  auto logD = (b.unsqueeze(-1) - b.unsqueeze(-2) + ig.unsqueeze(-2)).masked_fill(~mask, -inf);  // [B,H,N,C,C]
  auto m_intra = std::get<0>(logD.max(-1));  // [B,H,N,C]

  // Per-chunk state contributions relative to their own maximum a_max.
  auto a = b_last.unsqueeze(-1) - b + ig;                    // [B,H,N,C]
  auto a_max = std::get<0>(a.max(-1));                       // [B,H,N]
  auto Kw = Kc * (a - a_max.unsqueeze(-1)).exp().unsqueeze(-1);  // [B,H,N,C,K]
  auto dC = Kw.transpose(-1, -2).matmul(Vc);                 // [B,H,N,K,V]
  auto dn = Kw.sum(-2);                                      // [B,H,N,K]

  auto c = init.defined() ? init.c.to(dt) : torch::zeros({B, H, K, V}, opts);  // [B,H,K,V]
  auto n = init.defined() ? init.n.to(dt) : torch::zeros({B, H, K}, opts);     // [B,H,K]
  auto m = init.defined() ? init.m.to(dt) : torch::zeros({B, H}, opts);        // [B,H]
  std::vector<torch::Tensor> cs, ns, ms;  // state entering chunk n
  cs.reserve(N);
  ns.reserve(N);
  ms.reserve(N);
  for (int64_t j = 0; j < N; ++j) {
    cs.push_back(c);
    ns.push_back(n);
    ms.push_back(m);
    auto bl = b_last.select(2, j), am = a_max.select(2, j);  // [B,H]
    auto m_new = torch::maximum(bl + m, am);
    auto decay = (bl + m - m_new).exp(), w = (am - m_new).exp();  // [B,H]
    c = decay.view({B, H, 1, 1}) * c + w.view({B, H, 1, 1}) * dC.select(2, j);
    n = decay.unsqueeze(-1) * n + w.unsqueeze(-1) * dn.select(2, j);
    m = m_new;
  }
  auto Cn = torch::stack(cs, 2);  // [B,H,N,K,V]
  auto Nn = torch::stack(ns, 2);  // [B,H,N,K]
  auto mn = torch::stack(ms, 2);  // [B,H,N]

  auto m_inter = b + mn.unsqueeze(-1);                   // [B,H,N,C]
  auto M = torch::maximum(m_inter, m_intra);             // [B,H,N,C]
  auto inter_w = (m_inter - M).exp();                    // [B,H,N,C]
  auto P = Q.matmul(Kc.transpose(-1, -2)) * (logD - M.unsqueeze(-1)).exp();  // [B,H,N,C,C]
  auto num = inter_w.unsqueeze(-1) * Q.matmul(Cn) + P.matmul(Vc);             // [B,H,N,C,V]
  auto den = inter_w * Q.matmul(Nn.unsqueeze(-1)).squeeze(-1) + P.sum(-1);    // [B,H,N,C]
  auto hc = num / (torch::maximum(den.abs(), (-M).exp()) + eps).unsqueeze(-1);  // [B,H,N,C,V]
  auto h = hc.reshape({B, H, Tp, V}).narrow(2, 0, T).transpose(1, 2).to(v.scalar_type());  // [B,T,H,V]
  return {h, {c, n, m}};
}

}  // namespace linearize::ops
