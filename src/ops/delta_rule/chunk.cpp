// The delta rule, chunked form (docs/design.md, "Chunked delta rule"): the gated delta rule through the WY/UT representation.
//
// Per chunk n, with G the chunk-local cumulative log decay (fp32) and Γ[r,j,d] = exp(G[r,d] - G[j,d]):
//   L[r,j]  = beta_r Σ_d K[r,d] K[j,d] Γ[r,j,d]   for j < r            (strictly lower)
//   W = (I + L)^{-1} diag(beta) (K ⊙ e^G),   U = (I + L)^{-1} diag(beta) V   (one triangular solve)
//   Aqk[r,j] = scale Σ_d Q[r,d] K[j,d] Γ[r,j,d]   for j <= r
// then, sequentially over chunks (detail::state_pass: a loop, or one CUDA kernel each way):
//   V' = U - W S^(n)                  (row r = the recurrence's write vector u_t)
//   O  = scale (Q ⊙ e^G) S^(n) + Aqk V'
//   S^(n+1) = Diag(e^{G_last}) S^(n) + (K ⊙ e^{G_last - G})^T V'
// The solve is detail::solve_unit_lower (linalg_solve_triangular, or on CUDA the chunk's inverse from a
// kernel applied as one batched product). On CUDA with head size 64, or 64 or 128 key channels and a
// multiple of 64 value columns, the form runs as fused kernels instead (detail::fused_delta_rule_chunk,
// detail::fused_vector_delta_rule_chunk). With a decay per key channel at larger multiples of 64 it takes
// its scores and row factors from the fused scores kernel, run on parts of 64 key channels as heads of
// their own (the scores are sums over the channels), and the rest as written here: without that, the
// pairwise decays Γ cost T x 16 x K floats a head and run out of memory at long T.
//
// Shapes: q, k [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; g undefined / [H] / [B,T,H] / [B,T,H,K]; inside,
// [B,H,N,C,D]. T is zero-padded to a multiple of C (q, k, v, g and beta zero: padded steps are
// identities). Autograd flows to q, k, v, beta, g, h0.
#include "io/error.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

namespace linearize::ops {

namespace {

// What the chunks' walk starts from, [B,H,N,C,·]: the scores Aqk and L, the row-scaled Q (Qg), the
// transform's keys diag(beta)(K ⊙ e^G) (Kg), the update's keys (Kd) and the state's decay D (undefined
// without decay).
struct ChunkOperands {
  torch::Tensor Aqk, L, Qg, Kg, Kd, D;
};

constexpr int64_t kPart = 64;  // the channels of a part in the fused scores kernel

// Whether q's shape fits the scores kernel in parts: K = 64 m and at most 65535 heads of parts (its grid rows).
bool fits_in_parts(const torch::Tensor& q) {
  const int64_t K = q.size(3);
  return K % kPart == 0 && q.size(0) * q.size(2) * (K / kPart) <= 65535;
}

// ChunkOperands for a decay per key channel from the fused scores kernel (vector_decay_scores.cu, K = 64 m
// key channels taken 64 at a time): Aqk and the keys' own scores summed over the channels, the row factors
// whole, the transform's keys from ek's parts side by side. Nothing where the kernel cannot run.
std::optional<ChunkOperands> vector_operands_by_parts(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const torch::Tensor& g,
                                                      const torch::Tensor& bt, double scale, int64_t chunk) {
  if (!fits_in_parts(q)) return std::nullopt;
  const auto dt = detail::fused_chunk_dtype(q, k, v, chunk);
  if (!dt) return std::nullopt;
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), m = K / kPart;
  auto s = detail::fused_vector_scores(q, k, g, *dt, scale, /*key_scores=*/true);
  const int64_t N = s.A.size(2), C = s.A.size(3);
  auto chunks = [&](const torch::Tensor& x) { return x.view({B, H, N, C, K}); };  // [B,H,N*C,K] -> [B,H,N,C,K]
  ChunkOperands c;
  c.Aqk = s.A.to(torch::kFloat);  // zeros above the diagonal as the kernel gives them
  c.L = (s.Akk.to(torch::kFloat) * bt).tril(-1);  // the keys' scores hold their diagonal
  c.Qg = chunks(s.qd);
  c.Kd = chunks(s.kd);
  c.D = s.a.view({B, H, N, K, 1});
  c.Kg = s.ek.view({B, H, m, N, C, kPart}).permute({0, 1, 3, 4, 2, 5}).reshape({B, H, N, C, K}) * bt;
  return c;
}

}  // namespace

bool detail::vector_scores_by_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t chunk) {
  return fits_in_parts(q) && detail::fused_chunk_dtype(q, k, v, chunk).has_value();
}

