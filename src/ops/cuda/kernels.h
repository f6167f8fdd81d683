// Fused CUDA kernels of the op families, compiled in the GPU build (LINEARIZE_WITH_CUDA) and, for the CPU
// build's tests, as C++ for the SIMT emulator (LINEARIZE_CUDA_EMULATION, ops/cuda/emulation/simt.h); both
// define LINEARIZE_WITH_KERNELS. Callers go through ops.h; ops/common.cpp decides when a kernel applies.
#pragma once
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "ops/common.h"

namespace linearize::ops::cuda_kernels {

// Custom autograd functions cannot take undefined tensors, so an absent input arrives as an empty
// placeholder; `present` turns it back into an undefined tensor.
inline torch::Tensor present(const torch::Tensor& t) { return t.numel() > 0 ? t : torch::Tensor(); }

// One decode step of family A (beta undefined) or B (beta given), one launch for all heads:
//   S' = Diag(exp(g)) S;  u = v (A) or beta (v - S'^T k) (B);  S_new = S' + k u^T;  o = S_new^T (scale q)
// q, k [B,H,K], v [B,H,V] (fp32, fp16 or bf16); g undefined, [H], [B,H] or [B,H,K] log decay;
// beta [B,H]; S [B,H,K,V] fp32. Gates and state are read and written in fp32. With groups > 1, k, v and a
// [B,H,K] or [B,H] g have Hkv = H / groups heads, query head h reading head h / groups (grouped KV heads,
// as repeat_heads spreads them). Returns o [B,H,V] in v's dtype and S_new [B,H,K,V] fp32 (S itself is left
// untouched).
std::pair<torch::Tensor, torch::Tensor> recurrent_step(const torch::Tensor& q, const torch::Tensor& k,
                                                       const torch::Tensor& v, const torch::Tensor& g,
                                                       const torch::Tensor& beta, const torch::Tensor& S,
                                                       double scale, int64_t groups = 1);

// The chunk-to-chunk state pass of the chunked forms (fp32; inner shapes [B, H, N, ...], N chunks of C).
//
// Family B (delta rule), the products inside the walk:
//   S^(0) = S0 (zeros when undefined)
//   X_n = U_n - W_n S^(n)
//   S^(n+1) = Diag(D_n) S^(n) + KdT_n X_n
// W [B,H,N,C,K]; U [B,H,N,C,V]; KdT [B,H,N,K,C]; D [B,H,N,K] or undefined (no decay); S0 [B,H,K,V] or
// undefined. Returns S^(n) for every n (the state entering chunk n), X and S^(N).
detail::StatePass delta_pass_forward(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                                     const torch::Tensor& D, const torch::Tensor& S0);

// Its reverse pass, given the gradients of the three outputs (each may be undefined): lambda[n] =
// dLoss/dS^(n+1), d_writes_total[n] = dLoss/dX_n (through every path) and d_initial = dLoss/dS0. The
// gradients of W, U, KdT and D follow from these with batched products (ops/state_pass.cpp).
struct StatePassGrads {
  torch::Tensor lambda, d_writes_total, d_initial;
};
StatePassGrads delta_pass_backward(const torch::Tensor& W, const torch::Tensor& KdT, const torch::Tensor& D,
                                   const torch::Tensor& d_states, const torch::Tensor& d_writes,
                                   const torch::Tensor& d_final, int64_t V);

// Family A, the decayed scan over chunk contributions dS [B,H,N,K,V] (the caller's batched KdT_n U_n):
//   S^(n+1) = Diag(D_n) S^(n) + dS_n.  Returns every S^(n) [B,H,N,K,V] and S^(N) [B,H,K,V].
std::pair<torch::Tensor, torch::Tensor> decay_scan_forward(const torch::Tensor& dS, const torch::Tensor& D,
                                                           const torch::Tensor& S0);
// Its reverse: lambda[n] = dLoss/dS^(n+1) [B,H,N,K,V] (also the gradient of dS_n) and dLoss/dS0.
// d_states and d_final may be undefined (no gradient).
std::pair<torch::Tensor, torch::Tensor> decay_scan_backward(const torch::Tensor& D, const torch::Tensor& d_states,
                                                            const torch::Tensor& d_final, int64_t B, int64_t H,
                                                            int64_t N, int64_t K, int64_t V,
                                                            const torch::TensorOptions& opts);

// Diagonal sub-blocks of the vector-gated scores (common.h, detail::diagonal_block_scores), fp32:
//   out[m, r, j] = Σ_d X[m,r,d] Y[m,j,d] exp(G[m,r,d] - G[m,j,d])  for j <= r (j < r when strict), else 0
// X, Y, G contiguous [..., 16, K] of one shape (16 rows per sub-chunk); out [..., 16, 16].
torch::Tensor diagonal_scores_forward(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                                      bool strict);
struct DiagonalScoresGrads {
  torch::Tensor dX, dY, dG;
};
DiagonalScoresGrads diagonal_scores_backward(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                                             const torch::Tensor& d_out, bool strict);

// (I + L)^{-1} for L [..., C, C] strictly lower triangular (entries on and above the diagonal are not
// read), C <= kMaxInverseSize; fp32, no autograd (ops/triangular.cpp differentiates it).
constexpr int64_t kMaxInverseSize = 64;
torch::Tensor unit_lower_inverse(const torch::Tensor& L);

// The scalar decay's gradient through a fused walk from its row sums (ops/cuda/decay_gradient.cu), as
// detail::walk_decay_gradient defines it: dot_q, dot_k [B,H,T], dot_w [B,H,N*chunk] or undefined,
// final_state and d_final (or undefined) [B,H,K,V], all fp32 contiguous -> dg [B,H,T] fp32. One launch;
// the chunk must divide the kernel's tile of 512 steps (decay_gradient_supported).
bool decay_gradient_supported(int64_t chunk);
torch::Tensor decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                             int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state);

