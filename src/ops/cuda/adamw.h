// Host entry points of ops/cuda/adamw.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


#include "ops/ops.h"

namespace linearize::ops::cuda_kernels {

// AdamW's update of many fp32 tensors in a few launches (ops/cuda/adamw.cu): ops::adamw_update's contract, with
// every tensor fp32, contiguous and on one device (adamw_supported: p and g such).
bool adamw_supported(const torch::Tensor& p, const torch::Tensor& g);
void adamw_update(const AdamWUpdate& update);

}  // namespace linearize::ops::cuda_kernels
