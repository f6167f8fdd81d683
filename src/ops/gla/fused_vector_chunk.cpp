// The GLA family with a decay per key channel (GLA) through fused CUDA kernels (see common.h,
// detail::fused_vector_decay_chunk). The chunked form of chunk.cpp in two parts, both reading the
// caller's rows [B,T,H,K] as they are:
//   A, the intra-chunk scores, and the row factors
//   qd = scale e^G ⊙ q,  kd = e^{Gl - G} ⊙ k,  a = e^{Gl}, with G the chunk-local
//   cumulative sum of the log decay g                                          (vector_decay_scores.cu)
//   o, S_T = the walk over the chunks from qd, kd, v, A and a                  (chunk_vector_decay.cu)
// Two autograd functions for the kernels; the scores' backward takes the walk's dqd, dkd and da back to
// q, k and g. Kimi Delta Attention (delta_rule/fused_vector_chunk.cpp) asks the scores function for the
// keys' own scores as well.
// The scores kernels take any K = 64 m (64 channels at a time, a score the sum of its parts'); the walk
// takes 64 or 128 key channels and 64 value columns. The output is a sum over key channels,
//   o_t = Σ_c Σ_{s <= t} q_tc k_sc e^{G_tc - G_sc} v_s,
// and each value column evolves on its own, so GLA with K = 64 m and V = 64 n is the sum over key groups
// (of 128 channels where K allows, of 64 otherwise) of GLAs on the group's channels, each run on the n
// value parts of 64: the scores of the groups as heads of their own (a view of q, k and g), the walk over
// heads (head, key group, value part), each reading its group's scores and factors. At K = 128 there is one
// group, and nothing to sum.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

#include "ops/cuda/chunk_vector_decay.h"
#include "ops/cuda/placeholder.h"
#include "ops/cuda/vector_decay_scores.h"

namespace linearize::ops::detail {

namespace {

constexpr int64_t kHead = 64;  // the kernels' head size

using cuda_kernels::present;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// q, k [B,T,H,K] (K = 64 m, one 16-bit dtype), g the same in fp32 -> A [B,H,N,64,64], qd, kd [B,H,N*64,K]
// (q's dtype) and a [B,H,N,K] fp32; with key_scores also Akk [B,H,N,64,64] and ek by part [B,H m,N*64,64].
struct VectorScoresFunction : public torch::autograd::Function<VectorScoresFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& g, double scale, bool key_scores) {
    ctx->save_for_backward({q, k, g});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["key_scores"] = key_scores;
    auto r = cuda_kernels::vector_scores_forward(q, k, g, scale, key_scores);
    if (key_scores) return {r.A, r.qd, r.kd, r.a, r.Akk, r.ek};
    return {r.A, r.qd, r.kd, r.a};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &g = saved[2];
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), N = (T + 63) / 64, m = K / 64;
    const std::vector<int64_t> square = {B, H, N, 64, 64}, rows = {B, H, N * 64, K}, part_rows = {B, H * m, N * 64, 64};
    auto grad = [&](const torch::Tensor& d, torch::IntArrayRef shape, torch::ScalarType dt) {  // zeros when absent
      return d.defined() ? aligned_rows(d.to(dt)) : torch::zeros(shape, q.options().dtype(dt));
    };
    const auto dt = q.scalar_type();
    torch::Tensor dAkk, dek;
    if (ctx->saved_data["key_scores"].toBool()) dAkk = grad(grads[4], square, dt), dek = grad(grads[5], part_rows, dt);
    auto r = cuda_kernels::vector_scores_backward(q, k, g, grad(grads[0], square, dt), grad(grads[1], rows, dt),
                                                  grad(grads[2], rows, dt), grad(grads[3], {B, H, N, K}, torch::kFloat),
                                                  ctx->saved_data["scale"].toDouble(), dAkk, dek);
    return {r.dq, r.dk, r.dg, torch::Tensor(), torch::Tensor()};
  }
};

