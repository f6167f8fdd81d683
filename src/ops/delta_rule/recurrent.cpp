// The delta rule, recurrent form: the gated delta rule one token at a time (the reference and the decode
// path).
//
//   S'  = Diag(exp(g_t)) S_{t-1}             (decay first; no decay when g is undefined)
//   u_t = beta_t (v_t - S'^T k_t)            (write vector: beta times the prediction error)
//   S_t = S' + k_t u_t^T,    o_t = S_t^T (scale * q_t)
//
// q, k [B,T,H,K] (used as given: layers L2-normalise them); v [B,T,H,V]; beta [B,T,H]; g undefined,
// [H], [B,T,H] or [B,T,H,K]; state [B,H,K,V]. Runs in fp32 (fp64 for fp64 inputs); the state comes
// back in that dtype, o in v's dtype.
#include "io/error.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/ops.h"

namespace linearize::ops {

OpResult delta_rule_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                              double scale, bool in_place) {
  detail::check_qkv(q, k, v, "delta_rule_recurrent");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (!beta.defined() || beta.dim() != 3 || beta.size(0) != B || beta.size(1) != T || beta.size(2) != H)
    throw Error("delta_rule_recurrent: expected beta [B,T,H] = [" + std::to_string(B) + ", " +
                std::to_string(T) + ", " + std::to_string(H) + "]");
  const auto kind = detail::gate_kind(g, B, T, H, K, "delta_rule_recurrent");
  if (auto fused = detail::fused_decode_step(q, k, v, beta, g, kind, h0, scale, 1, in_place)) return *fused;  // one launch
  const auto dt = detail::compute_dtype(v);

  auto S = h0.defined() ? h0.to(dt) : torch::zeros({B, H, K, V}, v.options().dtype(dt));  // [B,H,K,V]
  auto qf = q.to(dt), kf = k.to(dt), vf = v.to(dt), bf = beta.to(dt);
  torch::Tensor gf = g.defined() ? g.to(dt) : torch::Tensor();

  std::vector<torch::Tensor> outs;
  outs.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    auto kt = kf.select(1, t), vt = vf.select(1, t), qt = qf.select(1, t);  // [B,H,K], [B,H,V]
    S = detail::decay_state(S, gf, kind, t);
    auto pred = kt.unsqueeze(-2).matmul(S).squeeze(-2);       // [B,H,V]  S'^T k_t
    auto u = bf.select(1, t).unsqueeze(-1) * (vt - pred);     // [B,H,V]
    S = S + kt.unsqueeze(-1) * u.unsqueeze(-2);
    outs.push_back(qt.unsqueeze(-2).matmul(S).squeeze(-2) * scale);  // [B,H,V]
  }
  auto o = torch::stack(outs, 1).to(v.scalar_type());  // [B,T,H,V]
  return {o, detail::returned_state(h0, S, in_place)};
}

torch::Tensor delta_rule_beta(const torch::Tensor& logits, double beta_scale) {
  auto beta = torch::sigmoid(logits.to(torch::kFloat));
  return beta_scale == 1 ? beta : beta * beta_scale;
}

OpResult delta_rule_decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& beta_logits, double beta_scale, const torch::Tensor& g,
                           const torch::Tensor& h0, double scale, bool in_place, double l2_eps) {
  detail::check_qkv(q, k, v, "delta_rule_decode");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  if (T != 1) throw Error("delta_rule_decode: one step at a time, got T = " + std::to_string(T));
  if (!beta_logits.defined() || beta_logits.dim() != 3 || beta_logits.size(0) != B || beta_logits.size(1) != 1 ||
      beta_logits.size(2) != H)
    throw Error("delta_rule_decode: expected beta logits [B,1,H] = [" + std::to_string(B) + ", 1, " +
                std::to_string(H) + "]");
  if (!(beta_scale > 0) || !(l2_eps > 0)) throw Error("delta_rule_decode: beta_scale and l2_eps must be positive");
  const auto kind = detail::gate_kind(g, B, T, H, K, "delta_rule_decode");
  if (auto fused = detail::fused_decode_step(q, k, v, beta_logits, g, kind, h0, scale, 1, in_place, 0, beta_scale,
                                             l2_eps))
    return *fused;
  return delta_rule_recurrent(l2_norm(q, l2_eps), l2_norm(k, l2_eps), v, delta_rule_beta(beta_logits, beta_scale), g,
                              h0, scale, in_place);
}

}  // namespace linearize::ops
