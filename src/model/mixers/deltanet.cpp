// DeltaNet layer (see deltanet.h). Order: parameterisation, recurrent step, chunked form.
//
//   q, k = l2(silu(conv(q_proj x))), l2(silu(conv(k_proj x))) [B,T,H,Dk];  v = silu(conv(v_proj x)) [B,T,H,Dv]
//   β = σ(b_proj x) [B,T,H];  S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}^T k_t)^T;  o_t = S_t^T (s q_t)
#include "model/mixers/deltanet.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize {

// ---- parameterisation ----------------------------------------------------------------------------

DeltaNet::DeltaNet(const MixerConfig& c) : config(c.resolved()) {
  const auto& k = config;
  auto lin = [](int64_t in, int64_t out, bool bias = false) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  k_proj = register_module("k_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  v_proj = register_module("v_proj", lin(k.hidden_size, k.value_dim(), k.qkv_bias));
  if (k.use_beta) b_proj = register_module("b_proj", lin(k.hidden_size, k.num_heads));
  if (k.use_output_gate) g_proj = register_module("g_proj", lin(k.hidden_size, k.value_dim()));
  o_proj = register_module("o_proj", lin(k.value_dim(), k.hidden_size, k.o_bias));
  if (k.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(k.head_k_dim, k.qk_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(k.head_k_dim, k.qk_norm_eps));
  }
  if (k.use_short_conv) {
    q_conv1d = register_module("q_conv1d", mixers::ShortConv(k.key_dim(), k.conv_size, k.conv_bias, true));
    k_conv1d = register_module("k_conv1d", mixers::ShortConv(k.key_dim(), k.conv_size, k.conv_bias, true));
    v_conv1d = register_module("v_conv1d", mixers::ShortConv(k.value_dim(), k.conv_size, k.conv_bias, true));
  }
  o_norm = register_module("o_norm", RMSNorm(k.head_v_dim, k.norm_eps));
  mixers::linear_init(*this, k.init_std);
  for (const auto& p : {q_proj, k_proj, v_proj, b_proj, g_proj}) inputs.add(p);
}

torch::Tensor DeltaNet::forward(const torch::Tensor& x, LayerState* state) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_heads;
  const mixers::MixerStep step(state, T);
  const auto in = inputs(x);  // q_proj, k_proj, v_proj, b_proj, g_proj: one matrix product once packed
  // A decode step with beta's projection takes q and k before their L2 norm and beta as logits
  // (ops::delta_rule_decode).
  const bool raw = step.decode && b_proj;
  auto [q, k, v] = mixers::delta_rule_qkv(mixers::head_norm(q_norm, in[q_proj]), mixers::head_norm(k_norm, in[k_proj]),
                                          in[v_proj], config.use_short_conv, q_conv1d, k_conv1d, v_conv1d, step, H, H,
                                          /*normalise=*/!raw);  // [B,T,H,Dk] x2, [B,T,H,Dv]
  const double beta_scale = config.allow_neg_eigval ? 2 : 1;  // beta = beta_scale σ(b_proj x), or beta_scale
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_k_dim));

  // ---- recurrent step (decode) / chunked form (whole sequence, prefill) ----
  ops::OpResult r;
  if (raw) {
    r = ops::delta_rule_decode(q, k, v, in[b_proj], beta_scale, {}, step.get("S"), scale, step.in_place());
  } else {
    const auto beta = b_proj ? ops::delta_rule_beta(in[b_proj], beta_scale)
                             : torch::full({B, T, H}, beta_scale, x.options().dtype(torch::kFloat));  // [B,T,H]
    r = step.decode ? ops::delta_rule_recurrent(q, k, v, beta, {}, step.get("S"), scale, step.in_place())
                    : ops::delta_rule_chunk(q, k, v, beta, {}, step.get("S"), scale, config.chunk_size);
  }
  step.put("S", r.state);
  step.advance(T);

  // [B,T,H,Dv]: the norm and the output gate in one kernel each way (ops::rms_norm)
  auto o = g_proj ? ops::rms_norm(r.o, o_norm->weight, o_norm->eps, mixers::split_heads(in[g_proj], H), ops::Gate::silu)
                  : o_norm(r.o);
  return o_proj(o.reshape({B, T, H * config.head_v_dim}));
}

}  // namespace linearize
