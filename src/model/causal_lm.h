// A decoder-only causal language model in the Llama layout, generic over the token mixer:
//   embed_tokens -> L x [x + mixer(input_layernorm(x)); x + mlp(post_attention_layernorm(x))]
//   -> norm -> lm_head (tied to embed_tokens when tie_word_embeddings).
// The teacher uses LlamaAttention in every layer; a student uses a linear-time mixer in some or all.
// Parameter names follow Hugging Face: model.embed_tokens.weight, model.layers.{i}.<mixer>...,
// model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/hf_config.h"
#include "model/llama.h"
#include "model/token_mixer.h"

namespace linearize {

// Intermediate tensors of one forward pass, as the golden files and distillation need them.
struct Trace {
  std::vector<torch::Tensor> layer_in;   // residual stream entering layer i   [B,T,hidden]
  std::vector<torch::Tensor> attn_in;    // mixer input (after input_layernorm)
  std::vector<torch::Tensor> attn_out;   // mixer output (after its output projection)
  std::vector<torch::Tensor> layer_out;  // residual stream leaving layer i
  torch::Tensor final_norm_out;          // final RMSNorm of the last layer_out
};

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const LlamaConfig& c, std::shared_ptr<TokenMixer> mixer, const std::string& mixer_name);
  torch::Tensor forward(const torch::Tensor& x, LayerState* state, Trace* trace = nullptr);
  torch::Tensor forward_packed(const torch::Tensor& x, const PackedRows& rows);
  // Inference: forward with the layer's last addition left to the next norm. Takes the residual stream x and
  // the last layer's MLP output (undefined for the first layer), returns h and this layer's MLP output, whose
  // sum is forward's result; each addition runs with the norm after it (ops::add_rms_norm).
  std::pair<torch::Tensor, torch::Tensor> forward_deferred(const torch::Tensor& x, const torch::Tensor& pending,
                                                           LayerState* state);

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  std::shared_ptr<TokenMixer> mixer;
  std::string mixer_name;  // "self_attn" for softmax attention, "attn" for student mixers
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// embed_tokens, layers, norm: registered as "model" inside CausalLM for HF names.
class BackboneImpl : public torch::nn::Module {
 public:
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Backbone);

using MixerFactory = std::function<std::pair<std::shared_ptr<TokenMixer>, std::string>(int64_t layer)>;

class CausalLMImpl : public torch::nn::Module {
 public:
  // mixer_for(i) gives layer i's mixer and its parameter-name prefix; default: Llama attention.
  explicit CausalLMImpl(const LlamaConfig& config, const MixerFactory& mixer_for = nullptr);

  // ids [B, T] (int64) -> logits [B, T, vocab]. With a state, continues from it and updates it.
  torch::Tensor forward(const torch::Tensor& ids, ModelState* state = nullptr, Trace* trace = nullptr);
  // The final-norm hidden states [B, T, hidden] (before lm_head).
  torch::Tensor hidden_states(const torch::Tensor& ids, ModelState* state = nullptr, Trace* trace = nullptr);
  torch::Tensor logits_from_hidden(const torch::Tensor& h);
  // hidden_states for rows of packed documents (token_mixer.h): each document as if run alone.
  torch::Tensor hidden_states_packed(const torch::Tensor& ids, const PackedRows& rows);

  DecoderLayer layer(int64_t i) const;
  int64_t num_layers() const { return config.num_hidden_layers; }
  ModelState new_state() const { return ModelState(config.num_hidden_layers); }
  // Every layer's projections that read one input run as one matrix product in forwards without
  // gradients (model/packed_projections.h): for inference, once the weights are on their device and dtype.
  void pack_projections();
  torch::Tensor lm_head_weight() const;

  LlamaConfig config;
  // Training aid: recompute each layer's activations in backward (model/recompute.h) when a
  // stateless forward runs with gradients. Less memory, about one more forward pass of compute.
  bool recompute = false;
  Backbone model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied
};
TORCH_MODULE(CausalLM);

// Builds a Llama teacher with the default (random) torch initialisation replaced by N(0, 0.02)
// linear/embedding weights, as HF initialises, for models trained from scratch.
void init_weights_normal(torch::nn::Module& m, double std = 0.02);

}  // namespace linearize
