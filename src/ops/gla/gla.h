// The gated linear attention family (linear attention, RetNet, GLA; ops.h's gla_chunk, gla_recurrent),
// internal to src/ops: its fused chunk paths, which gla_chunk tries before its libtorch form (chunk.cpp).
#pragma once
#include <torch/torch.h>

#include <optional>
#include <utility>
#include <vector>

#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

// The chunked form of the GLA family with no decay, a fixed or a scalar decay through the fused CUDA kernels
// (ops/cuda/chunk_scalar_decay.cu), when they apply: CUDA, fused kernels on, chunk 64, K = V = 64 or
// 128, q, k, v in bf16 or fp16 (or fp32 under bf16/fp16 autocast). Otherwise nothing, and the caller runs
// its libtorch form. Differentiable in q, k, v, g and h0; o in v's dtype, the state in fp32.
std::optional<OpResult> fused_scalar_decay_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& g, GateKind kind,
                                                 const torch::Tensor& h0, double scale, int64_t chunk);

// The same for a decay per key channel (GLA) through ops/cuda/vector_decay_scores.cu and
// chunk_vector_decay.cu (gla/fused_vector_chunk.cpp), when they apply: CUDA, fused
// kernels on, chunk 64, K = V = 64, or K and V other multiples of 64 (as parts of 64 channels), q, k, v in
// bf16 or fp16 (or fp32 under bf16/fp16 autocast).
std::optional<OpResult> fused_vector_decay_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& g, GateKind kind,
                                                 const torch::Tensor& h0, double scale, int64_t chunk);

// The intra-chunk scores and row factors of a decay per key channel through vector_decay_scores.cu (CUDA
// build only), differentiable in q, k and g: q, k [B,T,H,K] with K = 64 m (any layout and dtype; run in the
// 16-bit dtype dt) and g [B,T,H,K] (run in fp32) -> A [B,H,N,64,64], qd, kd [B,H,N*64,K], a [B,H,N,K], and
// with key_scores also Akk [B,H,N,64,64] and ek by 64-channel part [B,H m,N*64,64], as
// cuda_kernels::vector_scores_forward gives them (the scores summed over the K channels in fp32, rounded to
// dt once). GLA's fused form and Kimi Delta Attention's (with the keys' own scores) build on it.
struct VectorScores {
  torch::Tensor A, qd, kd, a, Akk, ek;
};
VectorScores fused_vector_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                 torch::ScalarType dt, double scale, bool key_scores = false);

}  // namespace linearize::ops::detail
