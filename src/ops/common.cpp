// Shared pieces of the op families: layout and dtype changes, time padding and gate normalisation (see
// common.h for the contracts), and the switches of the fused kernels and their CPU emulator (ops.h).
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "compat/torch_compat.h"
#include "io/error.h"
#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops {

namespace detail {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
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

torch::Tensor returned_state(const torch::Tensor& given, const torch::Tensor& S, bool in_place) {
  if (!in_place || !given.defined() || given.is_same(S) || given.sizes() != S.sizes() ||
      given.scalar_type() != S.scalar_type())
    return S;
  given.copy_(S);
  return given;
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

torch::Tensor aligned_rows(torch::Tensor t) {
  t = t.contiguous();
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

}  // namespace detail

namespace {
bool g_fused = true;
bool g_emulation = false;
}  // namespace

void set_fused_kernels(bool on) { g_fused = on; }

bool fused_kernels_enabled() { return g_fused && detail::kernels_built(); }

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
