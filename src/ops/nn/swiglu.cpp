// The Llama MLP's SwiGLU product silu(gate) * up (see ops.h). On a kernel device one kernel each way
// (ops/cuda/swiglu.cu) behind an autograd node that keeps gate and up; elsewhere (or for shapes and dtypes
// the kernels do not take) the libtorch formula, which is the reference the kernels are tested against.
#include <torch/torch.h>

#include "ops/common.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops {

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  if (auto fused = detail::fused_swiglu(gate, up)) return *fused;
  return torch::silu(gate) * up;
}

}  // namespace linearize::ops
