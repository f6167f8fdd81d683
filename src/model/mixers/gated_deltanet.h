// Gated DeltaNet (fla GatedDeltaNet; docs/design.md, "Gated DeltaNet"): the delta rule with a data-dependent scalar
// decay per head,
//   g_t = -exp(A_log) softplus(a_proj x_t + dt_bias)  (log decay [H], fp32),  α_t = e^{g_t},
//   u_t = β_t (v_t - (α_t S_{t-1})^T k_t),  S_t = α_t S_{t-1} + k_t u_t^T,  o_t = S_t^T (s q_t),
// q, k L2-normalised, β = σ(b_proj x), then y = o_proj(o_norm(o) ⊙ swish(g_proj x)).
//
// With num_v_heads = HV > H (fla's GVA) q and k have H heads, each read by HV / H value heads; the
// state, beta and the decay are per value head.
//
// Parameters (fla names): q_proj, k_proj [H*Dk, hidden], v_proj [HV*Dv, hidden], a_proj, b_proj
// [HV, hidden], A_log [HV] (ln U(0,16)), dt_bias [HV] (inverse softplus of logU(1e-3, 1e-1), or zeros),
// g_proj [HV*Dv, hidden], o_proj, o_norm.weight [Dv], q/k/v_conv1d [C,1,W] (silu).
// State: "S" [B, HV, Dk, Dv] fp32, conv caches "conv_q/k/v".
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
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, a_proj{nullptr}, b_proj{nullptr},
      g_proj{nullptr}, o_proj{nullptr};
  torch::Tensor A_log, dt_bias;  // [HV], [HV]
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm o_norm{nullptr};
};

}  // namespace linearize
