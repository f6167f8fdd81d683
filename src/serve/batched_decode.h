// One decoding step for many independent sequences at once (continuous batching, serve/engine.h). Each
// sequence keeps its own ModelState of batch 1; a step stacks the states into one batch, runs one forward
// pass with one token per row, and gives each sequence back its advanced state. Every row computes what it
// would alone:
//   student mixers  matrix states and conv buffers stacked along the batch; rows at different positions
//                   carry them in "row_position" (RetNet rotates by position, model/mixers/retnet.cpp)
//   softmax attention (teachers, hybrid layers)  KV caches left-padded to the longest, "row_start" marking
//                   each row's first real entry (model/llama.h)
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <vector>

#include "infer/graphed_step.h"
#include "model/causal_lm.h"

namespace linearize {

struct DecodeRow {
  ModelState* state;  // after a prefill (position > 0); replaced by the state after `token`
  int32_t token;      // the token to feed
};

// Logits [rows, vocab] (float) of the next token of each row, in order.
torch::Tensor decode_rows(CausalLM& model, const std::vector<DecodeRow>& rows);

// Prefills several prompts at once: the first P tokens of every prompt (P = the shortest prompt's length
// - 1) as one batch, all rows at one position, then each prompt's remaining tokens alone from its share of
// the batch's state. Each states[i] is left after prompt i; returns the next-token logits [N, vocab]
// (float), each what prompt i gives alone. No LM head runs over the shared part.
torch::Tensor prefill_rows(CausalLM& model, const std::vector<const std::vector<int32_t>*>& prompts,
                           const std::vector<ModelState*>& states);

// Whether a DecodeBatch steps through captured CUDA graphs (infer/graphed_step.h) where the model allows
// it (a student on CUDA whose mixers do not depend on the position): one launch per step instead of
// hundreds. `stand_in` takes the same path on any device with the graph's eager stand-in (tests).
enum class DecodeGraphs { off, on, stand_in };

// The same across steps: while the same rows (the same states, in the same order) continue, their
// stacked state stays stacked and nothing is copied between steps; the rows' own states are written
// back (flush) when the batch changes, or when the caller needs them.
// With graphs, the stacked state lives in the buffers of a graph captured for a batch of the next power
// of two (rows past the real ones repeat the first); one graph per such size is kept and refilled
// (GraphedDecodeStep::load) when the rows change, so a new capture happens once per size.
class DecodeBatch {
 public:
  explicit DecodeBatch(CausalLM model, DecodeGraphs graphs = DecodeGraphs::off)
      : model_(std::move(model)), graphs_(graphs) {}
  ~DecodeBatch();
  torch::Tensor step(const std::vector<DecodeRow>& rows);  // as decode_rows
  // Writes the stacked state back into each row's own state; the next step stacks again. Call it before
  // a row's state is read or freed.
  void flush();
  // Drops the stacked state without writing it back (the rows' states are gone).
  void forget() { members_.clear(), merged_.clear(), positions_.clear(), graph_ = nullptr; }
  // Graphs captured so far (one per batch size used).
  int64_t graphs_captured() const { return static_cast<int64_t>(graph_by_batch_.size()); }

 private:
  bool graphable(const ModelState& state) const;  // graphs are on and can serve this model and state
  // Moves merged_ into a graph for its batch (captured now if that size has none); false when the model
  // cannot be graphed or capture fails (then graphs stay off for this batch and merged_ stays).
  bool enter_graph();

  CausalLM model_;
  DecodeGraphs graphs_;
  std::vector<ModelState*> members_;  // the rows of merged_ (or of graph_'s buffers), in order
  std::vector<int64_t> positions_;    // each row's position (tokens seen)
  std::vector<bool> attention_;       // per layer: a KV cache (left-padded) or stackable tensors
  ModelState merged_;
  std::map<int64_t, std::unique_ptr<GraphedDecodeStep>> graph_by_batch_;
  GraphedDecodeStep* graph_ = nullptr;  // holds the members' stacked state, when graphed
};

}  // namespace linearize
