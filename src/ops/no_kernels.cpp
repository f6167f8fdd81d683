// The one "not available" answer of a build without kernels (neither the GPU build nor the CPU build's
// emulator): every fused_* entry point of ops/*/fused_*.cpp, which such a build does not compile, says
// that its kernels do not apply, so that each op runs its libtorch form. The three that have no such
// answer are only called after fused_chunk_dtype or fused_delta_rule_dtype said yes, which they never do
// here; reaching them is a bug.
#include <optional>
#include <stdexcept>
#include <vector>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/gla/gla.h"
#include "ops/mlstm/mlstm.h"
#include "ops/nn/nn.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

namespace {
[[noreturn]] void not_built(const char* what) {
  throw std::logic_error(std::string(what) + ": this build has no kernels");
}
}  // namespace

bool kernels_built() { return false; }

// ops/chunk
std::optional<std::vector<torch::Tensor>> fused_diagonal_block_scores(const std::vector<torch::Tensor>&,
                                                                      const torch::Tensor&, const torch::Tensor&,
                                                                      bool) {
  return std::nullopt;
}
std::optional<torch::Tensor> fused_solve_unit_lower(const torch::Tensor&, const torch::Tensor&) { return std::nullopt; }
std::optional<StatePass> fused_state_pass(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                          const torch::Tensor&, const torch::Tensor&) {
  return std::nullopt;
}
std::optional<torch::Tensor> fused_walk_decay_gradient(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                       int64_t, const torch::Tensor&, const torch::Tensor&) {
  return std::nullopt;
}
std::optional<torch::Tensor> fused_softplus_decay(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  return std::nullopt;
}
std::optional<OpResult> fused_decode_step(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                          const torch::Tensor&, const torch::Tensor&, GateKind, const torch::Tensor&,
                                          double, int64_t, bool, double) {
  return std::nullopt;
}

// ops/gla
std::optional<OpResult> fused_scalar_decay_chunk(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                 const torch::Tensor&, GateKind, const torch::Tensor&, double, int64_t) {
  return std::nullopt;
}
std::optional<OpResult> fused_vector_decay_chunk(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                 const torch::Tensor&, GateKind, const torch::Tensor&, double, int64_t) {
  return std::nullopt;
}
VectorScores fused_vector_scores(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, torch::ScalarType,
                                 double, bool) {
  not_built("fused_vector_scores");
}

// ops/delta_rule
std::optional<OpResult> fused_vector_delta_rule_chunk(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                      const torch::Tensor&, const torch::Tensor&, GateKind,
                                                      const torch::Tensor&, double, int64_t) {
  return std::nullopt;
}
std::optional<torch::ScalarType> fused_delta_rule_dtype(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                        GateKind, int64_t) {
  return std::nullopt;
}
OpResult fused_delta_rule_chunk(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                const torch::Tensor&, GateKind, const torch::Tensor&, double, torch::ScalarType) {
  not_built("fused_delta_rule_chunk");
}
std::pair<torch::Tensor, torch::Tensor> fused_ut_transform(const torch::Tensor&, const torch::Tensor&,
                                                           const torch::Tensor&, const torch::Tensor&, GateKind,
                                                           torch::ScalarType) {
  not_built("fused_ut_transform");
}

// ops/mlstm
std::optional<MlstmResult> fused_mlstm_chunk(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             const torch::Tensor&, const torch::Tensor&, const MlstmState&, double,
                                             double, int64_t) {
  return std::nullopt;
}

// ops/nn
bool fused_adamw_update(const AdamWUpdate&) { return false; }
std::optional<torch::Tensor> fused_row_norm(const torch::Tensor&, const torch::Tensor&, double, double,
                                            const torch::Tensor&, Gate) {
  return std::nullopt;
}
std::optional<ShortConvResult> fused_short_conv(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                const torch::Tensor&, bool, bool, bool) {
  return std::nullopt;
}
std::optional<torch::Tensor> fused_swiglu(const torch::Tensor&, const torch::Tensor&) { return std::nullopt; }
std::optional<DistillTerms> fused_distill_loss_terms(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                     double) {
  return std::nullopt;
}
std::optional<torch::Tensor> fused_cross_entropy_terms(const torch::Tensor&, const torch::Tensor&) {
  return std::nullopt;
}

}  // namespace linearize::ops::detail
