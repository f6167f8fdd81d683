// The fused kernel paths of the ops in ops/nn (internal to src/ops). Each lives in a fused_*.cpp file that
// the build compiles only when it has kernels (the GPU build, or the CPU build's emulator); without them
// ops/no_kernels.cpp answers "not available" for all. Each returns nothing (false) where its kernels do not
// apply, and the op then runs its libtorch form.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "ops/ops.h"

namespace linearize::ops::detail {

// adamw_update's few launches for all tensors (ops/cuda/adamw.cu); false: not applied, nothing changed.
bool fused_adamw_update(const AdamWUpdate& update);

// rms_norm and l2_norm (ops/cuda/row_norms.cu): a norm of x over its last dim with weight (or none), times
// act(gate) where act is not none.
std::optional<torch::Tensor> fused_row_norm(const torch::Tensor& x, const torch::Tensor& weight, double mean_scale,
                                            double eps, const torch::Tensor& gate = {}, Gate act = Gate::none);

// add_rms_norm (ops/cuda/row_norms.cu with a residual): where no gradient is needed, x and residual have one
// shape and dtype, contiguous, and the kernel takes them.
std::optional<AddNorm> fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                          const torch::Tensor& weight, double eps);

// short_conv (ops/cuda/short_conv.cu).
std::optional<ShortConvResult> fused_short_conv(const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& prefix, bool silu,
                                                bool want_cache, bool in_place = false);

// swiglu (ops/cuda/swiglu.cu).
std::optional<torch::Tensor> fused_swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// distill_loss_terms and cross_entropy_terms (ops/cuda/distill_loss.cu).
std::optional<DistillTerms> fused_distill_loss_terms(const torch::Tensor& s, const torch::Tensor& t,
                                                     const torch::Tensor& targets, double temperature);
std::optional<torch::Tensor> fused_cross_entropy_terms(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace linearize::ops::detail
