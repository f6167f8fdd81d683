// The token mixer interface: the part of a decoder block that mixes information across time. The
// teacher's softmax attention and every linear-time student mixer implement it, so one decoder block,
// one model class and one generation loop serve both.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/layer_state.h"
#include "model/packed_projections.h"

namespace linearize {

// Documents packed side by side in the rows of a batch (SFT --packing). starts[b] holds the offsets
// at which the documents of row b begin (ascending, the first 0); a document runs to the next start
// or to the end of the row. No information may flow from one document into another.
struct PackedRows {
  std::vector<std::vector<int64_t>> starts;
  // From a document index per position, doc [B, T]: a document starts wherever the index changes.
  static PackedRows from_doc_ids(const torch::Tensor& doc);
  int64_t num_documents() const;
};

class TokenMixer : public torch::nn::Module {
 public:
  // x [B, T, hidden] -> [B, T, hidden].
  // state == nullptr: a whole sequence from an empty state (training, scoring).
  // state != nullptr: continue from *state (empty = start) and replace it with the state after x.
  virtual torch::Tensor forward(const torch::Tensor& x, LayerState* state) = 0;

  // x [B, T, hidden] holding packed documents -> [B, T, hidden], each document mixed exactly as if it
  // were alone, from an empty state. Default (model/packing.cpp): the documents are gathered into rows
  // of their own (right-padded, which a causal mixer never reads), run through forward(x, nullptr)
  // and scattered back, so every recurrent state and short-conv buffer restarts at each boundary.
  // Softmax attention overrides it with a block-diagonal causal mask.
  virtual torch::Tensor forward_packed(const torch::Tensor& x, const PackedRows& rows);

  // Short name of the mixer kind, e.g. "softmax_attention", "gated_deltanet".
  virtual std::string kind() const = 0;

  // Runs the linear layers that read x as one matrix product in forwards without gradients
  // (model/packed_projections.h). Call it once the weights are loaded and on their device and dtype.
  void pack_projections() { inputs.pack(); }
  bool projections_packed() const { return inputs.packed(); }

 protected:
  PackedProjections inputs;  // the layers reading x, added by each mixer's constructor
};

}  // namespace linearize
