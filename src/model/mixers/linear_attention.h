// Linear Attention (fla LinearAttention; docs/design.md, "Linear Attention"): S_t = S_{t-1} + φ(k_t) v_t^T,  o_t =
// S_t^T (s φ(q_t)), s = (feature dim)^-1/2; then a per-head RMSNorm (optional) and o_proj. No decay, no RoPE. Options
// (fla's, and the study's student): silu short convs on q, k, v before the feature map (use_short_conv); q and k
// sum-normalised after it (norm_q, norm_k: x / (Σx + 1e-4)); the output divided by s φ(q_t) . z_t + 1e-10 with z_t =
// Σ_{u<=t} φ(k_u) (feature_map_norm, fla's do_feature_map_norm).
//
// Parameters (fla names): q_proj [H*Dk, hidden], k_proj / v_proj [Hkv*D, hidden] (native GQA: KV head
// j serves heads j*G .. j*G+G-1), o_proj [hidden, H*Dv], feature_map_q / feature_map_k (see
// FeatureMap), norm.weight [Dv] when use_output_norm, q_conv1d / k_conv1d / v_conv1d when use_short_conv.
// State: "S" [B, H, Kf, Dv] fp32; "Z" [B, H, Kf] fp32 (feature_map_norm); "conv_q/k/v" (use_short_conv).
// Not done: fla's tie_feature_map_qk.
#pragma once
#include "model/llama.h"
#include "model/mixers/blocks.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

// Per-head feature map on the last dim (fla's modules and parameter names):
//   elementwise_product  (W1 x + b1) ⊙ (W2 x + b2)          layer1, layer2: Linear(D, D) with bias
//   hedgehog             softmax([2 W x + 2b, -2 W x - 2b])  layer: Linear(D, D), identity init; 2D features
//   t2r                  relu(W x)                           layer: Linear(D, D), no bias
//   dpfp                 x' = [relu x, -relu x] (2D); [x' ⊙ roll(x', j)]_{j=1..4}   no parameters; 8D features
//   elu                  elu(x) + 1;   relu;   identity      no parameters
class FeatureMapImpl : public torch::nn::Module {
 public:
  FeatureMapImpl(const std::string& kind, int64_t dim);
  torch::Tensor forward(const torch::Tensor& x);
  int64_t out_dim() const { return kind == "hedgehog" ? 2 * dim : kind == "dpfp" ? 8 * dim : dim; }
  void reset_init(double std);  // N(0, std) linear weights; hedgehog: identity
  std::string kind;
  int64_t dim;
  torch::nn::Linear layer1{nullptr}, layer2{nullptr}, layer{nullptr};
};
TORCH_MODULE(FeatureMap);

class LinearAttention : public TokenMixer {
 public:
  explicit LinearAttention(const MixerConfig& config);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  std::string kind() const override { return "linear_attention"; }

  MixerConfig config;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // a Qwen3 teacher's per-head q/k norms (qk_norm)
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  FeatureMap feature_map_q{nullptr}, feature_map_k{nullptr};
  RMSNorm norm{nullptr};  // null without output norm
  mixers::ShortConv q_conv1d{nullptr}, k_conv1d{nullptr}, v_conv1d{nullptr};
};

}  // namespace linearize
