// Host-side launch helpers shared by the .cu files of ops/cuda (not for C++ callers: each .cu file has its own header).
#pragma once
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <utility>

namespace linearize::ops::cuda_kernels {

// The fp32 data of an optional tensor: nullptr when it is undefined (the kernels test for that).
inline const float* ptr_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
// The same for an optional fp32 output the kernel writes.
inline float* out_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// A kernel that asks for more than the default 48 KiB of dynamic shared memory must say so first.
// The emulated build (emulation/simt.h) runs the grid on the CPU, and has no such limit.
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
#ifndef LINEARIZE_CUDA_EMULATION
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
#endif
}

// kernel<<<grid, block, smem>>>(args...) on the current stream, after allowing the shared memory it asks
// for; a failed launch throws.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
#ifdef LINEARIZE_CUDA_EMULATION
  linearize::simt::launch(grid, block, smem, [&] { kernel(args...); });
#else
  allow_dynamic_smem(kernel, smem);
  kernel<<<grid, block, smem, at::cuda::getCurrentCUDAStream()>>>(std::forward<Args>(args)...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
#endif
}

// Calls fn with a value of the kernels' element type for dt: __nv_bfloat16 for bf16, __half otherwise
// (callers check first that dt is one of the two).
template <typename Fn>
void dispatch_16bit(torch::ScalarType dt, Fn fn) {
  if (dt == torch::kBFloat16) fn(__nv_bfloat16{});
  else fn(__half{});
}

// A 16-bit tensor's data as the kernels' element type E.
template <typename E>
E* data_as(const torch::Tensor& t) {
  return reinterpret_cast<E*>(t.data_ptr());
}

// The same for an optional input: nullptr when it is undefined.
template <typename E>
const E* data_or_null(const torch::Tensor& t) {
  return t.defined() ? data_as<E>(t) : nullptr;
}

// The blocks' partial results of `parts` heads added up: x [B, G parts, ...] -> [B, G, ...] (x itself when parts
// is 1). Two parts as one element-wise add, which reads both at full speed where libtorch's reduction over a
// middle dimension of 2 does not; the same fp32 sum, rounded once.
inline torch::Tensor add_up_parts(const torch::Tensor& x, int64_t parts) {
  if (parts == 1) return x;
  auto shape = x.sizes().vec(), split = shape;
  shape[1] /= parts;
  split[1] = parts;
  split.insert(split.begin() + 1, shape[1]);
  const auto by_part = x.view(split);
  if (parts == 2) return (by_part.select(2, 0) + by_part.select(2, 1)).view(shape);
  return by_part.sum(2).view(shape);
}

}  // namespace linearize::ops::cuda_kernels
