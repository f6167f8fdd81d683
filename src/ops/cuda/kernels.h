// Fused CUDA kernels of the op families, compiled only in the GPU build (LINEARIZE_WITH_CUDA).
// Callers go through ops.h; ops/common.cpp decides when a kernel applies.
#pragma once
#include <torch/torch.h>

#include <utility>

namespace linearize::ops::cuda_kernels {

// One decode step of family A (beta undefined) or B (beta given), one launch for all heads:
//   S' = Diag(exp(g)) S;  u = v (A) or beta (v - S'^T k) (B);  S_new = S' + k u^T;  o = S_new^T (scale q)
// q, k [B,H,K], v [B,H,V] (fp32, fp16 or bf16); g undefined, [H], [B,H] or [B,H,K] log decay;
// beta [B,H]; S [B,H,K,V] fp32. Gates and state are read and written in fp32.
// Returns o [B,H,V] in v's dtype and S_new [B,H,K,V] fp32 (S itself is left untouched).
std::pair<torch::Tensor, torch::Tensor> recurrent_step(const torch::Tensor& q, const torch::Tensor& k,
                                                       const torch::Tensor& v, const torch::Tensor& g,
                                                       const torch::Tensor& beta, const torch::Tensor& S,
                                                       double scale);

}  // namespace linearize::ops::cuda_kernels