OpResult delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                          double scale, int64_t chunk) {
  using detail::GateKind;
  detail::check_qkv(q, k, v, "delta_rule_chunk");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (!beta.defined() || beta.dim() != 3 || beta.size(0) != B || beta.size(1) != T || beta.size(2) != H)
    throw Error("delta_rule_chunk: expected beta [B,T,H] = [" + std::to_string(B) + ", " +
                std::to_string(T) + ", " + std::to_string(H) + "]");
  const auto kind = detail::gate_kind(g, B, T, H, K, "delta_rule_chunk");
  // Head size 64 on CUDA in bf16/fp16 (or under autocast): the same math as fused kernels (no or a scalar
  // decay: delta_rule/fused_chunk.cpp; a decay per key channel: delta_rule/fused_vector_chunk.cpp).
  if (auto fused = detail::fused_vector_delta_rule_chunk(q, k, v, beta, g, kind, h0, scale, chunk)) return *fused;
  if (const auto fused_dt = detail::fused_delta_rule_dtype(q, k, v, kind, chunk))
    return detail::fused_delta_rule_chunk(q, k, v, beta, g, kind, h0, scale, *fused_dt);
  const auto dt = detail::compute_dtype(v), op_dt = detail::operand_dtype(v);
  const int64_t C = chunk, Tp = detail::round_up(T, C), N = Tp / C;

  auto chunked = [&](const torch::Tensor& x) {  // [B,T,H,D] -> [B,H,N,C,D]
    return detail::pad_dim(detail::to_heads_first(x, op_dt), 2, Tp, 0.0).reshape({B, H, N, C, x.size(3)});
  };
  auto Vc = chunked(v);
  auto bt = detail::pad_dim(beta.to(dt).transpose(1, 2), 2, Tp, 0.0).reshape({B, H, N, C, 1});  // [B,H,N,C,1]

  std::optional<ChunkOperands> ops;
  if (kind == GateKind::Vector) ops = vector_operands_by_parts(q, k, v, g, bt, scale, chunk);
  if (!ops) {
    ops.emplace();
    auto Q = chunked(q), Kc = chunked(k);
    torch::Tensor G;  // chunk-local cumulative log decay: [B,H,N,C] or [B,H,N,C,K]
    if (kind != GateKind::None) {
      auto gh = detail::pad_dim(detail::gate_heads_first(g, kind, B, T, dt), 2, Tp, 0.0);
      G = (kind == GateKind::Vector ? gh.reshape({B, H, N, C, K}) : gh.reshape({B, H, N, C})).cumsum(3);
    }
    auto Kb = Kc * bt;  // [B,H,N,C,K]
    // Scores of beta*K (strictly lower: L) and of Q (diagonal included: Aqk) against K, sharing the decay.
    auto scores = detail::gated_scores({Kb, Q}, Kc, G, /*strict=*/false);
    ops->L = scores[0].tril(-1);   // [B,H,N,C,C]
    ops->Aqk = scores[1] * scale;  // [B,H,N,C,C]
    ops->Qg = Q * scale, ops->Kd = Kc, ops->Kg = Kb;  // Kg = diag(beta)(K ⊙ e^G)
    if (kind == GateKind::Vector) {
      auto Glast = G.select(3, C - 1).unsqueeze(3);  // [B,H,N,1,K]
      auto eG = G.exp();                             // [B,H,N,C,K]
      ops->Qg = ops->Qg * eG;
      ops->Kg = Kb * eG;
      ops->Kd = Kc * (Glast - G).exp();
      ops->D = Glast.squeeze(3).exp().unsqueeze(-1);  // [B,H,N,K,1]
    } else if (kind != GateKind::None) {
      auto Glast = G.select(3, C - 1).unsqueeze(3);  // [B,H,N,1]
      auto eG = G.exp().unsqueeze(-1);               // [B,H,N,C,1]
      ops->Qg = ops->Qg * eG;
      ops->Kg = Kb * eG;
      ops->Kd = Kc * (Glast - G).exp().unsqueeze(-1);
      ops->D = Glast.exp().unsqueeze(-1);  // [B,H,N,1,1]
    }
  }
  const auto& [Aqk, L, Qg, Kg, Kd, D] = *ops;

  // W and U from one unit-lower-triangular solve: (I + L) [W U] = [Kg, diag(beta) V].
  auto WU = detail::solve_unit_lower(L, torch::cat({Kg, Vc * bt}, -1));  // [B,H,N,C,K+V]
  auto W = WU.narrow(-1, 0, K), U = WU.narrow(-1, K, V);
  auto KdT = Kd.transpose(-1, -2);  // [B,H,N,K,C]

  auto S0 = h0.defined() ? h0.to(dt) : torch::zeros({B, H, K, V}, v.options().dtype(dt));  // [B,H,K,V]
  auto pass = detail::state_pass(W, U, KdT, D, S0);
  auto Sn = pass.states;    // [B,H,N,K,V]: S^(n), the state entering chunk n
  auto Vnew = pass.writes;  // [B,H,N,C,V]: V' of every chunk
  auto S = pass.final_state;
  auto O = detail::product(Qg, Sn) + detail::product(Aqk, Vnew);  // [B,H,N,C,V]
  auto o = O.reshape({B, H, Tp, V}).narrow(2, 0, T).transpose(1, 2).to(v.scalar_type());  // [B,T,H,V]
  return {o, S};
}

}  // namespace linearize::ops
