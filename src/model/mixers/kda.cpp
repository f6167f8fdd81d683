// KDA layer (see kda.h). Order: parameterisation, recurrent step, chunked form.
//
//   q, k = l2(silu(conv(proj x))) [B,T,H,Dk];  v = silu(conv(v_proj x)) [B,T,H,Dv];  β = σ(b_proj x) [B,T,H]
//   g = -e^{A_log[h]} softplus(f_proj x + dt_bias) [B,T,H,Dk] fp32  (or the lower-bound gate)
//   S_t = (I - β_t k_t k_t^T) Diag(e^{g_t}) S_{t-1} + β_t k_t v_t^T;  o_t = S_t^T (s q_t)
#include "model/mixers/kda.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize {

// ---- parameterisation ----------------------------------------------------------------------------

KDA::KDA(const MixerConfig& c) : config(c.resolved()) {
  const auto& k = config;
  auto lin = [](int64_t in, int64_t out, bool bias = false) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  k_proj = register_module("k_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  v_proj = register_module("v_proj", lin(k.hidden_size, k.value_dim(), k.qkv_bias));
  const int64_t HV = k.value_heads();
  f_proj = register_module("f_proj", mixers::low_rank(k.hidden_size, k.head_v_dim, HV * k.head_k_dim, /*out_bias=*/false));
  b_proj = register_module("b_proj", lin(k.hidden_size, HV));
  if (k.use_output_gate && k.kda_gate_low_rank)
    g_proj = register_module("g_proj", mixers::low_rank(k.hidden_size, k.head_v_dim, k.value_dim(), /*out_bias=*/true));
  if (k.use_output_gate && !k.kda_gate_low_rank)
    g_full = register_module("g_proj", torch::nn::Linear(torch::nn::LinearOptions(k.hidden_size, k.value_dim()).bias(true)));
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
  for (const auto& p : {q_proj, k_proj, v_proj, mixers::low_rank_stage(f_proj, 0), b_proj, g_full}) inputs.add(p);
  if (g_proj) inputs.add(mixers::low_rank_stage(g_proj, 0));
  A_log = register_parameter("A_log", k.safe_gate ? torch::zeros({HV})
                                                 : torch::log(1 + torch::rand({HV}) * 15));  // A ~ U(1,16)
  dt_bias = register_parameter("dt_bias", mixers::dt_bias_init(HV * k.head_k_dim, k.dt_bias_init));
}

torch::Tensor KDA::forward(const torch::Tensor& x, LayerState* state) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_heads, HV = config.value_heads();
  const mixers::MixerStep step(state, T);
  // q_proj, k_proj, v_proj, b_proj and the first stages of f_proj and g_proj (or the whole g_proj): one
  // matrix product once packed
  const auto in = inputs(x);
  // A decode step takes q and k before their L2 norm and beta as logits (ops::delta_rule_decode).
  auto [q, k, v] = mixers::delta_rule_qkv(mixers::head_norm(q_norm, in[q_proj]), mixers::head_norm(k_norm, in[k_proj]),
                                          in[v_proj], config.use_short_conv, q_conv1d, k_conv1d, v_conv1d, step, H, HV,
                                          /*normalise=*/!step.decode);  // [B,T,HV,Dk] x2, [B,T,HV,Dv]
  const double beta_scale = config.allow_neg_eigval ? 2 : 1;  // beta = beta_scale σ(b_proj x) [B,T,HV]
  // g = -exp(A_log) softplus(f + dt_bias), one kernel each way (ops::softplus_decay), or the bounded gate
  const auto f = mixers::low_rank_stage(f_proj, 1)(in[mixers::low_rank_stage(f_proj, 0)]);  // [B,T,HV*Dk]
  auto g = mixers::split_heads(config.lower_bound < 0 ? ops::lower_bound_decay(f, dt_bias, A_log, config.lower_bound)
                                                      : ops::softplus_decay(f, dt_bias, A_log),
                               HV);  // [B,T,HV,Dk] fp32
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_k_dim));

  // ---- recurrent step (decode) / chunked form (whole sequence, prefill) ----
  auto r = step.decode
               ? ops::delta_rule_decode(q, k, v, in[b_proj], beta_scale, g, step.get("S"), scale, step.in_place())
               : ops::delta_rule_chunk(q, k, v, ops::delta_rule_beta(in[b_proj], beta_scale), g, step.get("S"),
                                       scale, config.chunk_size);
  step.put("S", r.state);
  step.advance(T);

  torch::Tensor o;  // [B,T,HV,Dv]
  if (!g_proj && !g_full) {
    o = o_norm(r.o);
  } else {
    const auto gate_flat = g_proj ? mixers::low_rank_stage(g_proj, 1)(in[mixers::low_rank_stage(g_proj, 0)])
                                  : in[g_full];           // [B,T,HV*Dv]
    const auto gate = mixers::split_heads(gate_flat, HV);  // [B,T,HV,Dv]
    o = config.kda_gate_mode == "add_in_norm" ? o_norm(r.o + gate)
                                              : ops::rms_norm(r.o, o_norm->weight, o_norm->eps, gate, ops::Gate::sigmoid);
  }
  return o_proj(o.reshape({B, T, HV * config.head_v_dim}));
}

}  // namespace linearize
