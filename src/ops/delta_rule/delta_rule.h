// The delta-rule family (DeltaNet, Gated DeltaNet, KDA; ops.h's delta_rule_chunk, delta_rule_recurrent),
// internal to src/ops: its fused chunk paths, which delta_rule_chunk tries before its libtorch form.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <utility>
#include <vector>

#include "ops/common.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

// The chunked form of the delta rule with a decay per key channel (Kimi Delta Attention) through fused CUDA
// kernels (delta_rule/fused_vector_chunk.cpp), when they apply: CUDA, fused kernels on, chunk 64,
// K = V = 64, or K = 64 or 128 and V a multiple of 64 (in parts of 64 channels), q, k, v in bf16 or fp16 (or
// fp32 under bf16/fp16 autocast). At those other head sizes it takes no decay or a decay per step as well
// (DeltaNet, Gated DeltaNet: the same decay on every key channel). Otherwise nothing, and delta_rule_chunk
// runs its libtorch form. Differentiable in q, k, v, beta, g and h0.
std::optional<OpResult> fused_vector_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const torch::Tensor& beta,
                                                      const torch::Tensor& g, GateKind kind, const torch::Tensor& h0,
                                                      double scale, int64_t chunk);

// Whether delta_rule_chunk with a decay per key channel takes its scores and row factors from the fused
// scores kernel in parts of 64 key channels (K a multiple of 64, the fused form not taking the head size,
// e.g. K = 256) rather than from its libtorch pairwise decays (delta_rule/chunk.cpp).
bool vector_scores_by_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            int64_t chunk);

// The chunked form of the delta rule with no decay or a scalar decay per step as fused CUDA kernels: the UT
// transform (ops/cuda/ut_transform.cu) and the walk over the chunks (ops/cuda/chunk_delta_rule.cu), when
// they apply: fused_chunk_dtype gives a dtype and the head size is 64. Otherwise nothing, and
// delta_rule_chunk runs its libtorch form.
std::optional<torch::ScalarType> fused_delta_rule_dtype(const torch::Tensor& q, const torch::Tensor& k,
                                                        const torch::Tensor& v, GateKind kind, int64_t chunk);
// delta_rule_chunk's result through the kernels; dt from fused_delta_rule_dtype. Differentiable in q, k, v,
// beta, g and h0.
OpResult fused_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                const torch::Tensor& h0, double scale, torch::ScalarType dt);
// The UT transform alone: W and U [B,H,N*64,64] in dt (zero past T) from k, v [B,T,H,64], beta [B,T,H] and
// the gate g (none or scalar). Differentiable in k, v, beta and g.
std::pair<torch::Tensor, torch::Tensor> fused_ut_transform(const torch::Tensor& k, const torch::Tensor& v,
                                                           const torch::Tensor& beta, const torch::Tensor& g,
                                                           GateKind kind, torch::ScalarType dt);

}  // namespace linearize::ops::detail
