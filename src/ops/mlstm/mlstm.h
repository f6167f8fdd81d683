// The mLSTM (ops.h's mlstm_chunk, mlstm_recurrent), internal to src/ops: its fused chunk path, which
// mlstm_chunk tries before its libtorch form, and the same math in libtorch for the tests.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <utility>
#include <vector>

#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

// The chunked form of the mLSTM (mLSTM) through the fused scalar-decay kernels of the GLA family (the
// numerator), with the max state, the gates and the normaliser in fp32 by ops/cuda/mlstm_normaliser.cu
// (the math of mlstm_as_linear_attention), when they apply: as fused_scalar_decay_chunk (K = V = 64 or
// 128) and T > 0. Otherwise nothing, and mlstm_chunk runs its libtorch form. Differentiable in q, k, v,
// the gates and the initial state.
std::optional<MlstmResult> fused_mlstm_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const torch::Tensor& igate, const torch::Tensor& fgate,
                                             const MlstmState& init, double scale, double eps, int64_t chunk);

// mlstm_chunk's result as linear attention with a scalar decay (mlstm/fused_chunk.cpp): the max state
// m_t first (from the gates alone), then the numerator through gla_chunk with decay log f_t + m_{t-1} - m_t
// and keys e^{i_t - m_t} k_t, the normaliser in the compute dtype with autocast off. T > 0. The same math
// as fused_mlstm_chunk, here all in libtorch (gla_chunk's libtorch form on CPU; the tests use it).
MlstmResult mlstm_as_linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                                      double scale, double eps, int64_t chunk);

}  // namespace linearize::ops::detail
