// GLA layer (see gla.h). Order: parameterisation, recurrent step, chunked form.
//
//   q [B,T,H,Dk];  k, gk repeated from Hkv to H heads [B,T,H,Dk] (a decode step reads the Hkv heads);  v [B,T,H,Dv]
//   g = logsigmoid(gk) / normalizer (fp32);  S_t = Diag(e^{g_t}) S_{t-1} + k_t v_t^T;  o_t = S_t^T (s q_t)
//   y = o_proj(g_norm(o) ⊙ swish(g_proj x))
#include "model/mixers/gla.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize {

// ---- parameterisation ----------------------------------------------------------------------------

GLA::GLA(const MixerConfig& c) : config(c.resolved()) {
  const auto& k = config;
  auto lin = [](int64_t in, int64_t out, bool bias = false) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  k_proj = register_module("k_proj", lin(k.hidden_size, k.kv_heads() * k.head_k_dim, k.qkv_bias));
  v_proj = register_module("v_proj", lin(k.hidden_size, k.kv_heads() * k.head_v_dim, k.qkv_bias));
  gk_proj = register_module("gk_proj", mixers::low_rank(k.hidden_size, k.gate_low_rank_dim,
                                                        k.kv_heads() * k.head_k_dim, /*out_bias=*/true));
  if (k.use_output_gate) g_proj = register_module("g_proj", lin(k.hidden_size, k.value_dim()));
  o_proj = register_module("o_proj", lin(k.value_dim(), k.hidden_size, k.o_bias));
  if (k.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(k.head_k_dim, k.qk_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(k.head_k_dim, k.qk_norm_eps));
  }
  if (k.use_short_conv) {
    q_conv1d = register_module("q_conv1d", mixers::ShortConv(k.key_dim(), k.conv_size, k.conv_bias, true));
    k_conv1d = register_module("k_conv1d", mixers::ShortConv(k.kv_heads() * k.head_k_dim, k.conv_size, k.conv_bias, true));
    v_conv1d = register_module("v_conv1d", mixers::ShortConv(k.kv_heads() * k.head_v_dim, k.conv_size, k.conv_bias, true));
  }
  g_norm = register_module("g_norm", RMSNorm(k.head_v_dim, k.norm_eps));
  mixers::linear_init(*this, k.init_std);
  for (const auto& p : {q_proj, k_proj, v_proj, mixers::low_rank_stage(gk_proj, 0), g_proj}) inputs.add(p);
}

torch::Tensor GLA::forward(const torch::Tensor& x, LayerState* state) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_heads, Hkv = config.kv_heads(), G = H / Hkv;
  const mixers::MixerStep step(state, T);
  // q_proj, k_proj, v_proj, gk_proj's first stage and g_proj: one matrix product once packed
  const auto in = inputs(x);
  // q [B,T,H*Dk], k [B,T,Hkv*Dk], v [B,T,Hkv*Dv]
  auto q = mixers::head_norm(q_norm, in[q_proj]), k = mixers::head_norm(k_norm, in[k_proj]), v = in[v_proj];
  if (config.use_short_conv) {
    q = mixers::conv_step(q_conv1d, q, step, "conv_q");
    k = mixers::conv_step(k_conv1d, k, step, "conv_k");
    v = mixers::conv_step(v_conv1d, v, step, "conv_v");
  }
  // A decode step reads the Hkv shared heads of k, v and the gate where they are (gla_recurrent's grouped
  // heads); the chunked form takes them spread over the H heads.
  const int64_t spread = step.decode ? 1 : G;
  q = mixers::split_heads(q, H);                                        // [B,T,H,Dk]
  k = mixers::repeat_heads(mixers::split_heads(k, Hkv), spread);        // [B,T,H,Dk] (decode: Hkv)
  v = mixers::repeat_heads(mixers::split_heads(v, Hkv), spread);        // [B,T,H,Dv] (decode: Hkv)
  const auto gk_kv = mixers::low_rank_stage(gk_proj, 1)(in[mixers::low_rank_stage(gk_proj, 0)]);  // [B,T,Hkv*Dk]
  auto gk = mixers::repeat_heads(mixers::split_heads(gk_kv, Hkv), spread);                            // [B,T,H,Dk]
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_k_dim));

  // ---- recurrent step (decode) / chunked form (whole sequence, prefill) ----
  // The log decay g = log_sigmoid(gk) / normaliser (fp32): a decode step takes the logits and computes it as
  // it reads them (gla_recurrent's gate_logits, which a positive normaliser only can mean).
  const double normaliser = config.gate_logit_normalizer;
  auto log_decay = [&] { return torch::log_sigmoid(gk.to(torch::kFloat)) / normaliser; };  // fp32
  auto r = !step.decode     ? ops::gla_chunk(q, k, v, log_decay(), step.get("S"), scale, config.chunk_size)
           : normaliser > 0 ? ops::gla_recurrent(q, k, v, gk, step.get("S"), scale, step.in_place(), normaliser)
                            : ops::gla_recurrent(q, k, v, log_decay(), step.get("S"), scale, step.in_place());
  step.put("S", r.state);
  step.advance(T);

  // [B,T,H,Dv]: the norm and the output gate in one kernel each way (ops::rms_norm)
  auto o = g_proj ? ops::rms_norm(r.o, g_norm->weight, g_norm->eps, mixers::split_heads(in[g_proj], H), ops::Gate::silu)
                  : g_norm(r.o);
  return o_proj(o.reshape({B, T, H * config.head_v_dim}));
}

}  // namespace linearize
