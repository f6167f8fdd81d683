// Host entry points of ops/cuda/unit_lower_inverse.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// (I + L)^{-1} for L [..., C, C] strictly lower triangular (entries on and above the diagonal are not
// read), C <= kMaxInverseSize; fp32, no autograd (ops/chunk/triangular.cpp differentiates it).
constexpr int64_t kMaxInverseSize = 64;
torch::Tensor unit_lower_inverse(const torch::Tensor& L);

}  // namespace linearize::ops::cuda_kernels
