// The SwiGLU product through ops/cuda/swiglu.cu (nn.h, detail::fused_swiglu): one kernel each way behind
// an autograd node that keeps gate and up.
#include <optional>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"
#include "ops/cuda/swiglu.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// gate, up of one shape and dtype, contiguous -> silu(gate) * up.
struct SwigluFunction : public torch::autograd::Function<SwigluFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& gate, const torch::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return {cuda_kernels::swiglu_forward(gate, up)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dz = grads[0].to(saved[0].scalar_type()).contiguous();
    auto r = cuda_kernels::swiglu_backward(saved[0], saved[1], dz);
    return {r.dgate, r.dup};
  }
};

}  // namespace

std::optional<torch::Tensor> fused_swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  const bool applies = fused_kernels_enabled() && on_kernel_device(gate) && gate.numel() > 0 &&
                       up.sizes() == gate.sizes() && up.scalar_type() == gate.scalar_type() &&
                       up.device() == gate.device() && cuda_kernels::swiglu_supported(gate.scalar_type());
  if (!applies) return std::nullopt;
  // Strided views (a packed product's halves) without gradients: one launch reads them in place where their
  // rows fold into one stride; otherwise the formula's two launches read them as they are, where the
  // kernel would need a copy of each first.
  const bool strided = !gate.is_contiguous() || !up.is_contiguous();
  const bool grads = torch::GradMode::is_enabled() && (gate.requires_grad() || up.requires_grad());
  if (strided && !grads) {
    if (cuda_kernels::swiglu_row_stride(gate) < 0 || cuda_kernels::swiglu_row_stride(up) < 0) return std::nullopt;
    return cuda_kernels::swiglu_rows_forward(gate, up);
  }
  return SwigluFunction::apply(gate.contiguous(), up.contiguous())[0];
}

}  // namespace linearize::ops::detail
