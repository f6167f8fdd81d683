// The mixers' short convolutions (see ops.h). On a kernel device one kernel each way (ops/cuda/short_conv.cu)
// behind an autograd node that keeps x, the weight, the bias and the prefix; elsewhere (or for widths and
// dtypes the kernels do not take, or a prefix that needs a gradient) the libtorch formula, which is the
// reference the kernels are tested against.
#include <torch/torch.h>

#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/placeholder.h"
#include "ops/cuda/short_conv.h"
#endif

namespace linearize::ops {

namespace {

#ifdef LINEARIZE_WITH_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [B, T, C], w [C, W], bias [C] or a placeholder, prefix [B, C, W-1] or a placeholder, all contiguous ->
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
#endif

// The formula: cat, a depthwise conv1d, silu.
ShortConvResult formula(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                        const torch::Tensor& prefix, bool silu, bool want_cache) {
  const int64_t B = x.size(0), C = x.size(2), W = weight.size(2);
  auto xt = x.transpose(1, 2);  // [B, C, T]
  auto before = prefix.defined() ? prefix.to(x.scalar_type()) : torch::zeros({B, C, W - 1}, x.options());
  auto xp = torch::cat({before, xt}, 2);  // [B, C, W-1+T]
  ShortConvResult out;
  if (want_cache) out.cache = xp.narrow(2, xp.size(2) - (W - 1), W - 1);  // [B, C, W-1]
  auto y = torch::conv1d(xp, weight.to(x.scalar_type()), bias.defined() ? bias.to(x.scalar_type()) : torch::Tensor(),
                         /*stride=*/at::IntArrayRef{1}, /*padding=*/at::IntArrayRef{0},
                         /*dilation=*/at::IntArrayRef{1}, /*groups=*/C);  // [B, C, T]
  y = y.transpose(1, 2);  // [B, T, C]
  out.y = silu ? torch::silu(y) : y;
  return out;
}

}  // namespace

ShortConvResult short_conv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                           const torch::Tensor& prefix, bool silu, bool want_cache) {
  TORCH_CHECK(x.dim() == 3 && weight.dim() == 3 && weight.size(0) == x.size(2) && weight.size(1) == 1,
              "short conv: expects x [B, T, C] and weight [C, 1, W]; got ", x.sizes(), " and ", weight.sizes());
#ifdef LINEARIZE_WITH_KERNELS
  const int64_t W = weight.size(2);
  const bool fused = fused_kernels_enabled() && on_kernel_device(x) && x.numel() > 0 &&
                     cuda_kernels::short_conv_supported(x.scalar_type(), weight.scalar_type(), W) &&
                     weight.device() == x.device() &&
                     (!bias.defined() || (bias.scalar_type() == weight.scalar_type() && bias.device() == x.device())) &&
                     (!prefix.defined() || (!prefix.requires_grad() && prefix.device() == x.device()));
  if (fused) {
    auto placeholder = torch::empty({0}, x.options());
    auto p = prefix.defined() ? prefix.to(x.scalar_type()).contiguous() : placeholder;
    auto r = ShortConvFunction::apply(x.contiguous(), weight.view({x.size(2), W}).contiguous(),
                                      bias.defined() ? bias.contiguous() : placeholder, p,
                                      silu, want_cache);
    return {r[0], want_cache ? r[1] : torch::Tensor()};
  }
#endif
  return formula(x, weight, bias, prefix, silu, want_cache);
}

}  // namespace linearize::ops
