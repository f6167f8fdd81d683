// Helpers shared by the three op families (not part of the public op interface, see ops.h).
//
// - layout changes: [B, T, H, D] (fla, the op interface) <-> [B, H, T, D] (what the chunked forms
//   compute in), with the compute dtype: fp64 when the input is fp64, fp32 otherwise.
// - padding along time to a multiple of the chunk size, with a chosen fill value.
// - gates: every decay kind (none, fixed [H], scalar [B,T,H], vector [B,T,H,K]) brought to one
//   per-step log-decay tensor [B,H,T] or [B,H,T,K] in the compute dtype. A fixed decay is zero on
//   padded steps, so padding never decays the final state (docs/design.md, "Padding").
// - gated_scores: the intra-chunk score matrix  Σ_d X[r,d] Y[j,d] exp(G[r,d] - G[j,d])  for j <= r
//   (or j < r), masked before any exp, without ever forming exp(-G) on its own.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace linearize::ops::detail {

// A tensor's sizes for error messages, "[2, 3]" (or "undefined").
std::string shape_of(const torch::Tensor& t);

enum class GateKind { None, Fixed, Scalar, Vector };

// The compute dtype of the chunked and recurrent forms: fp64 for fp64 inputs, fp32 for the rest.
torch::ScalarType compute_dtype(const torch::Tensor& x);

// bf16 or fp16: the dtypes whose products run on tensor cores and whose state path is kept in fp32.
bool low_precision(torch::ScalarType t);

// The dtype the chunked forms keep q, k and v in: bf16 and fp16 inputs stay as they are (their products
// run on tensor cores, as under autocast), anything else goes to the compute dtype. Gates, cumulative
// sums and the state pass stay in the compute dtype whatever this is.
torch::ScalarType operand_dtype(const torch::Tensor& x);

// a.matmul(b) in the lower precision of the two: when either is bf16 or fp16 both go to it (so an
// fp32 gate-scaled operand meets a bf16 one without a dtype error, with or without autocast).
torch::Tensor product(const torch::Tensor& a, const torch::Tensor& b);

// Checks that q, k [B,T,H,K] and v [B,T,H,V] agree; `op` names the caller in the error.
void check_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const char* op);

// Decay kind of g (undefined, [H], [B,T,H] or [B,T,H,K]); throws naming `op` for anything else.
GateKind gate_kind(const torch::Tensor& g, int64_t B, int64_t T, int64_t H, int64_t K, const char* op);

// [B, T, H, D] -> [B, H, T, D] in dtype `dt`.
torch::Tensor to_heads_first(const torch::Tensor& x, torch::ScalarType dt);

// Per-step log decay in the compute dtype, heads first: [B,H,T] (Fixed, Scalar) or [B,H,T,K] (Vector);
// undefined for None. Fixed [H] is broadcast over B and T.
torch::Tensor gate_heads_first(const torch::Tensor& g, GateKind kind, int64_t B, int64_t T,
                               torch::ScalarType dt);

// The recurrent forms' decay of the state S [B,H,K,V] at step t: S e^{g_t}, with g the log decay of
// gate_kind's shapes in S's dtype (undefined for None): [H] (Fixed), [B,T,H] (Scalar) or [B,T,H,K] (Vector).
torch::Tensor decay_state(const torch::Tensor& S, const torch::Tensor& g, GateKind kind, int64_t t);

// Pads dimension `dim` of x up to `len` with `value` (no copy when already long enough).
torch::Tensor pad_dim(const torch::Tensor& x, int64_t dim, int64_t len, double value);

// Smallest multiple of `chunk` that is >= T.
int64_t round_up(int64_t T, int64_t chunk);

// Causal mask [C, C] (bool): j <= r, or j < r when strict.
torch::Tensor causal_mask(int64_t C, bool strict, const torch::Device& device);

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

// The sequential part of the chunked forms of families A and B, over N chunks of C:
//   S^(0) = S0;  X_n = U_n - W_n S^(n) (B; A: W undefined, X_n = U_n);  S^(n+1) = D_n ⊙ S^(n) + KdT_n X_n
// W [B,H,N,C,K] or undefined; U [B,H,N,C,V]; KdT [B,H,N,K,C]; D [B,H,N,K,1], [B,H,N,1,1] or undefined;
// S0 [B,H,K,V]. Returns every S^(n) [B,H,N,K,V], X [B,H,N,C,V] (family B) and S^(N). Differentiable.
// On CUDA with fused kernels on (fp32): two kernels, one forward and one backward (ops/cuda).
struct StatePass {
  torch::Tensor states, writes, final_state;
};
StatePass state_pass(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                     const torch::Tensor& D, const torch::Tensor& S0);

