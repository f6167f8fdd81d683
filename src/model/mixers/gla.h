// Gated Linear Attention (fla GatedLinearAttention; docs/design.md, "GLA"): a data-dependent decay per key channel,
//   g_t = logsigmoid(gk_proj(x_t)) / normalizer  (log decay, [H, Dk]),  α_t = e^{g_t},
//   S_t = Diag(α_t) S_{t-1} + k_t v_t^T,  o_t = S_t^T (s q_t),  s = Dk^-1/2,
// then y = o_proj(g_norm(o) ⊙ swish(g_proj x)) (g_norm alone without the output gate).
//
// Parameters (fla names): q_proj [H*Dk, hidden], k_proj / v_proj [Hkv*D, hidden] (native GQA; the gate
// is per KV group and repeated like k), gk_proj.0 [rank, hidden] (no bias), gk_proj.1 [Hkv*Dk, rank]
// + bias, g_proj [H*Dv, hidden], o_proj, g_norm.weight [Dv]; optional q/k/v_conv1d (silu).
// Init: fla's N(0, 0.02), bias 0, so z ≈ 0 and α ≈ 2^(-1/16) ≈ 0.958 per step.
// State: "S" [B, H, Dk, Dv] fp32, conv caches "conv_q/k/v".
// Not done: fla's clamp_min and feature_map options.
#pragma once
#include "model/llama.h"
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

class GLA : public TokenMixer {
 public:
  explicit GLA(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "gla"; }

  MixerConfig config;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, g_proj{nullptr}, o_proj{nullptr};
  torch::nn::Sequential gk_proj{nullptr};
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm g_norm{nullptr};
};

}  // namespace linearize
