// The delta rule with a decay per key channel (Kimi Delta Attention) through fused CUDA kernels, head sizes of
// 64 and 128 (see common.h, detail::fused_vector_delta_rule_chunk). The chunked form of chunk.cpp as three
// kernels each way:
//   Aqk, qd = scale e^G ⊙ q, kd = e^{Gl - G} ⊙ k, a = e^{Gl}   GLA's scores kernel, q against k, which
//   Akk, e^G ⊙ k                                               also gives the keys' own scores (scale 1)
//   [W U] = (I + L)^{-1} diag(beta) [e^G ⊙ k, v],  L = strictly lower diag(beta) Akk
//                                                             (ut_transform.cu, given the scores)
//   o, S_T = the walk from qd, kd, W, U, Aqk and a             (chunk_vector_decay.cu, the delta rule)
// Autograd joins the parts: the walk's dW and dU go back through the transform to Akk, beta, e^G ⊙ k
// and v, and the scores kernel's backward takes both scores' gradients (and those of the row factors)
// back to q, k and g in one pass.
// The scores kernels take K = 64 m key channels (64 at a time, their scores summed in the kernel); the UT
// kernels 64 channels, the walk 64 or 128 key channels and 64 value columns. So K = 64 m (m = 1 or 2) and
// V = 64 n run (vector_delta_rule below) as: the UT transform per 64-channel part, on heads (head, part) that
// read their head's keys' scores in place (the rows of W and U are the key and value parts of one inverse
// applied to diag(beta) [e^G ⊙ k, v]), storing W's key parts side by side in the walk's rows and U by value
// part; and the walk with all K key channels (the delta rule's correction W S needs them at once) on each
// part of 64 value columns as a head of its own (the state's columns never mix). At K = V = 64 there is one
// part of each. DeltaNet and Gated DeltaNet at head sizes other than 64 take this path too, their decay
// (none, or one per step) given to every key channel.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

#include "ops/cuda/chunk_vector_decay.h"
#include "ops/cuda/placeholder.h"
#include "ops/cuda/ut_transform.h"

namespace linearize::ops::detail {

namespace {

using cuda_kernels::present;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// qd, kd, w [B,Hk,N*64,K] (K = 64 or 128), u [B,H,N*64,64] with H a multiple of Hk (the value parts of a key
// head) and A [B,Hk,N,64,64] (one 16-bit dtype), a [B,Hk,N,K] fp32, h0 [B,H,K,64] fp32 or empty, T the sequence
// length -> o [B,T,H,64], the final state.
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
                                    : torch::zeros({B, T, H, u.size(3)}, qd.options());
    auto d_final = grads[1].defined() ? aligned_rows(grads[1].to(torch::kFloat)) : torch::Tensor();
    auto r = cuda_kernels::vector_delta_walk_backward(qd, kd, w, u, A, a, ctx->saved_data["states"].toTensor(), d_out,
                                                      d_final, h0.defined());
    return {r.dqd, r.dkd, r.dw, r.dv, r.dA, r.da, h0.defined() ? r.d_initial : torch::Tensor(), torch::Tensor()};
  }
};

// Akk [B,Hk,N,64,64] and ek = e^G ⊙ k by part [B,H,N*64,64] from the scores kernel, v [B,T,H,64] (one 16-bit
// dtype), beta [B,H,T] fp32, with H = p Hk UT heads (the parts of each key head) -> W [B,Hk,N*64,64 w_parts]
// and U [B,Hk u_parts,N*64,64] (cuda_kernels::ut_transform_given_forward).
struct UtGivenFunction : public torch::autograd::Function<UtGivenFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& Akk, const torch::Tensor& ek,
                               const torch::Tensor& v, const torch::Tensor& beta, int64_t w_parts, int64_t u_parts) {
    auto r = cuda_kernels::ut_transform_given_forward(Akk, ek, v, beta, w_parts, u_parts);
    ctx->save_for_backward({Akk, ek, v, beta});
    ctx->saved_data["inverse"] = r.inverse;
    ctx->saved_data["w_parts"] = w_parts;
    ctx->saved_data["u_parts"] = u_parts;
    return {r.w, r.u};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &Akk = saved[0], &ek = saved[1], &v = saved[2], &beta = saved[3];
    const int64_t w_parts = ctx->saved_data["w_parts"].toInt(), u_parts = ctx->saved_data["u_parts"].toInt();
    const int64_t B = ek.size(0), Hk = Akk.size(1), R = ek.size(2);
    auto as_grad = [&](const torch::Tensor& d, std::vector<int64_t> shape) {  // in ek's dtype
      return d.defined() ? aligned_rows(d.to(ek.scalar_type())) : torch::zeros(shape, ek.options());
    };
    auto r = cuda_kernels::ut_transform_given_backward(
        Akk, ek, v, beta, ctx->saved_data["inverse"].toTensor(), as_grad(grads[0], {B, Hk, R, 64 * w_parts}),
        as_grad(grads[1], {B, Hk * u_parts, R, 64}), w_parts, u_parts);
    return {r.d_scores, r.dk, r.dv, r.dbeta, torch::Tensor(), torch::Tensor()};
  }
};

