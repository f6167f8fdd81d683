// Building blocks shared by the mixer layers (see blocks.h).
#include "model/mixers/blocks.h"

#include <cmath>

#include "ops/ops.h"

namespace linearize::mixers {

ShortConvImpl::ShortConvImpl(int64_t channels, int64_t width_, bool with_bias, bool silu_)
    : width(width_), silu(silu_) {
  weight = register_parameter("weight", torch::randn({channels, 1, width}) * 0.02);
  if (with_bias) bias = register_parameter("bias", torch::zeros({channels}));
}

void ShortConvImpl::init_identity() {
  torch::NoGradGuard no_grad;
  weight.zero_();
  weight.select(2, width - 1).fill_(1.0);
  if (bias.defined()) bias.zero_();
}

torch::Tensor ShortConvImpl::forward(const torch::Tensor& x, const torch::Tensor& cache, torch::Tensor* new_cache,
                                     bool in_place) {
  auto r = ops::short_conv(x, weight, bias, cache, silu, new_cache != nullptr, in_place);
  if (new_cache) *new_cache = r.cache;
  return r.y;
}

torch::nn::Sequential low_rank(int64_t in, int64_t rank, int64_t out, bool out_bias) {
  return torch::nn::Sequential(torch::nn::Linear(torch::nn::LinearOptions(in, rank).bias(false)),
                               torch::nn::Linear(torch::nn::LinearOptions(rank, out).bias(out_bias)));
}

torch::nn::Linear low_rank_stage(const torch::nn::Sequential& s, size_t stage) {
  return torch::nn::Linear(s->ptr<torch::nn::LinearImpl>(stage));
}

torch::Tensor split_heads(const torch::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads});
}

torch::Tensor repeat_heads(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto B = x.size(0), T = x.size(1), Hkv = x.size(2), D = x.size(3);
  return x.unsqueeze(3).expand({B, T, Hkv, groups, D}).reshape({B, T, Hkv * groups, D});
}

void linear_init(torch::nn::Module& m, double std) {
  torch::NoGradGuard no_grad;
  for (auto& child : m.modules(/*include_self=*/false)) {  // callable from constructors
    if (auto* lin = child->as<torch::nn::Linear>()) {
      lin->weight.normal_(0.0, std);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* conv = child->as<ShortConv>()) {
      conv->weight.normal_(0.0, std);
      if (conv->bias.defined()) conv->bias.zero_();
    }
  }
}

torch::Tensor dt_bias_init(int64_t n, const std::string& kind) {
  if (kind == "zeros") return torch::zeros({n});
  auto dt = torch::exp(torch::rand({n}) * (std::log(1e-1) - std::log(1e-3)) + std::log(1e-3)).clamp_min(1e-4);
  return dt + torch::log(-torch::expm1(-dt));
}

torch::Tensor conv_step(ShortConv& conv, const torch::Tensor& x, const MixerStep& step, const std::string& name) {
  torch::Tensor cache;
  auto y = conv->forward(x, step.get(name), step.state ? &cache : nullptr, step.in_place());
  step.put(name, cache);
  return y;
}

DeltaQKV delta_rule_qkv(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool use_conv, ShortConv& q_conv,
                        ShortConv& k_conv, ShortConv& v_conv, const MixerStep& step, int64_t heads,
                        int64_t value_heads, bool normalise) {
  if (use_conv) {
    q = conv_step(q_conv, q, step, "conv_q");
    k = conv_step(k_conv, k, step, "conv_k");
    v = conv_step(v_conv, v, step, "conv_v");
  } else {
    q = torch::silu(q), k = torch::silu(k), v = torch::silu(v);
  }
  const int64_t groups = value_heads / heads;
  auto norm = [&](const torch::Tensor& x) { return normalise ? ops::l2_norm(x) : x; };
  return {repeat_heads(norm(split_heads(q, heads)), groups),   // [B,T,HV,Dk]
          repeat_heads(norm(split_heads(k, heads)), groups),   // [B,T,HV,Dk]
          split_heads(v, value_heads)};                        // [B,T,HV,Dv]
}

torch::Tensor head_norm(RMSNorm& norm, const torch::Tensor& y) {
  if (!norm) return y;
  const int64_t d = norm->weight.size(0);
  auto sizes = y.sizes().vec();
  sizes.back() /= d;
  sizes.push_back(d);
  return norm(y.view(sizes)).view(y.sizes());
}

}  // namespace linearize::mixers
