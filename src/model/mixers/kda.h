// Kimi Delta Attention (fla KimiDeltaAttention; spec §6): the delta rule with a data-dependent decay per
// head and key channel,
//   g_t[h,d] = -exp(A_log[h]) softplus(f_proj(x_t)[h,d] + dt_bias[h*Dk+d])   (log decay [H, Dk], fp32)
//   u_t = β_t (v_t - (Diag(α_t) S_{t-1})^T k_t),  S_t = Diag(α_t) S_{t-1} + k_t u_t^T,  o_t = S_t^T (s q_t),
// q, k L2-normalised, β = σ(b_proj x). Output, by kda_gate_mode (g = g_proj(x), low rank with bias):
//   multiply     (fla)          y = o_proj(o_norm(o) ⊙ σ(g))           o_norm(o) = RMSNorm(o) * w
//   add_in_norm  (the study)    y = o_proj(RMSNorm(o + g) * w)         g raw, no sigmoid
// (without the output gate: y = o_proj(o_norm(o))).
//
// Parameters (fla names): q_proj, k_proj [H*Dk, hidden], v_proj [H*Dv, hidden], f_proj.0 [Dv, hidden],
// f_proj.1 [H*Dk, Dv] (no biases), b_proj [H, hidden], A_log [H] (ln U(1,16)), dt_bias [H*Dk] (inverse
// softplus of logU(1e-3, 1e-1)), g_proj.0 [Dv, hidden], g_proj.1 [H*Dv, Dv] + bias, o_proj,
// o_norm.weight [Dv], q/k/v_conv1d [C,1,W] (silu).
// State: "S" [B, H, Dk, Dv] fp32, conv caches "conv_q/k/v".
// Not done: fla's lower_bound / safe_gate gate form and GVA (num_v_heads).
#pragma once
#include "model/llama.h"
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

class KDA : public TokenMixer {
 public:
  explicit KDA(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "kda"; }

  MixerConfig config;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, b_proj{nullptr}, o_proj{nullptr};
  torch::nn::Sequential f_proj{nullptr}, g_proj{nullptr};
  torch::Tensor A_log, dt_bias;  // [H], [H*Dk]
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm o_norm{nullptr};
};

}  // namespace linearize
