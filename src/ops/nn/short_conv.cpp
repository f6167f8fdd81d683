// The mixers' short convolutions (see ops.h). On a kernel device one kernel each way (ops/cuda/short_conv.cu)
// behind an autograd node that keeps x, the weight, the bias and the prefix; elsewhere (or for widths and
// dtypes the kernels do not take, or a prefix that needs a gradient) the libtorch formula, which is the
// reference the kernels are tested against.
#include <torch/torch.h>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops {

namespace {

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
                           const torch::Tensor& prefix, bool silu, bool want_cache, bool in_place) {
  TORCH_CHECK(x.dim() == 3 && weight.dim() == 3 && weight.size(0) == x.size(2) && weight.size(1) == 1,
              "short conv: expects x [B, T, C] and weight [C, 1, W]; got ", x.sizes(), " and ", weight.sizes());
  in_place = in_place && want_cache && x.size(1) == 1;
  if (auto fused = detail::fused_short_conv(x, weight, bias, prefix, silu, want_cache, in_place)) return *fused;
  auto out = formula(x, weight, bias, prefix, silu, want_cache);
  if (want_cache) out.cache = detail::returned_state(prefix, out.cache, in_place);
  return out;
}

}  // namespace linearize::ops