// Family A with no decay or a scalar decay per step, chunked (C = 64) and fused: one block per (batch,
// head) walks the chunks with the state in shared memory, products on tensor cores (ops/cuda/
// chunk_scalar_decay.cu). q, k [B,T,H,K], v [B,T,H,V] contiguous, one 16-bit dtype; g [B,H,T] fp32 per-step
// log decay (undefined: none); h0 [B,H,K,V] fp32 contiguous or undefined. Returns o [B,T,H,V] (v's
// dtype) and the final state [B,H,K,V] fp32.
// Supported: K = V = 64 or 128, bf16 or fp16.
bool scalar_decay_chunk_supported(int64_t K, int64_t V, torch::ScalarType dt);
std::pair<torch::Tensor, torch::Tensor> scalar_decay_chunk_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                   const torch::Tensor& v, const torch::Tensor& g,
                                                                   const torch::Tensor& h0, double scale);
// Its backward given d_out [B,T,H,V] (q's dtype, contiguous) and d_final [B,H,K,V] fp32 contiguous or
// undefined: dq, dk, dv (q's dtype) and, when asked, dLoss/dh0 (fp32) and the row sums q_t·dq_t and
// k_t·dk_t [B,H,T] (fp32, taken before dq and dk are rounded), from which the decay's gradient follows:
// dg_t = Σ_{s >= t} (q_s·dq_s - k_s·dk_s) + <d_final, final state>.
struct ScalarDecayChunkGrads {
  torch::Tensor dq, dk, dv, d_initial, dot_q, dot_k;
};
ScalarDecayChunkGrads scalar_decay_chunk_backward(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v, const torch::Tensor& g,
                                                  const torch::Tensor& h0, const torch::Tensor& d_out,
                                                  const torch::Tensor& d_final, double scale, bool want_d_initial,
                                                  bool want_row_dots);

