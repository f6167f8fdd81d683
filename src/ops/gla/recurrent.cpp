// The GLA family, recurrent form: gated linear attention one token at a time (the reference and the decode
// path).
//
//   S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T,   o_t = S_t^T (scale * q_t)
//
// q, k [B,T,H,K]; v [B,T,H,V]; g undefined (no decay), [H] (fixed per head), [B,T,H] (scalar) or
// [B,T,H,K] (per key channel); state [B,H,K,V]. Runs in fp32 (fp64 for fp64 inputs); the state comes
// back in that dtype, o in v's dtype. A T=1 call does a handful of [B,H,K,V] ops and nothing else.
#include "io/error.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

namespace linearize::ops {

namespace {

// Grouped KV heads: k, v (and a scalar or per-channel g) with Hkv < H heads, H a multiple of Hkv. Returns
// H / Hkv, or 1 when k has q's heads (or the shapes are for check_qkv to refuse).
int64_t kv_groups(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& g) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.size(2) == q.size(2)) return 1;
  const int64_t H = q.size(2), Hkv = k.size(2);
  const bool heads_ok = Hkv > 0 && H % Hkv == 0 && v.size(2) == Hkv;
  const bool gate_ok = !g.defined() || g.dim() == 1 || (g.dim() >= 3 && g.size(2) == Hkv);
  if (!heads_ok || !gate_ok || k.size(0) != q.size(0) || k.size(1) != q.size(1) || k.size(3) != q.size(3))
    throw Error("gla_recurrent: grouped KV heads need k [B,T,Hkv,K], v [B,T,Hkv,V] and g undefined, [H], [B,T,Hkv] "
                "or [B,T,Hkv,K] with H a multiple of Hkv; got q " + detail::shape_of(q) + ", k " +
                detail::shape_of(k) + ", v " + detail::shape_of(v) + ", g " + detail::shape_of(g));
  return H / Hkv;
}

}  // namespace

OpResult gla_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& g, const torch::Tensor& h0, double scale, bool in_place,
                       double gate_logits) {
  if (gate_logits > 0) {
    // The fused step reads the logits as they are; otherwise the log decay first, as the layers compute it.
    if (!g.defined() || g.dim() != 4)
      throw Error("gla_recurrent: gate logits need g [B,T,H,K] or [B,T,Hkv,K]; got " + detail::shape_of(g));
    if (q.dim() == 4 && q.size(1) == 1) {
      const int64_t groups = kv_groups(q, k, v, g);
      const auto kind = detail::gate_kind(g, q.size(0), 1, k.size(2), q.size(3), "gla_recurrent");
      if (auto fused = detail::fused_decode_step(q, k, v, {}, g, kind, h0, scale, groups, in_place, gate_logits))
        return *fused;
    }
    return gla_recurrent(q, k, v, torch::log_sigmoid(g.to(torch::kFloat)) / gate_logits, h0, scale, in_place);
  }
  if (const int64_t groups = kv_groups(q, k, v, g); groups > 1) {
    // One launch reading the shared heads where the fused step applies; else spread them over the query
    // heads (as repeat_heads does: KV head j serves heads j*G .. j*G+G-1) and take the form below.
    const int64_t B = q.size(0), T = q.size(1), Hkv = k.size(2), K = q.size(3);
    const auto kind = detail::gate_kind(g, B, T, g.defined() && g.dim() == 1 ? q.size(2) : Hkv, K, "gla_recurrent");
    if (auto fused = detail::fused_decode_step(q, k, v, {}, g, kind, h0, scale, groups, in_place)) return *fused;
    auto spread = [&](const torch::Tensor& x) { return x.repeat_interleave(groups, 2); };
    const bool grouped_gate = kind == detail::GateKind::Scalar || kind == detail::GateKind::Vector;
    return gla_recurrent(q, spread(k), spread(v), grouped_gate ? spread(g) : g, h0, scale, in_place);
  }
  detail::check_qkv(q, k, v, "gla_recurrent");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const auto kind = detail::gate_kind(g, B, T, H, K, "gla_recurrent");
  if (auto fused = detail::fused_decode_step(q, k, v, {}, g, kind, h0, scale, 1, in_place)) return *fused;  // one launch
  const auto dt = detail::compute_dtype(v);

  auto S = h0.defined() ? h0.to(dt) : torch::zeros({B, H, K, V}, v.options().dtype(dt));  // [B,H,K,V]
  auto qf = q.to(dt), kf = k.to(dt), vf = v.to(dt);
  torch::Tensor gf = g.defined() ? g.to(dt) : torch::Tensor();

  std::vector<torch::Tensor> outs;
  outs.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    auto kt = kf.select(1, t), vt = vf.select(1, t), qt = qf.select(1, t);  // [B,H,K], [B,H,V]
    S = detail::decay_state(S, gf, kind, t);
    S = S + kt.unsqueeze(-1) * vt.unsqueeze(-2);
    outs.push_back(qt.unsqueeze(-2).matmul(S).squeeze(-2) * scale);  // [B,H,V]
  }
  auto o = torch::stack(outs, 1).to(v.scalar_type());  // [B,T,H,V]
  return {o, detail::returned_state(h0, S, in_place)};
}

}  // namespace linearize::ops
