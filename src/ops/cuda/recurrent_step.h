// Host entry points of ops/cuda/recurrent_step.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>

#include <utility>

namespace linearize::ops::cuda_kernels {

// One decode step of the GLA family (beta undefined) or B (beta given), one launch for all heads:
//   S' = Diag(exp(g)) S;  u = v (A) or beta (v - S'^T k) (B);  S_new = S' + k u^T;  o = S_new^T (scale q)
// q, k [B,H,K], v [B,H,V] (fp32, fp16 or bf16; read in place when each batch row's heads are contiguous, as in
// a packed product's slices); g undefined, [H], [B,H] or [B,H,K] log decay;
// beta [B,H]; S [B,H,K,V] fp32. Gates and state are read and written in fp32. With groups > 1, k, v and a
// [B,H,K] or [B,H] g have Hkv = H / groups heads, query head h reading head h / groups (grouped KV heads,
// as repeat_heads spreads them). Returns o [B,H,V] in v's dtype and S_new [B,H,K,V] fp32: a new tensor (S left
// untouched), or with in_place S itself updated where it is fp32 and contiguous. gate_logits > 0: g is a
// [B,H,K] vector of logits in v's dtype (or fp32), the log decay being log_sigmoid(g) / gate_logits, computed
// in fp32 as it is read. beta_logit_scale > 0: beta [B,H] holds logits (any dtype; read in place where each
// row's heads are contiguous), beta being beta_logit_scale sigmoid(x). l2_eps > 0: q and k are read
// L2-normalised, x rsqrt(|x|^2 + l2_eps) in fp32 (ops::l2_norm without the rounding of its output).
std::pair<torch::Tensor, torch::Tensor> recurrent_step(const torch::Tensor& q, const torch::Tensor& k,
                                                       const torch::Tensor& v, const torch::Tensor& g,
                                                       const torch::Tensor& beta, const torch::Tensor& S,
                                                       double scale, int64_t groups = 1, bool in_place = false,
                                                       double gate_logits = 0, double beta_logit_scale = 0,
                                                       double l2_eps = 0);

}  // namespace linearize::ops::cuda_kernels
