// Held-out perplexity: the token stream is cut into consecutive non-overlapping windows of seq_len
// tokens; each window is scored from its first token (that token is context only), so a window of n
// tokens contributes n - 1 next-token predictions. A last window shorter than 2 tokens is dropped.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/causal_lm.h"

namespace linearize {

struct PerplexityResult {
  double nll = 0;      // mean next-token negative log-likelihood (nats)
  double ppl = 0;      // exp(nll)
  int64_t tokens = 0;  // number of scored predictions
};

PerplexityResult perplexity(CausalLM& model, const std::vector<int32_t>& tokens, int64_t seq_len, int64_t batch,
                            const std::function<void(int64_t done, int64_t total)>& progress = nullptr);

}  // namespace linearize
