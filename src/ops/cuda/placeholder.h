// An absent tensor passed to a fused kernel's autograd function (which cannot take undefined ones).
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// Custom autograd functions cannot take undefined tensors, so an absent input arrives as an empty
// placeholder; `present` turns it back into an undefined tensor.
inline torch::Tensor present(const torch::Tensor& t) { return t.numel() > 0 ? t : torch::Tensor(); }

}  // namespace linearize::ops::cuda_kernels