// The chunked form of family A with no decay, a fixed or a scalar decay through the fused CUDA kernels
// (ops/cuda/chunk_scalar_decay.cu), when they apply: CUDA, fused kernels on, chunk 64, K = V = 64 or
// 128, q, k, v in bf16 or fp16 (or fp32 under bf16/fp16 autocast). Otherwise nothing, and the caller runs
// its libtorch form. Differentiable in q, k, v, g and h0; o in v's dtype, the state in fp32.
std::optional<OpResult> fused_scalar_decay_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& g, GateKind kind,
                                                 const torch::Tensor& h0, double scale, int64_t chunk);

// The same for a decay per key channel (GLA) through ops/cuda/vector_decay_scores.cu and
// chunk_vector_decay.cu (linear_attention_ops/fused_vector_chunk.cpp), when they apply: CUDA, fused
// kernels on, chunk 64, K = V = 64, or K and V other multiples of 64 (as parts of 64 channels), q, k, v in
// bf16 or fp16 (or fp32 under bf16/fp16 autocast).
std::optional<OpResult> fused_vector_decay_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& g, GateKind kind,
                                                 const torch::Tensor& h0, double scale, int64_t chunk);

// The intra-chunk scores and row factors of a decay per key channel through vector_decay_scores.cu (CUDA
// build only), differentiable in q, k and g: q, k [B,T,H,K] with K = 64 m (any layout and dtype; run in the
// 16-bit dtype dt) and g [B,T,H,K] (run in fp32) -> A [B,H,N,64,64], qd, kd [B,H,N*64,K], a [B,H,N,K], and
// with key_scores also Akk [B,H,N,64,64] and ek by 64-channel part [B,H m,N*64,64], as
// cuda_kernels::vector_scores_forward gives them (the scores summed over the K channels in fp32, rounded to
// dt once). GLA's fused form and Kimi Delta Attention's (with the keys' own scores) build on it.
struct VectorScores {
  torch::Tensor A, qd, kd, a, Akk, ek;
};
VectorScores fused_vector_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                 torch::ScalarType dt, double scale, bool key_scores = false);

// The chunked form of family B with a decay per key channel (Kimi Delta Attention) through fused CUDA
// kernels (delta_rule_ops/fused_vector_chunk.cpp), when they apply: CUDA, fused kernels on, chunk 64,
// K = V = 64, or K = 64 or 128 and V a multiple of 64 (in parts of 64 channels), q, k, v in bf16 or fp16 (or
// fp32 under bf16/fp16 autocast). At those other head sizes it takes no decay or a decay per step as well
// (DeltaNet, Gated DeltaNet: the same decay on every key channel). Otherwise nothing, and delta_rule_chunk
// runs its libtorch form. Differentiable in q, k, v, beta, g and h0.
std::optional<OpResult> fused_vector_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const torch::Tensor& beta,
                                                      const torch::Tensor& g, GateKind kind, const torch::Tensor& h0,
                                                      double scale, int64_t chunk);

// The chunked form of family C (mLSTM) through the fused scalar-decay kernels of family A (the
// numerator), with the max state, the gates and the normaliser in fp32 by ops/cuda/mlstm_normaliser.cu
// (the math of mlstm_as_linear_attention), when they apply: as fused_scalar_decay_chunk (K = V = 64 or
// 128) and T > 0. Otherwise nothing, and mlstm_chunk runs its libtorch form. Differentiable in q, k, v,
// the gates and the initial state.
std::optional<MlstmResult> fused_mlstm_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const torch::Tensor& igate, const torch::Tensor& fgate,
                                             const MlstmState& init, double scale, double eps, int64_t chunk);

// mlstm_chunk's result as linear attention with a scalar decay (mlstm_ops/fused_chunk.cpp): the max state
// m_t first (from the gates alone), then the numerator through gla_chunk with decay log f_t + m_{t-1} - m_t
// and keys e^{i_t - m_t} k_t, the normaliser in the compute dtype with autocast off. T > 0. The same math
// as fused_mlstm_chunk, here all in libtorch (gla_chunk's libtorch form on CPU; the tests use it).
MlstmResult mlstm_as_linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                                      double scale, double eps, int64_t chunk);

