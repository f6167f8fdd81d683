// When the fused chunk kernels run and what they read for the gate and the initial state (chunk.h).
#include <optional>

#include "compat/torch_compat.h"
#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

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

torch::Tensor kernel_gate(const torch::Tensor& g, GateKind kind, int64_t B, int64_t T, const torch::TensorOptions& like) {
  if (kind == GateKind::None) return torch::empty({0}, like.dtype(torch::kFloat));
  return gate_heads_first(g, kind, B, T, torch::kFloat).contiguous();  // [B,H,T]
}

torch::Tensor kernel_state(const torch::Tensor& h0, const torch::TensorOptions& like) {
  return h0.defined() ? aligned_rows(h0.to(torch::kFloat)) : torch::empty({0}, like.dtype(torch::kFloat));
}

}  // namespace linearize::ops::detail
