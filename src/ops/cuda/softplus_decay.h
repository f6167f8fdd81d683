// Host entry points of ops/cuda/softplus_decay.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The log decay of Gated DeltaNet and KDA (ops/cuda/softplus_decay.cu): f [rows, C] (fp32, bf16 or fp16),
// C = H * K channels, channel c in head c / K (K = 1: one a head), dt_bias [C] and A_log [H] (both fp32 or
// both f's dtype), all contiguous:  g = -exp(A_log[c / K]) softplus(f + dt_bias[c])  in fp32.
bool softplus_decay_supported(torch::ScalarType f_dtype, torch::ScalarType dt_bias_dtype,
                              torch::ScalarType A_log_dtype);
torch::Tensor softplus_decay_forward(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log);
// Its backward given dg [rows, C] fp32 contiguous: df (f's dtype), d_dt_bias and dA_log (their dtypes),
// the sums over the rows taken in fp32 the same way on every run.
struct SoftplusDecayGrads {
  torch::Tensor df, d_dt_bias, dA_log;
};
SoftplusDecayGrads softplus_decay_backward(const torch::Tensor& f, const torch::Tensor& dt_bias,
                                           const torch::Tensor& A_log, const torch::Tensor& dg);

}  // namespace linearize::ops::cuda_kernels
