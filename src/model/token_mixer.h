// The token mixer interface: the part of a decoder block that mixes information across time. The
// teacher's softmax attention and every linear-time student mixer implement it, so one decoder block,
// one model class and one generation loop serve both.
#pragma once
#include <torch/torch.h>

#include <string>

#include "model/layer_state.h"

namespace linearize {

class TokenMixer : public torch::nn::Module {
 public:
  // x [B, T, hidden] -> [B, T, hidden].
  // state == nullptr: a whole sequence from an empty state (training, scoring).
  // state != nullptr: continue from *state (empty = start) and replace it with the state after x.
  virtual torch::Tensor forward(const torch::Tensor& x, LayerState* state) = 0;

  // Short name of the mixer kind, e.g. "softmax_attention", "gated_deltanet".
  virtual std::string kind() const = 0;
};

}  // namespace linearize
