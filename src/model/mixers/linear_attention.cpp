// Linear Attention layer (see linear_attention.h). Order: parameterisation, recurrent step, chunked form.
//
//   q = φ_q(split(conv(q_proj x))) [B,T,H,Kf];  k = repeat(φ_k(split(conv(k_proj x)))) [B,T,H,Kf] (a decode step
//   reads the Hkv heads);  v [B,T,H,Dv]  (conv: silu short conv with use_short_conv, else nothing)
//   S_t = S_{t-1} + k_t v_t^T;  o_t = S_t^T (s q_t) [/ (s q_t . z_t + 1e-10)];  y = o_proj(norm(o))
#include "model/mixers/linear_attention.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize {

// ---- parameterisation ----------------------------------------------------------------------------

FeatureMapImpl::FeatureMapImpl(const std::string& kind_, int64_t dim_) : kind(kind_), dim(dim_) {
  auto lin = [&](bool bias) { return torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(bias)); };
  if (kind == "elementwise_product") {
    layer1 = register_module("layer1", lin(true));
    layer2 = register_module("layer2", lin(true));
  } else if (kind == "hedgehog") {
    layer = register_module("layer", lin(true));
  } else if (kind == "t2r") {
    layer = register_module("layer", lin(false));
  }
  reset_init(0.02);
}

void FeatureMapImpl::reset_init(double std) {
  mixers::linear_init(*this, std);
  if (kind == "hedgehog") {
    torch::NoGradGuard no_grad;
    layer->weight.copy_(torch::eye(dim));
  }
}

torch::Tensor FeatureMapImpl::forward(const torch::Tensor& x) {
  if (kind == "elementwise_product") return layer1(x) * layer2(x);
  if (kind == "hedgehog") {
    auto y = layer(x);
    return torch::softmax(torch::cat({2 * y, -2 * y}, -1), -1);
  }
  if (kind == "t2r") return torch::relu(layer(x));
  if (kind == "dpfp") {
    auto r = torch::relu(x);
    auto xx = torch::cat({r, -r}, -1);  // [..., 2D]
    std::vector<torch::Tensor> rolled;
    for (int64_t j = 1; j <= 4; ++j) rolled.push_back(torch::roll(xx, j, -1));
    return torch::cat({xx, xx, xx, xx}, -1) * torch::cat(rolled, -1);  // [..., 8D]
  }
  if (kind == "elu") return torch::elu(x) + 1;
  if (kind == "relu") return torch::relu(x);
  return x;  // identity
}

LinearAttention::LinearAttention(const MixerConfig& c) : config(c.resolved()) {
  const auto& k = config;
  auto lin = [](int64_t in, int64_t out, bool bias = false) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", lin(k.hidden_size, k.key_dim(), k.qkv_bias));
  k_proj = register_module("k_proj", lin(k.hidden_size, k.kv_heads() * k.head_k_dim, k.qkv_bias));
  v_proj = register_module("v_proj", lin(k.hidden_size, k.kv_heads() * k.head_v_dim, k.qkv_bias));
  o_proj = register_module("o_proj", lin(k.value_dim(), k.hidden_size, k.o_bias));
  if (k.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(k.head_k_dim, k.qk_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(k.head_k_dim, k.qk_norm_eps));
  }
  mixers::linear_init(*this, k.init_std);
  for (const auto& p : {q_proj, k_proj, v_proj}) inputs.add(p);
  feature_map_q = register_module("feature_map_q", FeatureMap(k.feature_map, k.head_k_dim));
  feature_map_k = register_module("feature_map_k", FeatureMap(k.feature_map, k.head_k_dim));
  feature_map_q->reset_init(k.init_std);
  feature_map_k->reset_init(k.init_std);
  if (k.use_output_norm) norm = register_module("norm", RMSNorm(k.head_v_dim, k.norm_eps));
  if (k.use_short_conv) {
    q_conv1d = register_module("q_conv1d", mixers::ShortConv(k.key_dim(), k.conv_size, k.conv_bias, true));
    k_conv1d = register_module("k_conv1d", mixers::ShortConv(k.kv_heads() * k.head_k_dim, k.conv_size, k.conv_bias, true));
    v_conv1d = register_module("v_conv1d", mixers::ShortConv(k.kv_heads() * k.head_v_dim, k.conv_size, k.conv_bias, true));
    mixers::linear_init(*q_conv1d, k.init_std);
    mixers::linear_init(*k_conv1d, k.init_std);
    mixers::linear_init(*v_conv1d, k.init_std);
  }
}

torch::Tensor LinearAttention::forward(const torch::Tensor& x, LayerState* state) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_heads, G = H / config.kv_heads();
  const mixers::MixerStep step(state, T);
  // One feature map serves every head, so it runs on the Hkv shared heads before they are spread; a decode step
  // reads them where they are (gla_recurrent's grouped KV heads).
  const int64_t spread = step.decode ? 1 : G;
  const auto in = inputs(x);  // q_proj, k_proj, v_proj: one matrix product once packed
  // q [B,T,H*Dk], k [B,T,Hkv*Dk], v [B,T,Hkv*Dv]
  auto qp = mixers::head_norm(q_norm, in[q_proj]), kp = mixers::head_norm(k_norm, in[k_proj]), vp = in[v_proj];
  if (config.use_short_conv) {
    qp = mixers::conv_step(q_conv1d, qp, step, "conv_q");
    kp = mixers::conv_step(k_conv1d, kp, step, "conv_k");
    vp = mixers::conv_step(v_conv1d, vp, step, "conv_v");
  }
  auto q = feature_map_q(mixers::split_heads(qp, H));                          // [B,T,H,Kf]
  auto k = feature_map_k(mixers::split_heads(kp, config.kv_heads()));          // [B,T,Hkv,Kf]
  if (config.norm_q) q = q / (q.sum(-1, true) + 1e-4);
  if (config.norm_k) k = k / (k.sum(-1, true) + 1e-4);
  k = mixers::repeat_heads(k, spread);
  auto v = mixers::repeat_heads(mixers::split_heads(vp, config.kv_heads()), spread);  // [B,T,H,Dv]
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));

  // ---- recurrent step (decode) / chunked form (whole sequence, prefill) ----
  auto r = step.decode ? ops::gla_recurrent(q, k, v, {}, step.get("S"), scale, step.in_place())
                       : ops::gla_chunk(q, k, v, {}, step.get("S"), scale, config.chunk_size);
  step.put("S", r.state);
  auto o = r.o;  // [B,T,H,Dv]
  if (config.feature_map_norm) {
    // z_t = z_0 + Σ_{u<=t} k_u per head, carried between calls as "Z" [B,H,Kf]
    auto z = mixers::repeat_heads(k, G / spread).to(torch::kFloat).cumsum(1);  // [B,T,H,Kf]
    if (auto z0 = step.get("Z"); z0.defined()) z = z + z0.unsqueeze(1);
    auto denom = (q.to(torch::kFloat) * scale * z).sum(-1, true) + 1e-10;  // [B,T,H,1]
    o = (o.to(torch::kFloat) / denom).to(o.scalar_type());
    step.put("Z", z.select(1, T - 1));
  }
  step.advance(T);

  if (norm) o = norm(o);
  return o_proj(o.reshape({B, T, H * config.head_v_dim}));
}

}  // namespace linearize
