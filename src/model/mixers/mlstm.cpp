// mLSTM layer (see mlstm.h). Order: parameterisation, recurrent step, chunked form.
//
//   q, k [B,T,H,Dk];  v [B,T,H,Dv];  ι, φ soft-capped gate pre-activations [B,T,H] fp32
//   (C, n, m) stabilised recurrence (ops::mlstm_*);  y = out_proj(σ(ogate_preact x) ⊙ LN_heads(h))
#include "model/mixers/mlstm.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize {

// ---- parameterisation ----------------------------------------------------------------------------

MultiHeadLayerNormImpl::MultiHeadLayerNormImpl(int64_t heads, int64_t head_dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({heads * head_dim}));
}

// A LayerNorm per head is a group norm over the rows' H*D channels in H groups: one fused kernel each way
// (mean, biased variance, the weight) where the element-wise form took about ten passes over [B,T,H,D].
torch::Tensor MultiHeadLayerNormImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  auto rows = x.to(torch::kFloat).reshape({B * T, H * D});
  return torch::group_norm(rows, H, weight.to(torch::kFloat), {}, eps).view({B, T, H * D}).to(x.scalar_type());
}

namespace {
torch::Tensor soft_cap(const torch::Tensor& x, double cap) { return cap * torch::tanh(x / cap); }
}  // namespace

MLSTM::MLSTM(const MixerConfig& c) : config(c.resolved()) {
  const auto& cf = config;
  auto lin = [](int64_t in, int64_t out, bool bias) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q = register_module("q", lin(cf.hidden_size, cf.key_dim(), cf.qkv_bias));
  k = register_module("k", lin(cf.hidden_size, cf.key_dim(), cf.qkv_bias));
  v = register_module("v", lin(cf.hidden_size, cf.value_dim(), cf.qkv_bias));
  ogate_preact = register_module("ogate_preact", lin(cf.hidden_size, cf.value_dim(), false));
  igate_preact = register_module("igate_preact", lin(cf.hidden_size, cf.num_heads, true));
  fgate_preact = register_module("fgate_preact", lin(cf.hidden_size, cf.num_heads, true));
  multihead_norm = register_module("multihead_norm", MultiHeadLayerNorm(cf.num_heads, cf.head_v_dim, cf.mlstm_norm_eps));
  out_proj = register_module("out_proj", lin(cf.value_dim(), cf.hidden_size, cf.o_bias));
  if (cf.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(cf.head_k_dim, cf.qk_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(cf.head_k_dim, cf.qk_norm_eps));
  }
  mixers::linear_init(*this, std::sqrt(2.0 / (5.0 * cf.hidden_size)));
  for (const auto& p : {q, k, v, ogate_preact, igate_preact, fgate_preact}) inputs.add(p);
  torch::NoGradGuard no_grad;
  igate_preact->weight.zero_();
  fgate_preact->weight.zero_();
  igate_preact->bias.fill_(cf.mlstm_igate_bias_init);
  fgate_preact->bias.copy_(torch::linspace(cf.mlstm_fgate_bias_min, cf.mlstm_fgate_bias_max, cf.num_heads));
}

torch::Tensor MLSTM::forward(const torch::Tensor& x, LayerState* state) {
  const int64_t T = x.size(1), H = config.num_heads;
  const mixers::MixerStep step(state, T);
  const auto in = inputs(x);  // q, k, v and the three gates' preactivations: one matrix product once packed
  auto qh = mixers::split_heads(mixers::head_norm(q_norm, in[q]), H);  // [B,T,H,Dk]
  auto kh = mixers::split_heads(mixers::head_norm(k_norm, in[k]), H);  // [B,T,H,Dk]
  auto vh = mixers::split_heads(in[v], H);  // [B,T,H,Dv]
  auto ig = soft_cap(in[igate_preact].to(torch::kFloat), config.mlstm_gate_soft_cap);  // [B,T,H]
  auto fg = soft_cap(in[fgate_preact].to(torch::kFloat), config.mlstm_gate_soft_cap);  // [B,T,H]
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_k_dim));
  const ops::MlstmState init{step.get("c"), step.get("n"), step.get("m")};

  // ---- recurrent step (decode) / chunked form (whole sequence, prefill) ----
  auto r = step.decode ? ops::mlstm_recurrent(qh, kh, vh, ig, fg, init, scale, config.mlstm_eps)
                       : ops::mlstm_chunk(qh, kh, vh, ig, fg, init, scale, config.mlstm_eps, config.chunk_size);
  step.put("c", r.state.c);
  step.put("n", r.state.n);
  step.put("m", r.state.m);
  step.advance(T);

  auto h = multihead_norm(r.h);  // [B,T,H*Dv]
  return out_proj(torch::sigmoid(in[ogate_preact]) * h);
}

}  // namespace linearize
