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

}  // namespace linearize
