// Host entry points of ops/cuda/distill_loss.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The per-token terms of stage-3 distillation (ops/cuda/distill_loss.cu): student logits s and teacher logits t
// [N, V] of one dtype (fp32, bf16 or fp16), targets y [N] int64, all contiguous on one device, temperature T > 0:
//   ce[i] = lse(s_i) - s_i[y_i] (0 where y_i is outside [0, V)),   kl[i] = KL(softmax(t_i / T) || softmax(s_i / T))
// fp32 [N], with lse [3, N] fp32 (lse(s), lse(s/T), lse(t/T)) for the backward. With t undefined (plain
// next-token training) ce alone, kl undefined and lse [1, N]; the backward then takes dkl undefined.
bool distill_loss_supported(torch::ScalarType dtype);
struct DistillLossForward {
  torch::Tensor ce, kl, lse;
};
DistillLossForward distill_loss_forward(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y,
                                        double temperature);
// The gradient of Σ_i dce[i] ce[i] + dkl[i] kl[i] in s (s's dtype), given dce, dkl [N] fp32 and the forward's lse.
torch::Tensor distill_loss_backward(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y,
                                    const torch::Tensor& lse, const torch::Tensor& dce, const torch::Tensor& dkl,
                                    double temperature);

}  // namespace linearize::ops::cuda_kernels
