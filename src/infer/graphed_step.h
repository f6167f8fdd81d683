// One decode step captured as a CUDA graph: the whole model (every layer's projections, gates, fused state
// update, the LM head) replays as one launch per token, so decoding is no longer bound by the host issuing
// a thousand small kernels. For states of a fixed size: students whose mixers do not depend on the absolute
// position (not RetNet, which rotates by position), and softmax attention (a teacher, a hybrid's kept
// layers) given a capacity: its KV cache then has that many entries from the start and the step writes
// and masks by a position kept on the device (LlamaAttention::forward_fixed_cache). Graphs need the GPU
// build; the eager stand-in runs anywhere.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>

#include "model/causal_lm.h"

namespace linearize {

class GraphedDecodeStep {
 public:
  // How steps run: a captured CUDA graph, or the stand-in that runs the model eagerly on the same
  // buffers, so that CPU tests can check what callers do with a graph (serve/batched_decode.cpp).
  enum class Replay { cuda_graph, eager };

  // Whether a graph can serve this model and state (CUDA for a graph, no RetNet layer, softmax attention only
  // with a capacity beyond the state's position, a non-empty state); `why` receives the reason when not.
  static bool usable(const CausalLM& model, const ModelState& state, std::string* why = nullptr,
                     Replay replay = Replay::cuda_graph, int64_t capacity = 0);

  // Captures model->forward(ids [B, 1], &state) for the shapes of `state` (already filled by a
  // prefill) and takes over its contents. capacity: the tokens a softmax layer's KV cache holds, context
  // included (0 without such layers). Throws linearize::Error when capture fails.
  GraphedDecodeStep(CausalLM model, const ModelState& state, int64_t batch, Replay replay = Replay::cuda_graph,
                    int64_t capacity = 0);
  ~GraphedDecodeStep();

  // Feeds ids [B, 1] (int64, on the model's device); returns logits [B, 1, V]. The returned tensor is
  // the graph's output buffer, overwritten by the next step: clone it to keep it. Throws once a KV cache
  // is full (the capacity reached).
  torch::Tensor step(const torch::Tensor& ids);

  // The current state (copies; positions advanced by the steps taken).
  ModelState state() const;

  // Puts `state` into the buffers (another set of sequences of the same shapes: the same tensors,
  // sizes and batch as captured), so that one graph serves them without a new capture.
  void load(const ModelState& state);

  int64_t batch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace linearize
