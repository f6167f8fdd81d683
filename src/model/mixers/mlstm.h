// mLSTM (xLSTM large / xLSTM-7B layer; docs/design.md, "mLSTM"): gated linear attention with an exponential
// input gate, a sigmoid forget gate, a normaliser and a max-stabiliser (per head, m_0 = 0):
//   ι = cap·tanh(igate_preact(x)/cap),  φ = cap·tanh(fgate_preact(x)/cap)   (cap = 15; [B,T,H])
//   m_t = max(logσ(φ_t) + m_{t-1}, ι_t),  f' = e^{logσ(φ_t) + m_{t-1} - m_t},  i' = e^{ι_t - m_t}
//   C_t = f' C_{t-1} + i' k_t v_t^T,  n_t = f' n_{t-1} + i' k_t
//   h_t = C_t^T q^_t / (max(|n_t·q^_t|, e^{-m_t}) + eps),  q^ = q·Dk^-1/2
//   y = out_proj(σ(ogate_preact x) ⊙ multihead_norm(h))    multihead_norm: per-head LayerNorm, no bias
//
// Parameters (xLSTM large names): q, k [H*Dk, hidden], v [H*Dv, hidden], ogate_preact [H*Dv, hidden],
// igate_preact, fgate_preact [H, hidden] + bias, multihead_norm.weight [H*Dv], out_proj [hidden, H*Dv].
// Init: gate weights 0; fgate bias linspace(3, 6, H) (f ≈ 0.953 .. 0.998); igate bias 0 (config
// mlstm_igate_bias_init), not xLSTM-7B's -10: with -10 the e^{-m} floor dominates the denominator and the
// layer outputs ≈ 0 at init (docs/design.md, "mLSTM"), useless when starting from a teacher; with 0, i' = 1 and
// |n·q| sets the scale. Other weights use xLSTM's small init N(0, sqrt(2/(5 hidden))) (out_proj too: the
// layer does not know the block count that Wang init needs).
// State: "c" [B,H,Dk,Dv], "n" [B,H,Dk], "m" [B,H], all fp32.
// Not done: the original xLSTM mLSTMLayer (proj_up, conv, block-diagonal q/k/v, learnable skip).
#pragma once
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

// Per-head LayerNorm over the last dim of [B,T,H,D] (fp32, mean subtracted, no bias), then the flat
// weight [H*D]: returns [B,T,H*D].
class MultiHeadLayerNormImpl : public torch::nn::Module {
 public:
  MultiHeadLayerNormImpl(int64_t heads, int64_t head_dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(MultiHeadLayerNorm);

class MLSTM : public TokenMixer {
 public:
  explicit MLSTM(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "mlstm"; }

  MixerConfig config;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, ogate_preact{nullptr}, igate_preact{nullptr},
      fgate_preact{nullptr}, out_proj{nullptr};
  MultiHeadLayerNorm multihead_norm{nullptr};
};

}  // namespace linearize
