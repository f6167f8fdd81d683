// Helpers shared by the op families (not part of the public op interface, see ops.h): layout and dtype
// changes, time padding and gates. What the chunked forms share is in ops/chunk/chunk.h; each family's
// internals in ops/gla/gla.h, ops/delta_rule/delta_rule.h and ops/mlstm/mlstm.h.
//
// - layout changes: [B, T, H, D] (fla, the op interface) <-> [B, H, T, D] (what the chunked forms
//   compute in), with the compute dtype: fp64 when the input is fp64, fp32 otherwise.
// - padding along time to a multiple of the chunk size, with a chosen fill value.
// - gates: every decay kind (none, fixed [H], scalar [B,T,H], vector [B,T,H,K]) brought to one
//   per-step log-decay tensor [B,H,T] or [B,H,T,K] in the compute dtype. A fixed decay is zero on
//   padded steps, so padding never decays the final state (docs/design.md, "Padding").
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
// The state an op returns: with in_place, S written over `given` and `given` returned where it has S's shape
// and dtype (ops.h, "in_place"); S itself otherwise.
torch::Tensor returned_state(const torch::Tensor& given, const torch::Tensor& S, bool in_place);

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

// t contiguous with its data at a 16-byte boundary (the kernels read rows as 16-byte words): a view at an
// odd offset is copied.
torch::Tensor aligned_rows(torch::Tensor t);

}  // namespace linearize::ops::detail