constexpr int64_t kHead = 64;  // the kernels' parts

// x [B,H,...] -> [B,H parts,...]: x for each of `parts` heads (head, part) in a row (x itself when parts is 1).
torch::Tensor for_each_part(const torch::Tensor& x, int64_t parts) {
  if (parts == 1) return x;
  auto shape = x.sizes().vec(), spread = shape;
  spread.insert(spread.begin() + 2, parts);
  shape[1] *= parts;
  return x.unsqueeze(2).expand(spread).reshape(shape);
}

// The gate as a decay per key channel [B,T,H,K] fp32: no decay is a log decay of 0 on every channel, a fixed
// [H] or scalar [B,T,H] one the same decay on every channel.
torch::Tensor gate_per_channel(const torch::Tensor& g, GateKind kind, const torch::Tensor& q) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  switch (kind) {
    case GateKind::None: return torch::zeros({B, T, H, K}, q.options().dtype(torch::kFloat));
    case GateKind::Fixed: return g.to(torch::kFloat).view({1, 1, H, 1}).expand({B, T, H, K});
    case GateKind::Scalar: return g.to(torch::kFloat).unsqueeze(-1).expand({B, T, H, K});
    case GateKind::Vector: return g;
  }
  return g;
}

// The chunked form with K = 64 m key channels (m = 1 or 2) and V = 64 n value columns (see the top), in dt.
// The UT transform runs on heads (head, j) for j < p = max(m, n), each with its head's keys' scores, key part
// min(j, m - 1) and value part min(j, n - 1); W is stored from the first m of them and U from the first n.
OpResult vector_delta_rule(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0, double scale,
                           torch::ScalarType dt) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const int64_t m = K / kHead, n = V / kHead, p = std::max(m, n);
  auto s = fused_vector_scores(q, k, g, dt, scale, /*key_scores=*/true);
  const int64_t rows = s.qd.size(2);
  auto first_parts = [&](const torch::Tensor& x, int64_t dim) {  // part j -> part min(j, parts - 1), j < p
    const int64_t parts = x.size(dim);
    if (parts == p) return x;
    std::vector<int64_t> index(p);
    for (int64_t j = 0; j < p; ++j) index[j] = std::min(j, parts - 1);
    return x.index_select(dim, torch::tensor(index, torch::TensorOptions().dtype(torch::kLong)).to(x.device()));
  };
  auto ek = first_parts(s.ek.view({B, H, m, rows, kHead}), 2).reshape({B, H * p, rows, kHead});
  auto vp = first_parts(v.to(dt).reshape({B, T, H, n, kHead}), 3).reshape({B, T, H * p, kHead});
  auto bt = beta.to(torch::kFloat).transpose(1, 2);  // [B,H,T]
  // W [B,H,rows,K] (the m key parts side by side), U [B,H n,rows,64] (head, value part).
  auto WU = UtGivenFunction::apply(s.Akk, aligned_rows(ek), aligned_rows(vp), aligned_rows(for_each_part(bt, p)), m,
                                   n);
  const auto &W = WU[0], &U = WU[1];

  // The walk on heads (head, value part), each with every key channel (its head's).
  torch::Tensor h0s;  // [B,H,K,V] -> [B,H n,K,64]
  if (h0.defined())
    h0s = h0.to(torch::kFloat).reshape({B, H, K, n, kHead}).permute({0, 1, 3, 2, 4}).reshape({B, H * n, K, kHead});
  auto out = VectorDeltaWalkFunction::apply(s.qd, s.kd, W, U, s.A, s.a, kernel_state(h0s, q.options()), T);
  auto state = out[1].view({B, H, n, K, kHead}).permute({0, 1, 3, 2, 4}).reshape({B, H, K, V});
  return OpResult{out[0].reshape({B, T, H, V}).to(v.scalar_type()), state};
}

}  // namespace

std::optional<OpResult> fused_vector_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const torch::Tensor& beta,
                                                      const torch::Tensor& g, GateKind kind, const torch::Tensor& h0,
                                                      double scale, int64_t chunk) {
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), V = v.size(3);
  // No decay or one per step at K = V = 64: the scalar-decay kernels (fused_chunk.cpp), which are faster.
  if (kind != GateKind::Vector && K == kHead && V == kHead) return std::nullopt;
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  if (!dt || !cuda_kernels::vector_decay_chunk_supported(kHead, kHead, *dt)) return std::nullopt;
  if (K % kHead != 0 || V % kHead != 0 || !cuda_kernels::vector_walk_supported(K, *dt)) return std::nullopt;
  if (B * H * std::max(K, V) / kHead > 65535) return std::nullopt;  // the scores and UT kernels' grid rows
  return vector_delta_rule(q, k, v, beta, gate_per_channel(g, kind, q), h0, scale, *dt);
}

}  // namespace linearize::ops::detail
