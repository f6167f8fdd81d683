// One decode step of a student captured as a CUDA graph: the whole model (every layer's projections,
// gates, fused state update, the LM head) replays as one launch per token, so decoding is no longer
// bound by the host issuing a thousand small kernels. Only for fixed-size states: students whose
// mixers do not depend on the absolute position (not RetNet, which rotates by position; not the
// teacher, whose KV cache grows). GPU build only; elsewhere `usable` says no.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>

#include "model/causal_lm.h"

namespace linearize {

class GraphedDecodeStep {
 public:
  // Whether a graph can serve this model and state (CUDA, every layer's mixer position-free, a
  // non-empty state); `why` receives the reason when not.
  static bool usable(const CausalLM& model, const ModelState& state, std::string* why = nullptr);

  // Captures model->forward(ids [B, 1], &state) for the shapes of `state` (already filled by a
  // prefill) and takes over its contents. Throws linearize::Error when capture fails.
  GraphedDecodeStep(CausalLM model, const ModelState& state, int64_t batch);
  ~GraphedDecodeStep();

  // Feeds ids [B, 1] (int64, on the model's device); returns logits [B, 1, V]. The returned tensor is
  // the graph's output buffer, overwritten by the next step: clone it to keep it.
  torch::Tensor step(const torch::Tensor& ids);

  // The current state (copies; positions advanced by the steps taken).
  ModelState state() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace linearize