// Family B with no decay or a scalar decay per step: the walk over the chunks (C = 64) from the UT
// transform's W and U on, fused (ops/cuda/chunk_delta_rule.cu): V' = U - W S, o = (scale e^G q) S + A V',
// S' = e^Gl S + (e^{Gl-G} k)^T V'. q, k [B,T,H,64] contiguous; w, u [B,H,N*64,64] contiguous (the UT
// transform's rows, zero past T), all one 16-bit dtype; g [B,H,T] fp32 per-step log decay or undefined;
// h0 [B,H,64,64] fp32 or undefined. Returns o [B,T,H,64] (q's dtype), the final state fp32 and, for the
// backward, the state entering every chunk and every chunk's masked scores A [B,H,N,64,64] (the 16-byte words
// that reach the diagonal or below; the rest is left unwritten) and the corrected values V' [B,H,N*64,64]
// (all in q's dtype).
bool delta_walk_supported(int64_t K, int64_t V, torch::ScalarType dt);
struct DeltaWalkForward {
  torch::Tensor o, final_state, states, scores, values;
};
DeltaWalkForward delta_walk_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                    const torch::Tensor& u, const torch::Tensor& g, const torch::Tensor& h0,
                                    double scale);
// Its backward given what the forward returned (o and the final state aside), d_out [B,T,H,64] (q's
// dtype) and d_final fp32 or undefined: dq, dk, dw, du (q's dtype) and, when asked, dLoss/dh0 and the row
// sums q·dq, k·dk [B,H,T] and w·dw [B,H,N*64] (fp32, taken before the gradients are rounded), from which
// the decay's gradient follows (detail::walk_decay_gradient).
struct DeltaWalkGrads {
  torch::Tensor dq, dk, dw, du, d_initial, dot_q, dot_k, dot_w;
};
DeltaWalkGrads delta_walk_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                   const torch::Tensor& g, const DeltaWalkForward& forward, const torch::Tensor& d_out,
                                   const torch::Tensor& d_final, double scale, bool want_d_initial,
                                   bool want_row_dots);

// The delta rule's UT transform per chunk of 64 (ops/cuda/ut_transform.cu), no decay or a scalar decay:
// W = (I + L)^{-1} diag(beta e^G) k and U = (I + L)^{-1} diag(beta) v with L the strictly lower
// diag(beta) k k^T ⊙ exp(G_i - G_j). k, v [B,T,H,64] contiguous, one 16-bit dtype; beta [B,H,T] fp32; g
// [B,H,T] fp32 per-step log decay or undefined. Returns w, u [B,H,N*64,64] (k's dtype, zero past T: the
// layout delta_walk_forward reads) and every chunk's (I + L)^{-1} [B,H,N,64,64] fp32 for the backward (lower
// triangular: what lies above the diagonal is left unwritten, and the backward does not read it).
struct UtForward {
  torch::Tensor w, u, inverse;
};
UtForward ut_transform_forward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                               const torch::Tensor& g);
// Its backward given dw, du [B,H,N*64,64] (k's dtype): dk, dv (k's dtype), dbeta and, with g, dg [B,H,T] fp32.
struct UtGrads {
  torch::Tensor dk, dv, dbeta, dg, d_scores;  // d_scores: given the scores only
};
UtGrads ut_transform_backward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                              const torch::Tensor& g, const torch::Tensor& inverse, const torch::Tensor& dw,
                              const torch::Tensor& du);

