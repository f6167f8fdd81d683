#include "compat/torch_compat.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include <cmath>

namespace linearize::compat {

namespace {

// Softmax attention with grouped KV heads under `mask` (bool, true = attend, broadcastable to [B,1,Tq,Tk]; undefined:
// every key), or causal (bottom-right aligned, flash on torch 2) when `causal` is set and no mask is given.
torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& mask, bool causal, double scale) {
  const int64_t B = q.size(0), H = q.size(1), tq = q.size(2), D = q.size(3), hkv = k.size(1), tk = k.size(2);
  TORCH_CHECK(hkv > 0 && H % hkv == 0 && v.size(1) == hkv, "attention: ", H, " query heads cannot share ", hkv,
              " key and ", v.size(1), " value heads");
  TORCH_CHECK(!mask.defined() || (mask.scalar_type() == torch::kBool && mask.dim() == 4 &&
                                   (mask.size(0) == 1 || mask.size(0) == B) && mask.size(1) == 1 &&
                                   mask.size(2) == tq && mask.size(3) == tk),
              "attention: expected a bool mask [", B, " or 1, 1, ", tq, ", ", tk, "], got ", mask.scalar_type(), " ",
              mask.sizes());
  const int64_t groups = H / hkv;
  torch::Tensor visible = mask;  // [B or 1, 1, Tq, Tk], true = attend
  // Keys visible to query i: 0 .. i + (Tk - Tq) (bottom-right aligned causal mask, as a KV cache needs).
  if (!visible.defined() && causal && tq > 1)
    visible = torch::ones({tq, tk}, q.options().dtype(torch::kBool)).tril(tk - tq).view({1, 1, tq, tk});
#if TORCH_VERSION_MAJOR >= 2
  // Flash takes grouped heads but no mask; with a mask the other kernels want the heads spread.
  if (!mask.defined() && causal && tq == tk) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale, groups > 1);
  }
  if (!visible.defined()) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale, groups > 1);
  auto spread = [&](const torch::Tensor& x) {
    return groups == 1 ? x : x.unsqueeze(2).expand({B, hkv, groups, tk, D}).reshape({B, H, tk, D});
  };
  return at::scaled_dot_product_attention(q, spread(k), spread(v), visible, 0.0, false, scale);
#else
  // The G query heads of a KV head as one [G*Tq, D] block against its keys: no copy of the KV heads.
  auto qg = q.reshape({B, hkv, groups * tq, D});
  auto scores = torch::matmul(qg, k.transpose(-2, -1)) * scale;  // [B,Hkv,G*Tq,Tk]
  if (visible.defined()) {
    scores = scores.view({B, hkv, groups, tq, tk}).masked_fill(visible.unsqueeze(2).logical_not(), -INFINITY)
                 .view_as(scores);
  }
  auto probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  return torch::matmul(probs, v).view({B, H, tq, D});  // [B,Hkv,G*Tq,D] -> [B,H,Tq,D]
#endif
}

}  // namespace

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, double scale) {
  return grouped_attention(q, k, v, torch::Tensor(), causal, scale);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double scale) {
  TORCH_CHECK(mask.defined(), "attention: the mask is undefined");
  return grouped_attention(q, k, v, mask, false, scale);
}

AutocastState autocast_state(torch::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return {at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
#else
  if (device == torch::kCUDA) return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
  return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
#endif
}

AutocastGuard::AutocastGuard(torch::DeviceType device, torch::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
#if TORCH_VERSION_MAJOR >= 2
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, dtype);
#else
  if (device_ == torch::kCUDA) {
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    prev_enabled_ = at::autocast::is_cpu_enabled();
    prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
#else
  if (device_ == torch::kCUDA) {
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
  } else {
    at::autocast::set_cpu_enabled(prev_enabled_);
    at::autocast::set_autocast_cpu_dtype(prev_dtype_);
  }
#endif
}

namespace {

void set_autocast_enabled(torch::DeviceType device, bool enabled) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == torch::kCUDA) at::autocast::set_enabled(enabled);
  else at::autocast::set_cpu_enabled(enabled);
#endif
}

}  // namespace

AutocastOffGuard::AutocastOffGuard(torch::DeviceType device)
    : device_(device), prev_enabled_(autocast_state(device).enabled) {
  set_autocast_enabled(device_, false);
}

AutocastOffGuard::~AutocastOffGuard() { set_autocast_enabled(device_, prev_enabled_); }

Tf32Guard::Tf32Guard(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  prev_ = at::globalContext().allowTF32CuBLAS();
  at::globalContext().setAllowTF32CuBLAS(true);
}

Tf32Guard::~Tf32Guard() {
  if (enabled_) at::globalContext().setAllowTF32CuBLAS(prev_);
}

}  // namespace linearize::compat
