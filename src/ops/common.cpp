// Shared pieces of the op families: layout and dtype changes, time padding, gate
// normalisation and the intra-chunk gated score matrix (see common.h for the contracts).
//
// The gated score matrix for a vector gate (GLA, KDA) is the delicate one. Within a chunk G is the
// local cumulative log decay, non-increasing in r. For query rows r in sub-chunk i (rows s0..s0+c-1)
// and key rows j < s0, with ref = G[s0]:
//   exp(G_r - G_j) = exp(G_r - ref) * exp(ref - G_j),  both exponents <= 0,
// so X ⊙ exp(G - ref) and Y ⊙ exp(ref - G) never overflow. Inside the diagonal c x c sub-block the
// factor is taken pairwise (detail::diagonal_block_scores).
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "compat/torch_compat.h"
#include "io/error.h"
#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/kernels.h"
#endif

namespace linearize::ops {

namespace detail {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int64_t kSubChunk = 16;
}  // namespace

std::string shape_of(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

torch::ScalarType compute_dtype(const torch::Tensor& x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

bool low_precision(torch::ScalarType t) { return t == torch::kBFloat16 || t == torch::kHalf; }

torch::ScalarType operand_dtype(const torch::Tensor& x) {
  return low_precision(x.scalar_type()) ? x.scalar_type() : compute_dtype(x);
}

torch::Tensor product(const torch::Tensor& a, const torch::Tensor& b) {
  const auto ta = a.scalar_type(), tb = b.scalar_type();
  if (ta == tb) return a.matmul(b);
  if (low_precision(ta)) return a.matmul(b.to(ta));
  if (low_precision(tb)) return a.to(tb).matmul(b);
  return a.matmul(b);  // fp32 with fp64: type promotion fails loudly, as it should
}

void check_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const char* op) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.sizes() != k.sizes() || v.size(0) != q.size(0) ||
      v.size(1) != q.size(1) || v.size(2) != q.size(2))
    throw Error(std::string(op) + ": expected q, k [B,T,H,K] and v [B,T,H,V], got q " + shape_of(q) +
                ", k " + shape_of(k) + ", v " + shape_of(v));
}

GateKind gate_kind(const torch::Tensor& g, int64_t B, int64_t T, int64_t H, int64_t K, const char* op) {
  if (!g.defined()) return GateKind::None;
  if (g.dim() == 1 && g.size(0) == H) return GateKind::Fixed;
  if (g.dim() == 3 && g.size(0) == B && g.size(1) == T && g.size(2) == H) return GateKind::Scalar;
  if (g.dim() == 4 && g.size(0) == B && g.size(1) == T && g.size(2) == H && g.size(3) == K)
    return GateKind::Vector;
  throw Error(std::string(op) + ": expected g undefined, [H], [B,T,H] or [B,T,H,K] with B=" +
              std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
              " K=" + std::to_string(K) + ", got " + shape_of(g));
}

torch::Tensor to_heads_first(const torch::Tensor& x, torch::ScalarType dt) {
  return x.to(dt).transpose(1, 2);  // [B, H, T, D]
}

torch::Tensor gate_heads_first(const torch::Tensor& g, GateKind kind, int64_t B, int64_t T,
                               torch::ScalarType dt) {
  switch (kind) {
    case GateKind::None: return {};
    case GateKind::Fixed: return g.to(dt).view({1, -1, 1}).expand({B, g.size(0), T});  // [B, H, T]
    case GateKind::Scalar: return g.to(dt).transpose(1, 2);                          // [B, H, T]
    case GateKind::Vector: return g.to(dt).transpose(1, 2);                          // [B, H, T, K]
  }
  return {};
}

torch::Tensor decay_state(const torch::Tensor& S, const torch::Tensor& g, GateKind kind, int64_t t) {
  switch (kind) {
    case GateKind::None: return S;
    case GateKind::Fixed: return S * g.exp().view({1, -1, 1, 1});                        // [1,H,1,1]
    case GateKind::Scalar: return S * g.select(1, t).exp().view({S.size(0), -1, 1, 1});  // [B,H,1,1]
    case GateKind::Vector: return S * g.select(1, t).exp().unsqueeze(-1);                // [B,H,K,1]
  }
  return S;
}

torch::Tensor pad_dim(const torch::Tensor& x, int64_t dim, int64_t len, double value) {
  const int64_t have = x.size(dim);
  if (have >= len) return x;
  auto shape = x.sizes().vec();
  shape[dim] = len - have;
  return torch::cat({x, torch::full(shape, value, x.options())}, dim);
}

int64_t round_up(int64_t T, int64_t chunk) { return (T + chunk - 1) / chunk * chunk; }

torch::Tensor causal_mask(int64_t C, bool strict, const torch::Device& device) {
  return torch::ones({C, C}, torch::TensorOptions().dtype(torch::kBool).device(device))
      .tril(strict ? -1 : 0);  // [C, C]
}

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

