// The intra-chunk gated score matrix of the chunked forms (chunk.h, detail::gated_scores).
//
// The gated score matrix for a vector gate (GLA, KDA) is the delicate one. Within a chunk G is the
// local cumulative log decay, non-increasing in r. For query rows r in sub-chunk i (rows s0..s0+c-1)
// and key rows j < s0, with ref = G[s0]:
//   exp(G_r - G_j) = exp(G_r - ref) * exp(ref - G_j),  both exponents <= 0,
// so X ⊙ exp(G - ref) and Y ⊙ exp(ref - G) never overflow. Inside the diagonal c x c sub-block the
// factor is taken pairwise (detail::diagonal_block_scores).
#include <limits>
#include <vector>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int64_t kSubChunk = 16;
}  // namespace

std::vector<torch::Tensor> gated_scores(const std::vector<torch::Tensor>& Xs, const torch::Tensor& Y,
                                        const torch::Tensor& G, bool strict) {
  const int64_t B = Y.size(0), H = Y.size(1), N = Y.size(2), C = Y.size(3), K = Y.size(4);
  auto mask = causal_mask(C, strict, Y.device());
  std::vector<torch::Tensor> out;
  out.reserve(Xs.size());
  if (!G.defined()) {
    for (const auto& X : Xs) out.push_back(product(X, Y.transpose(-1, -2)).masked_fill(~mask, 0.0));  // [B,H,N,C,C]
    return out;
  }
  if (G.dim() == 4) {
    auto decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~mask, kNegInf).exp();  // [B,H,N,C,C]
    for (const auto& X : Xs) out.push_back(product(X, Y.transpose(-1, -2)) * decay);
    return out;
  }

  // Vector gate: sub-chunks of c rows (the whole chunk when it does not split into 16s).
  const int64_t c = (C % kSubChunk == 0) ? kSubChunk : C;
  const int64_t S = C / c;
  auto Ys = Y.reshape({B, H, N, S, c, K});
  auto Gs = G.reshape({B, H, N, S, c, K});

  // Diagonal sub-blocks, [B,H,N,S,c,c] each.
  std::vector<torch::Tensor> Xsub;
  for (const auto& X : Xs) Xsub.push_back(X.reshape({B, H, N, S, c, K}));
  auto diags = diagonal_block_scores(Xsub, Ys, Gs, strict);
  if (S == 1) {
    for (const auto& d : diags) out.push_back(d.reshape({B, H, N, C, C}));
    return out;
  }

  // Off-diagonal sub-blocks: query sub-block s against key rows j < s*c, reference row s*c.
  auto ref = Gs.select(4, 0).unsqueeze(4);  // [B,H,N,S,1,K]
  auto q_decay = (Gs - ref).exp();          // [B,H,N,S,c,K]
  auto rows = torch::arange(C, torch::TensorOptions().dtype(torch::kLong).device(Y.device()));
  auto starts = torch::arange(S, rows.options()) * c;
  auto key_before = (rows.view({1, C}) < starts.view({S, 1})).view({S, C, 1});  // [S, C, 1]
  auto YtT = (Y.unsqueeze(3) * (ref - G.unsqueeze(3)).masked_fill(~key_before, kNegInf).exp())
                 .transpose(-1, -2);  // [B,H,N,S,K,C]

  // Put each diagonal block at columns s*c .. s*c+c-1 of its query sub-block.
  auto eye = torch::eye(S, diags[0].options()).view({S, 1, S, 1});
  for (size_t i = 0; i < Xs.size(); ++i) {
    auto off = product(Xs[i].reshape({B, H, N, S, c, K}) * q_decay, YtT);   // [B,H,N,S,c,C]
    auto diag_full = (diags[i].unsqueeze(5) * eye).reshape({B, H, N, S, c, C});  // [B,H,N,S,c,C]
    out.push_back((off + diag_full).reshape({B, H, N, C, C}));
  }
  return out;
}

torch::Tensor gated_scores(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                           bool strict) {
  return gated_scores(std::vector<torch::Tensor>{X}, Y, G, strict)[0];
}

}  // namespace linearize::ops::detail
