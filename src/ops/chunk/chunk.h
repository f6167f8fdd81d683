// What the chunked forms of the three mixer families share (internal to src/ops): the gated intra-chunk
// scores, the triangular solve, the state pass over chunks, the scalar decay's gradient through a fused
// walk, what the fused chunk kernels read, and the fused decode step of the GLA and delta-rule families.
// The fused_* functions live in fused_*.cpp files, compiled only in builds with kernels (ops/no_kernels.cpp
// answers "not available" otherwise); each returns nothing where its kernels do not apply.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <utility>
#include <vector>

#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

// S[..., r, j] = Σ_d X[..., r, d] Y[..., j, d] exp(G[..., r, d] - G[..., j, d]) for j <= r (j < r when
// strict), 0 elsewhere. X, Y [B,H,N,C,K]; G undefined (no decay), [B,H,N,C] (scalar) or [B,H,N,C,K]
// (vector) chunk-local cumulative log decay. Returns [B,H,N,C,C].
// The vector case splits each chunk into sub-chunks of 16 rows: off-diagonal sub-blocks factor around
// the first row of the query sub-block (both exponents <= 0); diagonal sub-blocks are computed pairwise.
torch::Tensor gated_scores(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                           bool strict);

// The diagonal c x c sub-blocks of the vector case: for X, Y, G [..., c, K] of one shape,
//   out[..., r, j] = Σ_d X[r,d] Y[j,d] exp(G[r,d] - G[j,d])  for j <= r (j < r when strict), 0 elsewhere,
// [..., c, c], one per X. The factors are taken pairwise, masked before the exp. On CUDA (fp32, c = 16,
// fused kernels on) one kernel each way keeps them in registers; elsewhere libtorch ops form them as
// [..., c, c, K].
std::vector<torch::Tensor> diagonal_block_scores(const std::vector<torch::Tensor>& Xs, const torch::Tensor& Y,
                                                 const torch::Tensor& G, bool strict);

// The same for several X against one Y and G: the decay factors are built once (the delta rule needs
// the scores of beta*K and of Q against K).
std::vector<torch::Tensor> gated_scores(const std::vector<torch::Tensor>& Xs, const torch::Tensor& Y,
                                        const torch::Tensor& G, bool strict);

// X = (I + L)^{-1} R for L [..., C, C] strictly lower triangular (what lies on and above the diagonal
// is ignored) and R [..., C, D]; differentiable in L and R. On CUDA (not fp64, C <= 64, fused kernels
// on) the inverse comes from one kernel and is applied as a batched product (bf16 under autocast);
// elsewhere linalg_solve_triangular.
torch::Tensor solve_unit_lower(const torch::Tensor& L, const torch::Tensor& R);

// The sequential part of the chunked forms of the GLA and delta-rule families, over N chunks of C:
//   S^(0) = S0;  X_n = U_n - W_n S^(n) (B; A: W undefined, X_n = U_n);  S^(n+1) = D_n ⊙ S^(n) + KdT_n X_n
// W [B,H,N,C,K] or undefined; U [B,H,N,C,V]; KdT [B,H,N,K,C]; D [B,H,N,K,1], [B,H,N,1,1] or undefined;
// S0 [B,H,K,V]. Returns every S^(n) [B,H,N,K,V], X [B,H,N,C,V] (the delta rule) and S^(N). Differentiable.
// On CUDA with fused kernels on (fp32): two kernels, one forward and one backward (ops/cuda).
struct StatePass {
  torch::Tensor states, writes, final_state;
};
StatePass state_pass(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                     const torch::Tensor& D, const torch::Tensor& S0);

// The 16-bit dtype the fused chunk kernels would run q, k, v in, or nothing when they cannot: CUDA, fused
// kernels on, chunk 64, q, k, v of one dtype that is bf16/fp16, or fp32 under bf16/fp16 autocast (the
// products then run in autocast's dtype, as the libtorch form would compute them). Each kernel file
// adds its own head-size check.
std::optional<torch::ScalarType> fused_chunk_dtype(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, int64_t chunk);