// The same transform given the decayed scores (a decay per key channel: Kimi Delta Attention), from
// vector_scores_forward with key_scores: scores = its Akk, scores[i,j] = Σ_d k_id k_jd exp(G_id - G_jd)
// (only the part below the diagonal is read), and k = its ek = e^G ⊙ k by 64-channel part [B,H,N*64,64],
// both in v's dtype; v [B,T,H,64]; beta [B,H,T] fp32. W = (I + L)^{-1} diag(beta) k, U = (I + L)^{-1}
// diag(beta) v with L = diag(beta) scores, strictly lower. The H heads may be the parts of H / p wider key
// heads, whose scores [B,H/p,N,64,64] they share (p = 1: scores [B,H,N,64,64]); part j of key head h is
// head h p + j. W is stored from the first w_parts parts of each key head, side by side in the walk's rows
// [B,H/p,N*64,64 w_parts], and U from the first u_parts, [B,H/p*u_parts,N*64,64] (head h u_parts + j); the
// other parts' go unused. Returns w, u and the inverses as above ([B,H,N,64,64]).
UtForward ut_transform_given_forward(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& beta, int64_t w_parts = 1, int64_t u_parts = 1);
// Its backward from dW, dU in W's and U's shapes: d_scores in the scores' shape (the parts' added up; zeros
// on and above the diagonal), dk [B,H,N*64,64], dv, dbeta.
UtGrads ut_transform_given_backward(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                                    const torch::Tensor& beta, const torch::Tensor& inverse, const torch::Tensor& dw,
                                    const torch::Tensor& du, int64_t w_parts = 1, int64_t u_parts = 1);

// Family A with a decay per key channel (GLA), head size 64, chunks of 64, in two fused parts that the
// caller joins (ops/linear_attention_ops/fused_vector_chunk.cpp). The caller's rows are [B,T,H,64]
// contiguous; what passes from the first part to the second is heads first and padded to whole chunks,
// [B,H,N*64,64] with N = ceil(T / 64).
bool vector_decay_chunk_supported(int64_t K, int64_t V, torch::ScalarType dt);
// Whether the walks below take K key channels (64 or 128; the values always 64 columns) in dt.
bool vector_walk_supported(int64_t K, torch::ScalarType dt);

// The intra-chunk scores and the walk's row factors (ops/cuda/vector_decay_scores.cu), from q, k [B,T,H,K]
// with K = 64 m (one 16-bit dtype) and g the per-step log decay per key channel [B,T,H,K] fp32, with G its
// cumulative sum within each chunk: A [B,H,N,64,64] (q's dtype, zeros above the diagonal),
// A[i,j] = scale Σ_d q[i,d] k[j,d] exp(G[i,d] - G[j,d]) for j <= i (summed over the K channels in fp32, rounded
// once); qd = scale e^G ⊙ q and kd = e^{Gl - G} ⊙ k [B,H,N*64,K] (q's dtype); a = e^{Gl} [B,H,N,K] fp32, Gl
// the chunk's last row of G. With key_scores (Kimi Delta Attention) the same kernel also gives the keys' own
// scores Akk (A with k for q and scale 1) and ek = e^G ⊙ k by 64-channel part, [B,H m,N*64,64] (part j of
// head h is head h m + j), the UT transform's inputs; otherwise those two are left undefined.
struct VectorScoresForward {
  torch::Tensor A, qd, kd, a, Akk, ek;
};
VectorScoresForward vector_scores_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                          double scale, bool key_scores = false);
// Its backward given dA, dqd, dkd (q's dtype, contiguous; only dA's part on and below the diagonal is read)
// and da (fp32), and with the keys' scores dAkk and dek (both or neither), in the forward's shapes: dq, dk
// [B,T,H,K] (q's dtype) and dg [B,T,H,K] (fp32).
struct VectorScoresGrads {
  torch::Tensor dq, dk, dg;
};
VectorScoresGrads vector_scores_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                         const torch::Tensor& dA, const torch::Tensor& dqd, const torch::Tensor& dkd,
                                         const torch::Tensor& da, double scale, const torch::Tensor& dAkk = {},
                                         const torch::Tensor& dek = {});

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

// The same walk for the delta rule with a decay per key channel (Kimi Delta Attention; ops/delta_rule_ops/
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

