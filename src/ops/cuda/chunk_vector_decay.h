// Host entry points of ops/cuda/chunk_vector_decay.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The GLA family with a decay per key channel (GLA), head size 64, chunks of 64, in two fused parts that the
// caller joins (ops/gla/fused_vector_chunk.cpp). The caller's rows are [B,T,H,64]
// contiguous; what passes from the first part to the second is heads first and padded to whole chunks,
// [B,H,N*64,64] with N = ceil(T / 64).
bool vector_decay_chunk_supported(int64_t K, int64_t V, torch::ScalarType dt);
// Whether the walks below take K key channels (64 or 128; the values always 64 columns) in dt.
bool vector_walk_supported(int64_t K, torch::ScalarType dt);

// The walk over the chunks (ops/cuda/chunk_vector_decay.cu): o = qd S + A v, S' = Diag(a) S + kd^T v per
// chunk. qd, kd [B,Hk,N*64,K] (K = 64 or 128) and v [B,T,H,64], contiguous (one 16-bit dtype), with H = p Hk:
// heads of values p h .. p h + p - 1 share key head h's keys (the value parts of one head of more than 64
// value columns); A [B,Hk,N,64,64] (the same dtype, zeros above the diagonal as
// vector_scores_forward gives it); a [B,Hk,N,K] fp32 (the chunk's decay per key channel); h0 [B,H,K,64] fp32
// or undefined. Returns o [B,T,H,64] (v's dtype), the final state fp32 and the state entering every chunk
// [B,H,N,K,64] (16-bit, for the backward).
struct VectorWalkForward {
  torch::Tensor o, final_state, states;
};
VectorWalkForward vector_walk_forward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& v,
                                      const torch::Tensor& A, const torch::Tensor& a, const torch::Tensor& h0);
// Its backward given d_out [B,T,H,64] (v's dtype) and d_final fp32 or undefined: dqd, dkd, dA (zeros above
// the diagonal; the three summed over a key head's value heads), dv [B,T,H,64] (all 16-bit), da (fp32) and,
// when asked, dLoss/dh0.
struct VectorWalkGrads {
  torch::Tensor dqd, dkd, dv, dw, dA, da, d_initial;  // dw: the delta rule's walk only
};
VectorWalkGrads vector_walk_backward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& v,
                                     const torch::Tensor& A, const torch::Tensor& a, const torch::Tensor& states,
                                     const torch::Tensor& d_out, const torch::Tensor& d_final, bool want_d_initial);

// The same walk for the delta rule with a decay per key channel (Kimi Delta Attention; ops/delta_rule/
// fused_vector_chunk.cpp): the values are the corrected writes V' = U - W S of each chunk, so
//   o = qd S + A V',   S' = Diag(a) S + kd^T V'.
// qd, kd as above (qd = scale e^G ⊙ q, kd = e^{Gl - G} ⊙ k), A the scaled q-k scores; w [B,Hk,N*64,K], u
// [B,H,N*64,64] (the UT transform's W = (I + L)^{-1} diag(beta) (e^G ⊙ k) and U = (I + L)^{-1} diag(beta) v,
// zero past T), all one 16-bit dtype; T the sequence length. Returns o [B,T,H,64], the final state and the
// states.
VectorWalkForward vector_delta_walk_forward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& w,
                                            const torch::Tensor& u, const torch::Tensor& A, const torch::Tensor& a,
                                            const torch::Tensor& h0, int64_t T);
// Its backward: dqd, dkd, dA, da, d_initial as above, and dv = dU [B,H,N*64,64], dw = dW [B,H,N*64,K].
VectorWalkGrads vector_delta_walk_backward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& w,
                                           const torch::Tensor& u, const torch::Tensor& A, const torch::Tensor& a,
                                           const torch::Tensor& states, const torch::Tensor& d_out,
                                           const torch::Tensor& d_final, bool want_d_initial);

}  // namespace linearize::ops::cuda_kernels
