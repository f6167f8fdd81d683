// The mixers' short convolutions through ops/cuda/short_conv.cu (nn.h, detail::fused_short_conv): one kernel
// each way behind an autograd node.
#include <optional>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"
#include "ops/cuda/placeholder.h"
#include "ops/cuda/short_conv.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [B, T, C] (each row contiguous), w [C, W], bias [C] or a placeholder, prefix [B, C, W-1] or a placeholder,
// these contiguous ->
// y [B, T, C], and the cache [B, C, W-1] (not differentiable; empty unless want_cache).
struct ShortConvFunction : public torch::autograd::Function<ShortConvFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& bias, const torch::Tensor& prefix, bool silu, bool want_cache) {
    using cuda_kernels::present;
    auto r = cuda_kernels::short_conv_forward(x, w, present(bias), present(prefix), silu, want_cache);
    ctx->save_for_backward({x, w, bias, prefix});
    ctx->saved_data["silu"] = silu;
    auto cache = want_cache ? r.cache : torch::empty({0}, x.options());
    ctx->mark_non_differentiable({cache});
    return {r.y, cache};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    using cuda_kernels::present;
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto dy = grads[0].defined() ? grads[0].to(x.scalar_type()).contiguous() : torch::zeros_like(x);
    auto r = cuda_kernels::short_conv_backward(x, saved[1], present(saved[2]), present(saved[3]), dy,
                                               ctx->saved_data["silu"].toBool());
    return {r.dx, r.dw, r.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// x as the kernels take it: each row's channels contiguous, the rows anywhere. A packed product's slice is
// read in place.
torch::Tensor rows_contiguous(const torch::Tensor& x) {
  return x.size(2) <= 1 || x.stride(2) == 1 ? x : x.contiguous();
}

}  // namespace

std::optional<ShortConvResult> fused_short_conv(const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& prefix, bool silu,
                                                bool want_cache, bool in_place) {
  const int64_t W = weight.size(2);
  const bool fused = fused_kernels_enabled() && on_kernel_device(x) && x.numel() > 0 &&
                     cuda_kernels::short_conv_supported(x.scalar_type(), weight.scalar_type(), W) &&
                     weight.device() == x.device() &&
                     (!bias.defined() || (bias.scalar_type() == weight.scalar_type() && bias.device() == x.device())) &&
                     (!prefix.defined() || (!prefix.requires_grad() && prefix.device() == x.device()));
  if (!fused) return std::nullopt;
  auto placeholder = torch::empty({0}, x.options());
  auto p = prefix.defined() ? prefix.to(x.scalar_type()).contiguous() : placeholder;
  if (in_place && p.is_same(prefix) && !torch::GradMode::is_enabled()) {  // one step, the new cache over the old
    auto r = cuda_kernels::short_conv_forward(rows_contiguous(x), weight.view({x.size(2), W}).contiguous(),
                                              bias.defined() ? bias.contiguous() : torch::Tensor(), p, silu,
                                              want_cache, /*cache_into_prefix=*/true);
    return ShortConvResult{r.y, r.cache};
  }
  auto r = ShortConvFunction::apply(rows_contiguous(x), weight.view({x.size(2), W}).contiguous(),
                                    bias.defined() ? bias.contiguous() : placeholder, p,
                                    silu, want_cache);
  return ShortConvResult{r[0], want_cache ? r[1] : torch::Tensor()};
}

}  // namespace linearize::ops::detail
