// Building blocks of the Llama architecture, with Hugging Face parameter names:
// RMSNorm (weight), rotary position embedding (rotate-half, as HF), softmax attention with grouped
// KV heads and a KV cache (q_proj, k_proj, v_proj, o_proj), and the SwiGLU MLP (gate_proj, up_proj,
// down_proj). Shapes: hidden states [B, T, hidden]; heads [B, H, T, head_dim].
#pragma once
#include <torch/torch.h>

#include <tuple>
#include <vector>

#include "io/hf_config.h"
#include "model/packed_projections.h"
#include "model/token_mixer.h"

namespace linearize {

// y = x * rsqrt(mean(x^2) + eps) * weight, reduced in fp32, cast back to x's dtype before the weight
// (ops::rms_norm: one fused kernel each way on CUDA).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Rotary embedding tables for positions [start, start + T): cos and sin [T, head_dim], fp32.
class Rotary {
 public:
  Rotary(int64_t head_dim, double theta, const RopeScaling& scaling = {});
  // The tables of the angles with their first half negated: cos is HF's (cos is even), sin HF's with its
  // first half negated (sin is odd), which is what the rotation in apply takes.
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t start, int64_t length, torch::Device device) const;
  // x [B, H, T, D] rotated for positions start..start+T-1 (rotate-half layout).
  torch::Tensor apply(const torch::Tensor& x, int64_t start) const;
  // x [B, H, T, D] rotated for per-token positions pos [B, T] (int64).
  torch::Tensor apply_at(const torch::Tensor& x, const torch::Tensor& pos) const;
  const torch::Tensor& inv_freq() const { return inv_freq_; }

 private:
  const torch::Tensor& signed_inv_freq_on(torch::Device device) const;
  torch::Tensor inv_freq_;                  // [D/2] fp32, CPU
  std::vector<float> freqs_;                // the same values: what apply's shared tables are keyed by
  mutable torch::Tensor device_inv_freq_;  // [-inv_freq_, inv_freq_] on the device last asked for
};

// Repeats each of the Hkv heads `groups` times, head-major: [B, Hkv, T, D] -> [B, Hkv*groups, T, D].
// Query head h reads KV head h / groups (HF repeat_kv).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t groups);

// Decoding state: the KV cache, tensors "k" and "v" [B, Hkv, capacity, head_dim], of which the first
// `position` entries are valid; it grows in blocks of 256 entries and is written in place unless a snapshot
// shares it. Rows of different lengths in one batch: "row_start" [B] (int64) marks each row's first valid
// entry (the rows left-padded to `position`); row b reads entries row_start[b] .. and rotates by its own
// position.
class LlamaAttention : public TokenMixer {
 public:
  explicit LlamaAttention(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state) override;
  // Block-diagonal causal mask: query i sees key j iff j <= i and both are in the same document;
  // RoPE positions restart at 0 at each document start.
  torch::Tensor forward_packed(const torch::Tensor& x, const PackedRows& rows) override;
  std::string kind() const override { return "softmax_attention"; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only
  int64_t num_heads, num_kv_heads, head_dim;
  int64_t sliding_window = 0;  // Mistral: keys further back than this are not seen (0: none)

 private:
  // q [B,H,T,D], k and v [B,Hkv,T,D], q and k before RoPE (Qwen3's per-head norms applied).
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project_qkv(const torch::Tensor& x);
  // One decode step into a KV cache of fixed capacity (a state holding "slot", a CUDA graph's buffers).
  torch::Tensor forward_fixed_cache(const torch::Tensor& x, LayerState& state);
  Rotary rotary_;
};

class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(int64_t hidden, int64_t intermediate, bool bias);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x))
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  PackedProjections gate_up;  // gate_proj and up_proj: one matrix product once packed
};
TORCH_MODULE(LlamaMLP);

}  // namespace linearize
