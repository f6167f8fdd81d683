// Next-token choice from logits: greedy (argmax), or temperature + nucleus (top-p) sampling with a
// seeded generator of our own, so a seed gives the same text on every machine and torch version.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <random>

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

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace linearize