std::optional<torch::ScalarType> fused_chunk_dtype(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, int64_t chunk) {
  if (!fused_kernels_enabled() || !on_kernel_device(q) || chunk != 64) return std::nullopt;
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return std::nullopt;
  auto dt = q.scalar_type();
  if (low_precision(dt)) return dt;
  const auto autocast = compat::autocast_state(torch::kCUDA);
  if (dt != torch::kFloat || !autocast.enabled || !low_precision(autocast.dtype)) return std::nullopt;
  return autocast.dtype;
}

torch::Tensor aligned_rows(torch::Tensor t) {
  t = t.contiguous();
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

torch::Tensor kernel_gate(const torch::Tensor& g, GateKind kind, int64_t B, int64_t T, const torch::TensorOptions& like) {
  if (kind == GateKind::None) return torch::empty({0}, like.dtype(torch::kFloat));
  return gate_heads_first(g, kind, B, T, torch::kFloat).contiguous();  // [B,H,T]
}

torch::Tensor kernel_state(const torch::Tensor& h0, const torch::TensorOptions& like) {
  return h0.defined() ? aligned_rows(h0.to(torch::kFloat)) : torch::empty({0}, like.dtype(torch::kFloat));
}

torch::Tensor walk_decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                                  int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state) {
#ifdef LINEARIZE_WITH_KERNELS
  if (on_kernel_device(dot_q) && cuda_kernels::decay_gradient_supported(chunk))
    return cuda_kernels::decay_gradient(dot_q, dot_k, dot_w, chunk, d_final, final_state);
#endif
  auto db = dot_q - dot_k;                                               // [B,H,T]
  auto dg = db.flip(2).cumsum(2).flip(2);                                // Σ_{t >= s}
  if (dot_w.defined()) {
    const int64_t B = dot_q.size(0), H = dot_q.size(1), T = dot_q.size(2), N = dot_w.size(2) / chunk;
    auto per_chunk = dot_w.reshape({B, H, N, chunk}).sum(-1);            // [B,H,N]
    auto later = per_chunk.flip(2).cumsum(2).flip(2) - per_chunk;        // [B,H,N]: Σ over chunks m > n
    dg = dg + later.repeat_interleave(chunk, 2).narrow(2, 0, T);
  }
  if (d_final.defined()) dg = dg + (d_final * final_state).sum({2, 3}).unsqueeze(-1);
  return dg;
}

std::optional<OpResult> fused_decode_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                          const torch::Tensor& h0, double scale, int64_t groups) {
#ifdef LINEARIZE_WITH_KERNELS
  if (!fused_kernels_enabled() || !on_kernel_device(q) || q.size(1) != 1 || v.scalar_type() == torch::kDouble)
    return std::nullopt;
  // The kernel has no backward: a step that autograd must see runs as libtorch ops.
  if (torch::GradMode::is_enabled())
    for (const auto* t : {&q, &k, &v, &beta, &g, &h0})
      if (t->defined() && t->requires_grad()) return std::nullopt;
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), V = v.size(3);
  auto S = h0.defined() ? h0 : torch::zeros({B, H, K, V}, v.options().dtype(torch::kFloat));
  torch::Tensor gs;  // [H], [B,H] or [B,H,K]
  if (kind == GateKind::Fixed) gs = g;
  else if (kind == GateKind::Scalar || kind == GateKind::Vector) gs = g.select(1, 0);
  auto [o, S_new] = cuda_kernels::recurrent_step(q.select(1, 0), k.select(1, 0), v.select(1, 0), gs,
                                                 beta.defined() ? beta.select(1, 0) : torch::Tensor(), S, scale,
                                                 groups);
  return OpResult{o.unsqueeze(1), S_new};
#else
  (void)q, (void)k, (void)v, (void)beta, (void)g, (void)kind, (void)h0, (void)scale, (void)groups;
  return std::nullopt;
#endif
}

}  // namespace detail

namespace {
bool g_fused = true;
bool g_emulation = false;
}  // namespace

void set_fused_kernels(bool on) { g_fused = on; }

bool fused_kernels_enabled() {
#ifdef LINEARIZE_WITH_KERNELS
  return g_fused;
#else
  return false;
#endif
}

bool kernel_emulation_available() {
#ifdef LINEARIZE_CUDA_EMULATION
  return true;
#else
  return false;
#endif
}

void set_kernel_emulation(bool on) {
  if (on && !kernel_emulation_available())
    throw std::runtime_error("kernel emulation: not in this build (the emulator is compiled only where CUDA is not)");
  g_emulation = on;
}

bool kernel_emulation_enabled() { return g_emulation; }

bool on_kernel_device(const torch::Tensor& t) { return t.is_cuda() || (g_emulation && t.is_cpu()); }

}  // namespace linearize::ops
