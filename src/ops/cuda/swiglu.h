// Host entry points of ops/cuda/swiglu.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The SwiGLU product z = silu(gate) ⊙ up element by element (ops/cuda/swiglu.cu), fp32 inside, rounded as
// `torch::silu(gate) * up`: gate and up of one shape and dtype (fp32, bf16 or fp16), contiguous.
bool swiglu_supported(torch::ScalarType dtype);
torch::Tensor swiglu_forward(const torch::Tensor& gate, const torch::Tensor& up);
// The forward of gate and up given as rows of contiguous elements anywhere (a packed product's halves, each
// [..., I] inside rows of 2 I), with no gradient: z [..., I] contiguous, the same values as swiglu_forward on
// contiguous copies. swiglu_row_stride: the distance between t's rows, or -1 when its leading dimensions do not
// fold into rows of one stride.
int64_t swiglu_row_stride(const torch::Tensor& t);
torch::Tensor swiglu_rows_forward(const torch::Tensor& gate, const torch::Tensor& up);
// Its backward given dz (gate's shape and dtype, contiguous).
struct SwigluGrads {
  torch::Tensor dgate, dup;
};
SwigluGrads swiglu_backward(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& dz);

}  // namespace linearize::ops::cuda_kernels