// The mLSTM's gates and normaliser (ops/cuda/mlstm_normaliser.cu; mlstm_ops/fused_chunk.cpp joins them
// with the numerator), fp32 throughout:
//   m_t = max(log σ(f_t) + m_{t-1}, i_t),  g_t = log σ(f_t) + m_{t-1} - m_t,  k'_t = w_t k_t, w_t = e^{i_t - m_t}
//   n_t = e^{g_t} n_{t-1} + k'_t,  den_t = n_t · (scale q_t)
// q, k [B,T,H,K] contiguous (16-byte aligned), both fp32 or both kp_dtype; igate, fgate [B,T,H] fp32
// contiguous (f the forget gate's pre-activation); m0 [B,H] fp32; n0 [B,H,K] fp32 or undefined (zeros).
// kp_dtype (bf16 or fp16) is the dtype of k' for the numerator's kernels. Returns k' [B,T,H,K]
// (kp_dtype); g, m, den [B,H,T] and n_T [B,H,K] (fp32); and for the backward w [B,H,T], the sum of g over
// each segment of the walk, gsum [B,H,S], and the n entering every 16 steps, [B,H,4 ceil(T/64),K].
// Supported: K = 64 or 128.
bool mlstm_normaliser_supported(int64_t K);
struct MlstmNormaliserForward {
  torch::Tensor kp, g, m, den, n_final, w, gsum, entering;
};
MlstmNormaliserForward mlstm_normaliser_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& igate, const torch::Tensor& fgate,
                                                const torch::Tensor& m0, const torch::Tensor& n0, double scale,
                                                torch::ScalarType kp_dtype);
// Its backward given the forward's inputs and results (kp, g, m, w, gsum, entering are read) and the
// gradients of k' (kp_dtype, aligned), g, m, den (fp32 [B,H,T], contiguous) and n_T (each may be
// undefined), with m held constant inside g and k' (only m0 is an input there): dq, dk (q's dtype),
// d_igate, d_fgate [B,T,H], d_m0 [B,H] and, when asked, d_n0 [B,H,K] (fp32). dq_add (q's dtype and shape,
// contiguous, or undefined) is a gradient q has from elsewhere (the numerator's): dq includes it, added in
// fp32 before dq is rounded, so that no separate pass adds the two.
struct MlstmNormaliserGrads {
  torch::Tensor dq, dk, d_igate, d_fgate, d_m0, d_n0;
};
MlstmNormaliserGrads mlstm_normaliser_backward(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& igate, const torch::Tensor& fgate,
                                               const torch::Tensor& m0, const MlstmNormaliserForward& fw,
                                               const torch::Tensor& d_kp, const torch::Tensor& d_g,
                                               const torch::Tensor& d_m, const torch::Tensor& d_den,
                                               const torch::Tensor& d_final, double scale, bool want_d_n0,
                                               const torch::Tensor& dq_add = {});

// h = o / (max(|den|, e^{-m}) + eps) row by row (the mLSTM's numerator over its denominator): o [B,T,H,V]
// 16-bit contiguous, den and m [B,H,T] fp32 contiguous; h in out_dtype (fp32 or o's dtype). Its backward
// given dh (h's dtype, contiguous): d_o (o's dtype) and d_den, d_m [B,H,T] fp32, with e^{-m} a constant
// (m's gradient is that of the eps term: see mlstm_ops/fused_chunk.cpp).
torch::Tensor divide_rows_forward(const torch::Tensor& o, const torch::Tensor& den, const torch::Tensor& m, double eps,
                                  torch::ScalarType out_dtype);
struct DivideRowsGrads {
  torch::Tensor d_o, d_den, d_m;
};
DivideRowsGrads divide_rows_backward(const torch::Tensor& o, const torch::Tensor& den, const torch::Tensor& m,
                                     double eps, const torch::Tensor& dh);

