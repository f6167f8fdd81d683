// Kimi Delta Attention (fla KimiDeltaAttention; docs/design.md, "KDA"): the delta rule with a data-dependent decay per
// head and key channel,
//   g_t[h,d] = -exp(A_log[h]) softplus(f_proj(x_t)[h,d] + dt_bias[h*Dk+d])   (log decay [H, Dk], fp32)
//   u_t = β_t (v_t - (Diag(α_t) S_{t-1})^T k_t),  S_t = Diag(α_t) S_{t-1} + k_t u_t^T,  o_t = S_t^T (s q_t),
// q, k L2-normalised, β = σ(b_proj x). With lower_bound < 0 (fla's bounded gate) the decay is instead
//   g_t[h,d] = lower_bound * σ(exp(A_log[h]) (f_proj(x_t)[h,d] + dt_bias[h*Dk+d]))   in [lower_bound, 0).
// Output, by kda_gate_mode (g = g_proj(x): low rank with bias as fla, or full rank with bias as the study):
//   multiply     (fla)          y = o_proj(o_norm(o) ⊙ σ(g))           o_norm(o) = RMSNorm(o) * w
//   add_in_norm  (the study)    y = o_proj(RMSNorm(o + g) * w)         g raw, no sigmoid
// (without the output gate: y = o_proj(o_norm(o))). With num_v_heads = HV > H (fla's GVA) q and k have H
// heads, each read by HV / H value heads; the state, beta and the decay are per value head.
//
// Parameters (fla names): q_proj, k_proj [H*Dk, hidden], v_proj [HV*Dv, hidden], f_proj.0 [Dv, hidden],
// f_proj.1 [HV*Dk, Dv] (no biases), b_proj [HV, hidden], A_log [HV] (ln U(1,16); 0 with safe_gate),
// dt_bias [HV*Dk] (inverse softplus of logU(1e-3, 1e-1), or zeros), g_proj.0 [Dv, hidden], g_proj.1
// [HV*Dv, Dv] + bias (full rank: g_proj [HV*Dv, hidden] + bias), o_proj, o_norm.weight [Dv],
// q/k/v_conv1d [C,1,W] (silu).
// State: "S" [B, HV, Dk, Dv] fp32, conv caches "conv_q/k/v".
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
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, b_proj{nullptr}, o_proj{nullptr};
  torch::nn::Sequential f_proj{nullptr}, g_proj{nullptr};  // g_proj: the low-rank output gate
  torch::nn::Linear g_full{nullptr};                        // the full-rank output gate (named g_proj)
  torch::Tensor A_log, dt_bias;  // [HV], [HV*Dk]
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm o_norm{nullptr};
};

}  // namespace linearize
