// Host-side launch helpers shared by the .cu files of ops/cuda (not for C++ callers: see kernels.h).
#pragma once
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

namespace linearize::ops::cuda_kernels {

// The fp32 data of an optional tensor: nullptr when it is undefined (the kernels test for that).
inline const float* ptr_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// A kernel that asks for more than the default 48 KiB of dynamic shared memory must say so first.
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace linearize::ops::cuda_kernels
