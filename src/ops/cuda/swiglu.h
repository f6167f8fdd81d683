// Host entry points of ops/cuda/swiglu.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The SwiGLU product z = silu(gate) ⊙ up element by element (ops/cuda/swiglu.cu), fp32 inside, rounded as
// `torch::silu(gate) * up`: gate and up of one shape and dtype (fp32, bf16 or fp16), contiguous.
bool swiglu_supported(torch::ScalarType dtype);
torch::Tensor swiglu_forward(const torch::Tensor& gate, const torch::Tensor& up);
// Its backward given dz (gate's shape and dtype, contiguous).
struct SwigluGrads {
  torch::Tensor dgate, dup;
};
SwigluGrads swiglu_backward(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& dz);

}  // namespace linearize::ops::cuda_kernels
