// The mLSTM, recurrent form: the stabilised mLSTM cell one token at a time (docs/design.md, "mLSTM"; the reference and
// the decode path).
//
//   log f_t = logsigmoid(fgate_t),   m_t = max(log f_t + m_{t-1}, igate_t)
//   f'_t = exp(log f_t + m_{t-1} - m_t),   i'_t = exp(igate_t - m_t)
//   C_t = f'_t C_{t-1} + i'_t k_t v_t^T,   n_t = f'_t n_{t-1} + i'_t k_t
//   h_t = C_t^T q^_t / (max(|n_t . q^_t|, exp(-m_t)) + eps),   q^ = scale * q
//
// q, k [B,T,H,K]; v [B,T,H,V]; igate, fgate [B,T,H] pre-activations; state c [B,H,K,V], n [B,H,K],
// m [B,H], zeros when undefined (m_0 = 0 takes part in the running max). fp32 (fp64 for fp64 inputs).
#include "io/error.h"
#include "ops/common.h"
#include "ops/mlstm/mlstm.h"
#include "ops/ops.h"

namespace linearize::ops {

MlstmResult mlstm_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                            double scale, double eps) {
  detail::check_qkv(q, k, v, "mlstm_recurrent");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  for (const auto* gate : {&igate, &fgate})
    if (!gate->defined() || gate->dim() != 3 || gate->size(0) != B || gate->size(1) != T ||
        gate->size(2) != H)
      throw Error("mlstm_recurrent: expected igate and fgate [B,T,H] = [" + std::to_string(B) + ", " +
                  std::to_string(T) + ", " + std::to_string(H) + "]");
  const auto dt = detail::compute_dtype(v);
  const auto opts = v.options().dtype(dt);

  auto c = init.defined() ? init.c.to(dt) : torch::zeros({B, H, K, V}, opts);  // [B,H,K,V]
  auto n = init.defined() ? init.n.to(dt) : torch::zeros({B, H, K}, opts);     // [B,H,K]
  auto m = init.defined() ? init.m.to(dt) : torch::zeros({B, H}, opts);        // [B,H]
  auto qf = q.to(dt) * scale, kf = k.to(dt), vf = v.to(dt);
  auto logf = torch::log_sigmoid(fgate.to(dt));  // [B,T,H]
  auto ig = igate.to(dt);                        // [B,T,H]

  std::vector<torch::Tensor> outs;
  outs.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    auto kt = kf.select(1, t), vt = vf.select(1, t), qt = qf.select(1, t);  // [B,H,K], [B,H,V]
    auto lf = logf.select(1, t), it = ig.select(1, t);                      // [B,H]
    auto m_new = torch::maximum(lf + m, it);
    auto fp = (lf + m - m_new).exp(), ip = (it - m_new).exp();  // [B,H]
    c = fp.view({B, H, 1, 1}) * c + ip.view({B, H, 1, 1}) * kt.unsqueeze(-1) * vt.unsqueeze(-2);
    n = fp.unsqueeze(-1) * n + ip.unsqueeze(-1) * kt;
    m = m_new;
    auto num = qt.unsqueeze(-2).matmul(c).squeeze(-2);  // [B,H,V]
    auto den = (n * qt).sum(-1);                        // [B,H]
    outs.push_back(num / (torch::maximum(den.abs(), (-m).exp()) + eps).unsqueeze(-1));
  }
  auto h = torch::stack(outs, 1).to(v.scalar_type());  // [B,T,H,V]
  return {h, {c, n, m}};
}

}  // namespace linearize::ops
