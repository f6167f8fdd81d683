// RetNet multi-scale retention (fla MultiScaleRetention; docs/design.md, "RetNet"): a fixed decay per head,
//   γ_h = 1 - 2^(-5-h),  S_t = γ_h S_{t-1} + k_t v_t^T,  o_t = S_t^T (s q_t),  s = Dk^-1/2,
// with rotary position embedding (rotate-half, base rope_theta) on q and k, then
// y = o_proj(g_norm(o) ⊙ swish(g_proj x)) (g_norm alone without the output gate).
//
// Parameters (fla names): q_proj [H*Dk, hidden], k_proj / v_proj [Hkv*D, hidden] (native GQA),
// g_proj [H*Dv, hidden], o_proj, g_norm.weight [Dv]; optional q_conv1d / k_conv1d / v_conv1d [C,1,W]
// (silu). The decays and the rotary tables are fixed, not parameters.
// State: "S" [B, H, Dk, Dv] fp32, conv caches "conv_q/k/v" [B, C, W-1]; position = rotary offset.
// Not done: fla's optional feature_map on q, k.
#pragma once
#include "model/llama.h"
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

class RetNet : public TokenMixer {
 public:
  explicit RetNet(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "retnet"; }
  torch::Tensor log_decay() const { return log_gamma_; }  // [H] ln γ_h

  MixerConfig config;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, g_proj{nullptr}, o_proj{nullptr};
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm g_norm{nullptr};

 private:
  Rotary rotary_;
  torch::Tensor log_gamma_;  // [H] fp32
};

}  // namespace linearize