// Norms over the last dim of x [rows, D] contiguous, one warp a row (ops/cuda/row_norms.cu), fp32 inside:
//   r = (mean_scale Σ_c x_c² + eps)^-1/2,  y = w ⊙ round(x r)  (w undefined: y = round(x r))
// round() to x's dtype; y in the promotion of x's and w's dtypes (fp32 if either is). mean_scale = 1/D gives
// the RMS norm (ops::rms_norm), 1 the L2 norm (ops::l2_norm). x fp32, bf16 or fp16; w [D] fp32 or x's dtype
// (or a 16-bit w with an fp32 x); D <= kMaxRowNormSize. Returns y and r [rows] fp32.
// With a gate [rows, D] (x's dtype, contiguous) and its activation act (ops.h's Gate), y becomes
// y ⊙ round(act(gate)) in y's dtype, with act in the gate's dtype: the mixers' `norm(o) * sigmoid(g)` and
// `norm(o) * silu(g)`.
constexpr int64_t kMaxRowNormSize = 8192;
bool row_norm_supported(torch::ScalarType x_dtype, torch::ScalarType w_dtype, int64_t D);
struct RowNormForward {
  torch::Tensor y, rstd;
};
RowNormForward row_norm_forward(const torch::Tensor& x, const torch::Tensor& w, double mean_scale, double eps,
                                const torch::Tensor& gate = {}, Gate act = Gate::none);
// Its backward given dy (y's dtype, contiguous): dx (x's dtype), with a gate dgate (the gate's dtype), and,
// when want_dw and w is defined, dw (w's dtype; summed over the rows in fp32, the same from run to run).
struct RowNormGrads {
  torch::Tensor dx, dw, dgate;
};
RowNormGrads row_norm_backward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& rstd,
                               const torch::Tensor& dy, double mean_scale, bool want_dw, const torch::Tensor& gate = {},
                               Gate act = Gate::none);

// The SwiGLU product z = silu(gate) ⊙ up element by element (ops/cuda/swiglu.cu), fp32 inside, rounded as
// `torch::silu(gate) * up`: gate and up of one shape and dtype (fp32, bf16 or fp16), contiguous.
bool swiglu_supported(torch::ScalarType dtype);
torch::Tensor swiglu_forward(const torch::Tensor& gate, const torch::Tensor& up);
// Its backward given dz (gate's shape and dtype, contiguous).
struct SwigluGrads {
  torch::Tensor dgate, dup;
};
SwigluGrads swiglu_backward(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& dz);

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

// AdamW's update of many fp32 tensors in a few launches (ops/cuda/adamw.cu): ops::adamw_update's contract, with
// every tensor fp32, contiguous and on one device (adamw_supported: p and g such).
bool adamw_supported(const torch::Tensor& p, const torch::Tensor& g);
void adamw_update(const AdamWUpdate& update);

// The mixers' short convolutions (ops/cuda/short_conv.cu): over x̃ = [prefix; x] along time,
//   y[b, t, c] = act(bias[c] + Σ_{i < W} w[c, i] x̃[b, t + i, c]),   act = silu or none
// with w and bias rounded to x's dtype, the sum in fp32 and its result rounded before the silu, as the
// libtorch formula (cat, depthwise conv1d, silu). x [B, T, C] (fp32, bf16 or fp16), w [C, W] fp32 or x's
// dtype, bias [C] (w's dtype) or undefined, prefix [B, C, W-1] (x's dtype) or undefined (zeros); all
// contiguous, kMinShortConvWidth <= W <= kMaxShortConvWidth. Returns y [B, T, C] and, with want_cache,
// x̃'s last W-1 steps [B, C, W-1]: the state the next call takes as its prefix.
constexpr int64_t kMinShortConvWidth = 2, kMaxShortConvWidth = 4;
bool short_conv_supported(torch::ScalarType x_dtype, torch::ScalarType w_dtype, int64_t width);
struct ShortConvForward {
  torch::Tensor y, cache;
};
ShortConvForward short_conv_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                    const torch::Tensor& prefix, bool silu, bool want_cache);
// Its backward given dy (x's shape and dtype, contiguous): dx, dw [C, W] and dbias (when bias is defined) in
// their inputs' dtypes, dw and dbias summed in fp32 the same way on every run. No gradient of the prefix.
struct ShortConvGrads {
  torch::Tensor dx, dw, dbias;
};
ShortConvGrads short_conv_backward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                   const torch::Tensor& prefix, const torch::Tensor& dy, bool silu);

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
