// DeltaNet (fla DeltaNet; docs/design.md, "DeltaNet"): the delta rule without decay,
//   u_t = β_t (v_t - S_{t-1}^T k_t),  S_t = S_{t-1} + k_t u_t^T,  o_t = S_t^T (s q_t),  s = Dk^-1/2,
// with q, k L2-normalised per head (eps 1e-6), β_t = σ(b_proj x_t) (x2 with allow_neg_eigval), then
// y = o_proj(o_norm(o)) or, with the output gate (fla use_gate), o_proj(o_norm(o) ⊙ swish(g_proj x)).
//
// Parameters (fla names): q_proj, k_proj [H*Dk, hidden], v_proj [H*Dv, hidden], b_proj [H, hidden],
// o_proj, o_norm.weight [Dv], q_conv1d / k_conv1d / v_conv1d [C,1,W] (silu; without convs silu is
// applied to the projections directly), g_proj [H*Dv, hidden] with the output gate.
// No native GQA: a GQA teacher's k/v heads are repeated into the weights (factory.h).
// State: "S" [B, H, Dk, Dv] fp32, conv caches "conv_q/k/v" [B, C, W-1].
// Not done: fla's qk_activation other than silu and qk_norm 'sum'.
#pragma once
#include "model/llama.h"
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

class DeltaNet : public TokenMixer {
 public:
  explicit DeltaNet(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "deltanet"; }

  MixerConfig config;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, b_proj{nullptr}, g_proj{nullptr},
      o_proj{nullptr};
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
  RMSNorm o_norm{nullptr};
};

}  // namespace linearize
