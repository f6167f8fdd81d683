// Gated DeltaNet layer (see gated_deltanet.h). Order: parameterisation, recurrent step, chunked form.
//
//   q, k = l2(silu(conv(proj x))) [B,T,H,Dk];  v = silu(conv(v_proj x)) [B,T,H,Dv];  β = σ(b_proj x) [B,T,H]
//   g = -e^{A_log} softplus(a_proj x + dt_bias) [B,T,H] fp32
//   S_t = (I - β_t k_t k_t^T) e^{g_t} S_{t-1} + β_t k_t v_t^T;  o_t = S_t^T (s q_t)
#include "model/mixers/gated_deltanet.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize {

// ---- parameterisation ----------------------------------------------------------------------------

GatedDeltaNet::GatedDeltaNet(const MixerConfig& c) : config(c.resolved()) {
  const auto& k = config;
  auto lin = [](int64_t in, int64_t out, bool bias = false) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  k_proj = register_module("k_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  v_proj = register_module("v_proj", lin(k.hidden_size, k.value_dim(), k.qkv_bias));
  a_proj = register_module("a_proj", lin(k.hidden_size, k.value_heads()));
  b_proj = register_module("b_proj", lin(k.hidden_size, k.value_heads()));
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
  for (const auto& p : {q_proj, k_proj, v_proj, a_proj, b_proj, g_proj}) inputs.add(p);
  A_log = register_parameter("A_log", torch::log(torch::rand({k.value_heads()}) * 16).clamp_min(-30));  // A ~ U(0,16)
  dt_bias = register_parameter("dt_bias", mixers::dt_bias_init(k.value_heads(), k.dt_bias_init));
}

torch::Tensor GatedDeltaNet::forward(const torch::Tensor& x, LayerState* state) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_heads, HV = config.value_heads();
  const mixers::MixerStep step(state, T);
  const auto in = inputs(x);  // q_proj, k_proj, v_proj, a_proj, b_proj, g_proj: one matrix product once packed
  // A decode step takes q and k before their L2 norm and beta as logits (ops::delta_rule_decode).
  auto [q, k, v] = mixers::delta_rule_qkv(mixers::head_norm(q_norm, in[q_proj]), mixers::head_norm(k_norm, in[k_proj]),
                                          in[v_proj], config.use_short_conv, q_conv1d, k_conv1d, v_conv1d, step, H, HV,
                                          /*normalise=*/!step.decode);  // [B,T,HV,Dk] x2, [B,T,HV,Dv]
  const double beta_scale = config.allow_neg_eigval ? 2 : 1;  // beta = beta_scale σ(b_proj x) [B,T,HV]
  auto g = ops::softplus_decay(in[a_proj], dt_bias, A_log);  // -exp(A_log) softplus(a_proj x + dt_bias) [B,T,HV] fp32
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_k_dim));

  // ---- recurrent step (decode) / chunked form (whole sequence, prefill) ----
  auto r = step.decode
               ? ops::delta_rule_decode(q, k, v, in[b_proj], beta_scale, g, step.get("S"), scale, step.in_place())
               : ops::delta_rule_chunk(q, k, v, ops::delta_rule_beta(in[b_proj], beta_scale), g, step.get("S"),
                                       scale, config.chunk_size);
  step.put("S", r.state);
  step.advance(T);

  // [B,T,HV,Dv]: the norm and the output gate in one kernel each way (ops::rms_norm)
  auto o = g_proj ? ops::rms_norm(r.o, o_norm->weight, o_norm->eps, mixers::split_heads(in[g_proj], HV), ops::Gate::silu)
                  : o_norm(r.o);
  return o_proj(o.reshape({B, T, HV * config.head_v_dim}));
}

}  // namespace linearize
