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

#include <vector>

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

// The same across steps: while the same rows (the same states, in the same order) continue, their
// stacked state stays stacked and nothing is copied between steps; the rows' own states are written
// back (flush) when the batch changes, or when the caller needs them.
class DecodeBatch {
 public:
  explicit DecodeBatch(CausalLM model) : model_(std::move(model)) {}
  torch::Tensor step(const std::vector<DecodeRow>& rows);  // as decode_rows
  // Writes the stacked state back into each row's own state; the next step stacks again. Call it before
  // a row's state is read or freed.
  void flush();
  // Drops the stacked state without writing it back (the rows' states are gone).
  void forget() { members_.clear(), merged_.clear(), positions_.clear(); }

 private:
  CausalLM model_;
  std::vector<ModelState*> members_;  // the rows of merged_, in order
  std::vector<int64_t> positions_;    // each row's position (tokens seen)
  std::vector<bool> attention_;       // per layer: a KV cache (left-padded) or stackable tensors
  ModelState merged_;
};

}  // namespace linearize
