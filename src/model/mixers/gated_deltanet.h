// Gated DeltaNet (fla GatedDeltaNet; spec §5): the delta rule with a data-dependent scalar decay per head,
//   g_t = -exp(A_log) softplus(a_proj x_t + dt_bias)  (log decay [H], fp32),  α_t = e^{g_t},
//   u_t = β_t (v_t - (α_t S_{t-1})^T k_t),  S_t = α_t S_{t-1} + k_t u_t^T,  o_t = S_t^T (s q_t),
// q, k L2-normalised, β = σ(b_proj x), then y = o_proj(o_norm(o) ⊙ swish(g_proj x)).
//
// Parameters (fla names): q_proj, k_proj [H*Dk, hidden], v_proj [H*Dv, hidden], a_proj, b_proj
// [H, hidden], A_log [H] (ln U(0,16)), dt_bias [H] (inverse softplus of logU(1e-3, 1e-1)), g_proj
// [H*Dv, hidden], o_proj, o_norm.weight [Dv], q/k/v_conv1d [C,1,W] (silu).
// No native GQA (fla's num_v_heads is GVA, the opposite sharing; not implemented here).
// State: "S" [B, H, Dk, Dv] fp32, conv caches "conv_q/k/v".
#pragma once
#include "model/llama.h"
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

class GatedDeltaNet : public TokenMixer {
 public:
  explicit GatedDeltaNet(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "gated_deltanet"; }

  MixerConfig config;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, a_proj{nullptr}, b_proj{nullptr},
      g_proj{nullptr}, o_proj{nullptr};
  torch::Tensor A_log, dt_bias;  // [H], [H]
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm o_norm{nullptr};
};

}  // namespace linearize
