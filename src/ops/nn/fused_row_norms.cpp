// RMS and L2 norms through ops/cuda/row_norms.cu (nn.h, detail::fused_row_norm): one kernel each way behind
// an autograd node that keeps x, the weight and the per-row factor.
#include <optional>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"
#include "ops/cuda/placeholder.h"
#include "ops/cuda/row_norms.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [rows, D] contiguous or [G, H, D] (grouped_rows), weight [D] or an empty placeholder (none), gate likewise
// or a placeholder (none, then act is Gate::none) -> y [rows, D].
struct RowNormFunction : public torch::autograd::Function<RowNormFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& gate, double mean_scale, double eps, int64_t act) {
    auto r = cuda_kernels::row_norm_forward(x, cuda_kernels::present(weight), mean_scale, eps,
                                            cuda_kernels::present(gate), static_cast<Gate>(act));
    ctx->save_for_backward({x, weight, gate, r.rstd});
    ctx->saved_data["mean_scale"] = mean_scale;
    ctx->saved_data["act"] = act;
    return {r.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &rstd = saved[3];
    const auto weight = cuda_kernels::present(saved[1]), gate = cuda_kernels::present(saved[2]);
    const auto y_dtype = weight.defined() ? at::promote_types(x.scalar_type(), weight.scalar_type()) : x.scalar_type();
    const auto dy = grads[0].to(y_dtype).contiguous();
    auto r = cuda_kernels::row_norm_backward(x, weight, rstd, dy, ctx->saved_data["mean_scale"].toDouble(),
                                             weight.defined() && ctx->needs_input_grad(1), gate,
                                             static_cast<Gate>(ctx->saved_data["act"].toInt()));
    const auto dgate = r.dgate.defined() ? r.dgate.view(gate.sizes()) : r.dgate;
    return {r.dx.view(x.sizes()), r.dw, dgate, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// t [..., D] as the kernels read it without a copy: [rows, D] when contiguous, else, when no gradient flows
// back to it (decoding), [G, H, D] when each group of its last-but-one dimension's H rows is contiguous and
// the groups lie one stride apart (a packed product's heads, say [B, 1, H, D] of rows wider than H D); a
// contiguous copy otherwise (training keeps the copy's cheap backward rather than as_strided's).
torch::Tensor grouped_rows(const torch::Tensor& t) {
  const int64_t D = t.size(-1);
  if (t.is_contiguous() || t.dim() < 2) return t.contiguous().view({-1, D});
  if (torch::GradMode::is_enabled() && t.requires_grad()) return t.contiguous().view({-1, D});
  const int64_t H = t.size(-2);
  if ((D > 1 && t.stride(-1) != 1) || (H > 1 && t.stride(-2) != D)) return t.contiguous().view({-1, D});
  // The leading dimensions must fold into one: each (of more than one entry) its next one's size times stride.
  int64_t groups = 1, stride = H * D, inner = -1;  // inner: the stride of the last foldable dimension so far
  for (int64_t i = t.dim() - 3; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (inner >= 0 && t.stride(i) != inner) return t.contiguous().view({-1, D});
    if (inner < 0) stride = t.stride(i);
    inner = t.stride(i) * t.size(i);
    groups *= t.size(i);
  }
  return t.as_strided({groups, H, D}, {stride, D, 1});
}

}  // namespace

// The kernels' form of a norm of x over its last dim with weight (or none), times act(gate) where act is
// not none, or nothing where they do not apply.
std::optional<torch::Tensor> fused_row_norm(const torch::Tensor& x, const torch::Tensor& weight, double mean_scale,
                                            double eps, const torch::Tensor& gate, Gate act) {
  if (!fused_kernels_enabled() || !on_kernel_device(x) || x.dim() < 1 || x.numel() == 0) return std::nullopt;
  const int64_t D = x.size(-1);
  if (weight.defined() && (weight.dim() != 1 || weight.size(0) != D || weight.device() != x.device()))
    return std::nullopt;
  if (!cuda_kernels::row_norm_supported(x.scalar_type(), weight.defined() ? weight.scalar_type() : x.scalar_type(), D))
    return std::nullopt;
  if (act != Gate::none &&
      (gate.sizes() != x.sizes() || gate.scalar_type() != x.scalar_type() || gate.device() != x.device()))
    return std::nullopt;
  auto placeholder = torch::empty({0}, x.options());
  auto w = weight.defined() ? weight.contiguous() : placeholder;
  auto g = act != Gate::none ? grouped_rows(gate) : placeholder;
  auto y = RowNormFunction::apply(grouped_rows(x), w, g, mean_scale, eps, static_cast<int64_t>(act))[0];
  return y.view(x.sizes());
}

std::optional<AddNorm> fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                          const torch::Tensor& weight, double eps) {
  if (!fused_kernels_enabled() || !on_kernel_device(x) || x.dim() < 1 || x.numel() == 0) return std::nullopt;
  if (torch::GradMode::is_enabled() && (x.requires_grad() || residual.requires_grad() || weight.requires_grad()))
    return std::nullopt;  // the forward kernel only
  const int64_t D = x.size(-1);
  if (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() || residual.device() != x.device() ||
      !x.is_contiguous() || !residual.is_contiguous() || weight.dim() != 1 || weight.size(0) != D ||
      weight.device() != x.device() || !cuda_kernels::row_norm_supported(x.scalar_type(), weight.scalar_type(), D))
    return std::nullopt;
  auto r = cuda_kernels::row_norm_forward(x.view({-1, D}), weight.contiguous(), 1.0 / static_cast<double>(D), eps, {},
                                          Gate::none, residual.view({-1, D}));
  return AddNorm{r.sum.view(x.sizes()), r.y.view(x.sizes())};
}

}  // namespace linearize::ops::detail
