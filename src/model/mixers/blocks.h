// Small building blocks shared by the seven mixer layers (docs/design.md, "Building blocks"), so each mixer file shows
// only what differs in its math:
//   ShortConv      depthwise causal conv over time (fla ShortConvolution): y_t[c] = Σ_i w[c,i] x_{t-W+1+i}[c],
//                  weight [C, 1, W], optional bias, optional silu. Decoding carries the last W-1 *pre-conv*
//                  inputs per channel, [B, C, W-1].
//   LowRank        Linear(in -> rank) then Linear(rank -> out), registered as a Sequential so parameters
//                  are named "<name>.0.weight", "<name>.1.weight" / ".1.bias" like fla's nn.Sequential.
//   split_heads    [B, T, H*D] -> [B, T, H, D];  repeat_heads: KV head j serves heads j*G .. j*G+G-1 (HF
//                  repeat_kv, head-major), [B, T, Hkv, D] -> [B, T, Hkv*G, D].
//   linear_init    N(0, std) weights, zero biases of every Linear / ShortConv below m (fla _init_weights);
//                  dt_bias_init (docs/design.md, "Building blocks").
//   MixerStep      how one forward call runs: whole sequence, prefill (chunked from a state) or decode.
// What it does not do: no variable-length packing (cu_seqlens); one sequence per batch row.
#pragma once
#include <torch/torch.h>

#include <string>

#include "model/layer_state.h"
#include "model/llama.h"

namespace linearize::mixers {

class ShortConvImpl : public torch::nn::Module {
 public:
  ShortConvImpl(int64_t channels, int64_t width, bool bias, bool silu);
  // x [B, T, C]; cache [B, C, W-1] pre-conv inputs (undefined = zeros). Returns y [B, T, C]; writes the
  // new cache (the last W-1 inputs, cache included) to *new_cache when given.
  // With in_place (one step), the new cache is written over `cache` (ops::short_conv).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cache, torch::Tensor* new_cache,
                        bool in_place = false);
  // Identity init: last tap 1, others 0, bias 0, so the conv passes x through (before the silu).
  void init_identity();
  torch::Tensor weight, bias;  // [C, 1, W], [C] or undefined
  int64_t width;
  bool silu;
};
TORCH_MODULE(ShortConv);

torch::nn::Sequential low_rank(int64_t in, int64_t rank, int64_t out, bool out_bias);
// Stage 0 (in -> rank) or 1 (rank -> out) of a low_rank Sequential, so stage 0 can join the layer's
// packed input projections.
torch::nn::Linear low_rank_stage(const torch::nn::Sequential& s, size_t stage);

torch::Tensor split_heads(const torch::Tensor& x, int64_t heads);
torch::Tensor repeat_heads(const torch::Tensor& x, int64_t groups);

void linear_init(torch::nn::Module& m, double std);

// dt_bias init of Mamba2 / GDN / KDA: dt = exp(U(ln 1e-3, ln 1e-1)) clamped to >= 1e-4, stored as its
// exact inverse softplus dt + ln(-expm1(-dt)), so softplus(dt_bias) = dt; `kind` "zeros" (the study's
// KDA) gives zeros. [n] fp32.
torch::Tensor dt_bias_init(int64_t n, const std::string& kind = "mamba");

// The three ways a forward call runs (token_mixer.h): state == nullptr = whole sequence from zeros
// (chunked); a state and T == 1 = decode (recurrent step); a state and T > 1 = prefill (chunked from the
// state).
struct MixerStep {
  LayerState* state;
  bool decode;
  MixerStep(LayerState* s, int64_t T) : state(s), decode(s != nullptr && T == 1) {}
  // A decode step into a state that allows it writes the new state over the old (LayerState::update_in_place).
  bool in_place() const { return decode && state->update_in_place; }
  torch::Tensor get(const std::string& name) const { return state ? state->get(name) : torch::Tensor(); }
  void put(const std::string& name, const torch::Tensor& t) const {
    if (state) state->tensors[name] = t;
  }
  void advance(int64_t T) const {
    if (state) state->position += T;
  }
  int64_t position() const { return state ? state->position : 0; }
};

// Short convs on q, k, v with their caches "conv_q", "conv_k", "conv_v" in the state.
torch::Tensor conv_step(ShortConv& conv, const torch::Tensor& x, const MixerStep& step, const std::string& name);

// The delta-rule family's (DeltaNet, Gated DeltaNet, KDA) keys and values from the projected q, k
// [B, T, H*Dk] and v [B, T, HV*Dv]: short convs with silu (or silu alone when use_conv is false), then
// per-head split and L2 norm of q and k, which are repeated to the HV value heads (value head i reads
// q/k head i / (HV / H), fla's GVA). Returns q, k [B, T, HV, Dk] and v [B, T, HV, Dv]; with normalise false
// q and k come without their L2 norm (for ops::delta_rule_decode, which applies it).
struct DeltaQKV {
  torch::Tensor q, k, v;
};
// A projection y [B, T, n*d] with an RMSNorm over each head of d channels when `norm` is set (a Qwen3
// teacher's q_norm / k_norm, carried into its students); y itself otherwise.
torch::Tensor head_norm(RMSNorm& norm, const torch::Tensor& y);

DeltaQKV delta_rule_qkv(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool use_conv, ShortConv& q_conv,
                        ShortConv& k_conv, ShortConv& v_conv, const MixerStep& step, int64_t heads,
                        int64_t value_heads, bool normalise = true);

}  // namespace linearize::mixers
