// Per-layer decoding state of a token mixer: the teacher's KV cache, or a student mixer's conv buffers
// and matrix state. A state is a small dictionary of tensors plus the number of tokens it has seen.
//
// Copying a LayerState (or a whole ModelState) is a cheap, exact snapshot that can be restored later (chat
// turns, NIAH prefixes): mixers replace a state's tensors rather than modify them, except where the tensor is
// theirs alone (the teacher's KV cache is appended to in place while no snapshot shares it) or the state
// says so (update_in_place: a CUDA graph's buffers, of which nobody keeps a copy).
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace linearize {

struct LayerState {
  std::map<std::string, torch::Tensor> tensors;
  int64_t position = 0;  // tokens consumed so far
  // A decode step may write the new state over these tensors instead of replacing them (no snapshot
  // shares them): a student's step then moves no state from one buffer to another.
  bool update_in_place = false;

  bool has(const std::string& name) const { return tensors.count(name) > 0; }
  torch::Tensor get(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? torch::Tensor() : it->second;
  }
  // Bytes held by the state's tensors.
  int64_t bytes() const {
    int64_t n = 0;
    for (const auto& [k, t] : tensors) n += t.numel() * t.element_size();
    return n;
  }
};

using ModelState = std::vector<LayerState>;

inline int64_t state_bytes(const ModelState& s) {
  int64_t n = 0;
  for (const auto& l : s) n += l.bytes();
  return n;
}

}  // namespace linearize