// What the fused chunk kernels read for the gate and the initial state. Custom autograd functions cannot
// take undefined tensors, so an absent one comes as an empty fp32 placeholder (cuda_kernels::present
// turns it back). kernel_gate: the per-step log decay [B,H,T] fp32 contiguous (None: the placeholder);
// kernel_state: h0 [B,H,K,V] fp32 at a 16-byte boundary. `like` gives the device.
torch::Tensor kernel_gate(const torch::Tensor& g, GateKind kind, int64_t B, int64_t T, const torch::TensorOptions& like);
torch::Tensor kernel_state(const torch::Tensor& h0, const torch::TensorOptions& like);

// The scalar decay's gradient through a fused walk (the GLA family's or the delta rule's), from the row sums
// its backward gives: with b_t the cumulative log decay, q_t enters as q_t e^{b_t}, k_t as k_t e^{-b_t},
// the final state as e^{b_T} times its undecayed form, and (delta rule) the rows w of chunk n as w e^{b}
// with b at the step before the chunk (W S reads the decayed state). So
//   dL/dg_s = Σ_{t>=s} (q_t·dq_t - k_t·dk_t) + Σ_{chunks n starting after s} Σ_{rows of n} w·dw + <dS_T, S_T>.
// dot_q, dot_k [B,H,T]; dot_w [B,H,N*chunk] or undefined (no w rows: the GLA family); d_final, final_state
// [B,H,K,V] (d_final may be undefined). Returns [B,H,T]. On CUDA one kernel (ops/cuda/decay_gradient.cu),
// elsewhere libtorch.
torch::Tensor walk_decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                                  int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state);

// One decode step (T = 1) of the GLA family (beta undefined) or B through the fused CUDA kernel, when it
// applies: CUDA tensors, not fp64, fused kernels on. Otherwise nothing, and the caller runs its
// libtorch form. Shapes as the recurrent ops: q, k [B,1,H,K], v [B,1,H,V], beta [B,1,H]; with groups > 1,
// k, v and a scalar or vector g have H / groups heads (gla_recurrent's grouped KV heads). gate_logits > 0: a
// vector g holds logits, the log decay being log_sigmoid(g) / gate_logits. beta_logit_scale > 0: beta holds
// logits, beta being beta_logit_scale sigmoid(beta); l2_eps > 0: q and k are L2-normalised as they are read
// (cuda_kernels::recurrent_step).
std::optional<OpResult> fused_decode_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                          const torch::Tensor& h0, double scale, int64_t groups = 1,
                                          bool in_place = false, double gate_logits = 0, double beta_logit_scale = 0,
                                          double l2_eps = 0);

// The kernels' forms of diagonal_block_scores, solve_unit_lower, state_pass, walk_decay_gradient and
// ops::softplus_decay, for the inputs they take (fused_*.cpp beside this header).
std::optional<std::vector<torch::Tensor>> fused_diagonal_block_scores(const std::vector<torch::Tensor>& Xs,
                                                                      const torch::Tensor& Y, const torch::Tensor& G,
                                                                      bool strict);
std::optional<torch::Tensor> fused_solve_unit_lower(const torch::Tensor& L, const torch::Tensor& R);
std::optional<StatePass> fused_state_pass(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                                          const torch::Tensor& D, const torch::Tensor& S0);
std::optional<torch::Tensor> fused_walk_decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k,
                                                       const torch::Tensor& dot_w, int64_t chunk,
                                                       const torch::Tensor& d_final, const torch::Tensor& final_state);
std::optional<torch::Tensor> fused_softplus_decay(const torch::Tensor& f, const torch::Tensor& dt_bias,
                                                  const torch::Tensor& A_log);

// Whether this build has kernels at all (the GPU build, or the CPU build's emulator): what
// ops::fused_kernels_enabled asks before its switch.
bool kernels_built();

}  // namespace linearize::ops::detail
