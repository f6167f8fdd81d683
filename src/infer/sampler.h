// Next-token choice from logits: greedy (argmax), or temperature + nucleus (top-p) sampling with a
// seeded generator of our own, so a seed gives the same text on every machine and torch version.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <vector>

namespace linearize {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;
  double top_p = 1.0;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // logits [V] (any device/dtype) -> token id.
  int64_t next(const torch::Tensor& logits);
  bool greedy() const { return options_.greedy; }

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

// The next token of each row of logits [N, V], row i by samplers[i], with one transfer from the device for
// the batch rather than one per row (on a GPU each is a wait): greedy rows by one argmax, the others from
// one host copy of the logits. Row i gets what samplers[i]->next(logits[i]) gives.
std::vector<int64_t> next_tokens(const torch::Tensor& logits, const std::vector<Sampler*>& samplers);

}  // namespace linearize
