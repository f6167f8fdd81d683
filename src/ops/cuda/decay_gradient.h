// Host entry points of ops/cuda/decay_gradient.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The scalar decay's gradient through a fused walk from its row sums (ops/cuda/decay_gradient.cu), as
// detail::walk_decay_gradient defines it: dot_q, dot_k [B,H,T], dot_w [B,H,N*chunk] or undefined,
// final_state and d_final (or undefined) [B,H,K,V], all fp32 contiguous -> dg [B,H,T] fp32. One launch;
// the chunk must divide the kernel's tile of 512 steps (decay_gradient_supported).
bool decay_gradient_supported(int64_t chunk);
torch::Tensor decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                             int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state);

}  // namespace linearize::ops::cuda_kernels
