// The Llama MLP's SwiGLU product silu(gate) * up (see ops.h). On a kernel device one kernel each way
// (ops/cuda/swiglu.cu) behind an autograd node that keeps gate and up; elsewhere (or for shapes and dtypes
// the kernels do not take) the libtorch formula, which is the reference the kernels are tested against.
#include <torch/torch.h>

#include "ops/common.h"
#include "ops/ops.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/swiglu.h"
#endif

namespace linearize::ops {

namespace {

#ifdef LINEARIZE_WITH_KERNELS
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
#endif

bool kernel_applies(const torch::Tensor& gate, const torch::Tensor& up) {
#ifdef LINEARIZE_WITH_KERNELS
  return fused_kernels_enabled() && on_kernel_device(gate) && gate.numel() > 0 && up.sizes() == gate.sizes() &&
         up.scalar_type() == gate.scalar_type() && up.device() == gate.device() &&
         cuda_kernels::swiglu_supported(gate.scalar_type());
#else
  (void)gate, (void)up;
  return false;
#endif
}

}  // namespace

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
#ifdef LINEARIZE_WITH_KERNELS
  if (kernel_applies(gate, up)) return SwigluFunction::apply(gate.contiguous(), up.contiguous())[0];
#endif
  return torch::silu(gate) * up;
}

}  // namespace linearize::ops
