#include "model/causal_lm.h"

#include "model/recompute.h"
#include "ops/ops.h"

namespace linearize {

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c, std::shared_ptr<TokenMixer> mixer_,
                                   const std::string& mixer_name_)
    : mixer(std::move(mixer_)), mixer_name(mixer_name_) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  register_module(mixer_name, mixer);
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", LlamaMLP(c.hidden_size, c.intermediate_size, c.mlp_bias));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, LayerState* state, Trace* trace) {
  auto a_in = input_layernorm(x);
  auto a_out = mixer->forward(a_in, state);
  // h = x + a_out and its norm, one launch when decoding
  const auto [h, m_in] = ops::add_rms_norm(x, a_out, post_attention_layernorm->weight, post_attention_layernorm->eps);
  auto out = h + mlp(m_in);
  if (trace) {
    trace->layer_in.push_back(x);
    trace->attn_in.push_back(a_in);
    trace->attn_out.push_back(a_out);
    trace->layer_out.push_back(out);
  }
  return out;
}

torch::Tensor DecoderLayerImpl::forward_packed(const torch::Tensor& x, const PackedRows& rows) {
  const auto [h, m_in] = ops::add_rms_norm(x, mixer->forward_packed(input_layernorm(x), rows),
                                           post_attention_layernorm->weight, post_attention_layernorm->eps);
  return h + mlp(m_in);
}

std::pair<torch::Tensor, torch::Tensor> DecoderLayerImpl::forward_deferred(const torch::Tensor& x,
                                                                           const torch::Tensor& pending,
                                                                           LayerState* state) {
  torch::Tensor stream = x, a_in;
  if (pending.defined()) {
    auto joined = ops::add_rms_norm(x, pending, input_layernorm->weight, input_layernorm->eps);
    stream = joined.sum, a_in = joined.normed;
  } else {
    a_in = input_layernorm(x);
  }
  auto joined = ops::add_rms_norm(stream, mixer->forward(a_in, state), post_attention_layernorm->weight,
                                  post_attention_layernorm->eps);
  return {joined.sum, mlp(joined.normed)};
}

CausalLMImpl::CausalLMImpl(const LlamaConfig& c, const MixerFactory& mixer_for) : config(c) {
  model = register_module("model", Backbone());
  model->embed_tokens = model->register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  model->layers = model->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::shared_ptr<TokenMixer> mixer;
    std::string name = "self_attn";
    if (mixer_for) std::tie(mixer, name) = mixer_for(i);
    else mixer = std::make_shared<LlamaAttention>(c);
    model->layers->push_back(DecoderLayer(c, mixer, name));
  }
  model->norm = model->register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
}

void CausalLMImpl::pack_projections() {
  for (int64_t i = 0; i < num_layers(); ++i) {
    auto l = layer(i);
    l->mixer->pack_projections();
    l->mlp->gate_up.pack();
  }
}

DecoderLayer CausalLMImpl::layer(int64_t i) const {
  return DecoderLayer(model->layers->ptr<DecoderLayerImpl>(i));
}

torch::Tensor CausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor CausalLMImpl::hidden_states(const torch::Tensor& ids, ModelState* state, Trace* trace) {
  if (state && static_cast<int64_t>(state->size()) != config.num_hidden_layers)
    state->resize(config.num_hidden_layers);
  auto x = model->embed_tokens(ids);  // [B,T,hidden]
  const bool recomputed = recompute && !state && !trace && torch::GradMode::is_enabled();
  if (!trace && !torch::GradMode::is_enabled() && config.num_hidden_layers > 0) {
    // Inference: each layer's last addition runs with the next norm, one launch a layer fewer.
    torch::Tensor pending;
    for (int64_t i = 0; i < config.num_hidden_layers; ++i)
      std::tie(x, pending) = layer(i)->forward_deferred(x, pending, state ? &(*state)[i] : nullptr);
    return ops::add_rms_norm(x, pending, model->norm->weight, model->norm->eps).normed;
  }
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    x = recomputed ? forward_recomputed(*layer(i), x) : layer(i)->forward(x, state ? &(*state)[i] : nullptr, trace);
  auto h = model->norm(x);
  if (trace) trace->final_norm_out = h;
  return h;
}

torch::Tensor CausalLMImpl::hidden_states_packed(const torch::Tensor& ids, const PackedRows& rows) {
  auto x = model->embed_tokens(ids);  // [B,T,hidden]
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) x = layer(i)->forward_packed(x, rows);
  return model->norm(x);
}

torch::Tensor CausalLMImpl::logits_from_hidden(const torch::Tensor& h) {
  return torch::matmul(h, lm_head_weight().t());  // [B,T,V]
}

torch::Tensor CausalLMImpl::forward(const torch::Tensor& ids, ModelState* state, Trace* trace) {
  return logits_from_hidden(hidden_states(ids, state, trace));
}

void init_weights_normal(torch::nn::Module& m, double std) {
  torch::NoGradGuard ng;
  for (auto& mod : m.modules(/*include_self=*/true)) {
    if (auto* lin = mod->as<torch::nn::Linear>()) {
      lin->weight.normal_(0, std);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = mod->as<torch::nn::Embedding>()) {
      emb->weight.normal_(0, std);
    }
  }
}

}  // namespace linearize