// The 16-bit dtype the fused chunk kernels would run q, k, v in, or nothing when they cannot: CUDA, fused
// kernels on, chunk 64, q, k, v of one dtype that is bf16/fp16, or fp32 under bf16/fp16 autocast (the
// products then run in autocast's dtype, as the libtorch form would compute them). Each kernel file
// adds its own head-size check.
std::optional<torch::ScalarType> fused_chunk_dtype(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, int64_t chunk);

// t contiguous with its data at a 16-byte boundary (the kernels read rows as 16-byte words): a view at an
// odd offset is copied.
torch::Tensor aligned_rows(torch::Tensor t);

// What the fused chunk kernels read for the gate and the initial state. Custom autograd functions cannot
// take undefined tensors, so an absent one comes as an empty fp32 placeholder (cuda_kernels::present
// turns it back). kernel_gate: the per-step log decay [B,H,T] fp32 contiguous (None: the placeholder);
// kernel_state: h0 [B,H,K,V] fp32 at a 16-byte boundary. `like` gives the device.
torch::Tensor kernel_gate(const torch::Tensor& g, GateKind kind, int64_t B, int64_t T, const torch::TensorOptions& like);
torch::Tensor kernel_state(const torch::Tensor& h0, const torch::TensorOptions& like);

// Whether delta_rule_chunk with a decay per key channel takes its scores and row factors from the fused
// scores kernel in parts of 64 key channels (K a multiple of 64, the fused form not taking the head size,
// e.g. K = 256) rather than from its libtorch pairwise decays (delta_rule_ops/chunk.cpp).
bool vector_scores_by_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            int64_t chunk);

// The chunked form of family B with no decay or a scalar decay per step as fused CUDA kernels: the UT
// transform (ops/cuda/ut_transform.cu) and the walk over the chunks (ops/cuda/chunk_delta_rule.cu), when
// they apply: fused_chunk_dtype gives a dtype and the head size is 64. Otherwise nothing, and
// delta_rule_chunk runs its libtorch form.
std::optional<torch::ScalarType> fused_delta_rule_dtype(const torch::Tensor& q, const torch::Tensor& k,
                                                        const torch::Tensor& v, GateKind kind, int64_t chunk);
// delta_rule_chunk's result through the kernels; dt from fused_delta_rule_dtype. Differentiable in q, k, v,
// beta, g and h0.
OpResult fused_delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                const torch::Tensor& h0, double scale, torch::ScalarType dt);
// The UT transform alone: W and U [B,H,N*64,64] in dt (zero past T) from k, v [B,T,H,64], beta [B,T,H] and
// the gate g (none or scalar). Differentiable in k, v, beta and g.
std::pair<torch::Tensor, torch::Tensor> fused_ut_transform(const torch::Tensor& k, const torch::Tensor& v,
                                                           const torch::Tensor& beta, const torch::Tensor& g,
                                                           GateKind kind, torch::ScalarType dt);

// The scalar decay's gradient through a fused walk (family A's or the delta rule's), from the row sums
// its backward gives: with b_t the cumulative log decay, q_t enters as q_t e^{b_t}, k_t as k_t e^{-b_t},
// the final state as e^{b_T} times its undecayed form, and (delta rule) the rows w of chunk n as w e^{b}
// with b at the step before the chunk (W S reads the decayed state). So
//   dL/dg_s = Σ_{t>=s} (q_t·dq_t - k_t·dk_t) + Σ_{chunks n starting after s} Σ_{rows of n} w·dw + <dS_T, S_T>.
// dot_q, dot_k [B,H,T]; dot_w [B,H,N*chunk] or undefined (no w rows: family A); d_final, final_state
// [B,H,K,V] (d_final may be undefined). Returns [B,H,T]. On CUDA one kernel (ops/cuda/decay_gradient.cu),
// elsewhere libtorch.
torch::Tensor walk_decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                                  int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state);

// One decode step (T = 1) of family A (beta undefined) or B through the fused CUDA kernel, when it
// applies: CUDA tensors, not fp64, fused kernels on. Otherwise nothing, and the caller runs its
// libtorch form. Shapes as the recurrent ops: q, k [B,1,H,K], v [B,1,H,V], beta [B,1,H]; with groups > 1,
// k, v and a scalar or vector g have H / groups heads (gla_recurrent's grouped KV heads).
std::optional<OpResult> fused_decode_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& beta, const torch::Tensor& g, GateKind kind,
                                          const torch::Tensor& h0, double scale, int64_t groups = 1);

}  // namespace linearize::ops::detail