// qd, kd [B,Hk,N*64,K] (K = 64 or 128) and v [B,T,H,64] with H a multiple of Hk (the value parts of a key
// head; one 16-bit dtype), A [B,Hk,N,64,64], a [B,Hk,N,K] fp32, h0 [B,H,K,64] fp32 or empty -> o [B,T,H,64],
// the final state.
struct VectorWalkFunction : public torch::autograd::Function<VectorWalkFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qd, const torch::Tensor& kd,
                               const torch::Tensor& v, const torch::Tensor& A, const torch::Tensor& a,
                               const torch::Tensor& h0) {
    auto r = cuda_kernels::vector_walk_forward(qd, kd, v, A, a, present(h0));
    ctx->save_for_backward({qd, kd, v, A, a, h0});
    ctx->saved_data["states"] = r.states;
    return {r.o, r.final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &qd = saved[0], &kd = saved[1], &v = saved[2], &A = saved[3], &a = saved[4];
    const auto h0 = present(saved[5]);
    auto d_out = grads[0].defined() ? aligned_rows(grads[0].to(v.scalar_type())) : torch::zeros_like(v);
    auto d_final = grads[1].defined() ? aligned_rows(grads[1].to(torch::kFloat)) : torch::Tensor();
    auto r = cuda_kernels::vector_walk_backward(qd, kd, v, A, a, ctx->saved_data["states"].toTensor(), d_out,
                                                d_final, h0.defined());
    return {r.dqd, r.dkd, r.dv, r.dA, r.da, h0.defined() ? r.d_initial : torch::Tensor()};
  }
};

}  // namespace

VectorScores fused_vector_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                 torch::ScalarType dt, double scale, bool key_scores) {
  auto s = VectorScoresFunction::apply(aligned_rows(q.to(dt)), aligned_rows(k.to(dt)),
                                       aligned_rows(g.to(torch::kFloat)), scale, key_scores);
  VectorScores out{s[0], s[1], s[2], s[3], {}, {}};
  if (key_scores) out.Akk = s[4], out.ek = s[5];
  return out;
}

std::optional<OpResult> fused_vector_decay_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& g, GateKind kind,
                                                 const torch::Tensor& h0, double scale, int64_t chunk) {
  if (kind != GateKind::Vector) return std::nullopt;
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  if (!dt) return std::nullopt;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (K % kHead != 0 || V % kHead != 0 || !cuda_kernels::vector_decay_chunk_supported(kHead, kHead, *dt))
    return std::nullopt;
  if (B * H * (K / kHead) > 65535) return std::nullopt;  // the scores kernels' grid rows
  // Key groups of 128 channels where K allows, of 64 otherwise, each walked on its n value parts (see the top).
  const int64_t group = K % 128 == 0 && cuda_kernels::vector_walk_supported(128, *dt) ? 128 : kHead;
  const int64_t groups = K / group, n = V / kHead;
  auto as_groups = [&](const torch::Tensor& x) { return x.reshape({B, T, H * groups, group}); };
  auto s = fused_vector_scores(as_groups(q), as_groups(k), as_groups(g), *dt, scale);  // heads (head, group)
  // v [B,T,H,V] -> [B,T,H groups n,64]: value part j of head h for every key group.
  auto vs = v.to(*dt).reshape({B, T, H, 1, n, kHead}).expand({B, T, H, groups, n, kHead}).reshape(
      {B, T, H * groups * n, kHead});
  // h0 [B,H,K,V] (key rows, value columns) -> [B,H groups n,group,64], block (key group, value part).
  torch::Tensor h0s;
  if (h0.defined())
    h0s = h0.to(torch::kFloat).reshape({B, H, groups, group, n, kHead}).permute({0, 1, 2, 4, 3, 5}).reshape(
        {B, H * groups * n, group, kHead});
  auto out = VectorWalkFunction::apply(s.qd, s.kd, aligned_rows(vs), s.A, s.a, kernel_state(h0s, q.options()));
  // The key groups' outputs summed in fp32; the final state's blocks back in place.
  auto o = out[0].view({B, T, H, groups, n, kHead});
  o = (groups == 1 ? o : o.to(torch::kFloat).sum(3)).reshape({B, T, H, V});
  auto state = out[1].view({B, H, groups, n, group, kHead}).permute({0, 1, 2, 4, 3, 5}).reshape({B, H, K, V});
  return OpResult{o.to(v.scalar_type()), state};
}

}  // namespace linearize::ops::detail
