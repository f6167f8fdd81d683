// The mLSTM (ops.h's mlstm_chunk, mlstm_recurrent), internal to src/ops: its fused chunk path, which
// mlstm_chunk tries before its libtorch form, and the same math in libtorch for the tests.
#pragma once
#include <torch/torch.h>

#include <functional>
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

// The parts of the mLSTM around its numerator: the keys k' = e^{i - m} k [B,T,H,K] in the numerator's
// dtype, the numerator's decay g [B,H,T], the max state m [B,H,T], the normaliser den = n·q^ [B,H,T] and
// the final n [B,H,K]. m carries its own gradient; inside g and k' it is held constant (m0 excepted).
// q is the queries as the numerator takes them: q itself, or q passed through the kernels' node, which
// then adds the numerator's gradient of q to its own in one pass.
struct MlstmParts {
  torch::Tensor kp, g, m, den, n_final, q;
};

// h and the final state from the parts: the numerator through gla_chunk (in k''s dtype), then
// h = numerator / (max(|den|, e^{-m}) + eps) with m's own gradient added (as_linear_attention.cpp), the
// division by `divide` (numerator -> h) when given (the kernels'), else in libtorch.
MlstmResult mlstm_join(const MlstmParts& parts, const torch::Tensor& v, const MlstmState& init, double scale,
                       double eps, int64_t chunk, const std::function<torch::Tensor(const torch::Tensor&)>& divide);

}  // namespace linearize::ops::detail
