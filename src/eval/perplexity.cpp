#include "eval/perplexity.h"

#include <cmath>

#include "io/error.h"
#include "ops/ops.h"

namespace linearize {

PerplexityResult perplexity(CausalLM& model, const std::vector<int32_t>& tokens, int64_t seq_len, int64_t batch,
                            const std::function<void(int64_t, int64_t)>& progress) {
  if (seq_len < 2) throw Error("perplexity: seq_len must be at least 2, got " + std::to_string(seq_len));
  if (batch < 1) throw Error("perplexity: batch must be at least 1");
  torch::NoGradGuard ng;
  const auto device = model->lm_head_weight().device();
  std::vector<std::pair<int64_t, int64_t>> windows;  // [start, length)
  for (int64_t s = 0; s < static_cast<int64_t>(tokens.size()); s += seq_len) {
    const int64_t n = std::min<int64_t>(seq_len, tokens.size() - s);
    if (n >= 2) windows.emplace_back(s, n);
  }
  if (windows.empty()) throw Error("perplexity: fewer than 2 tokens to score");
  double total_nll = 0;
  int64_t total_tokens = 0;
  for (size_t w = 0; w < windows.size();) {
    // Windows of equal length batch together; only the last one can be shorter.
    const int64_t n = windows[w].second;
    std::vector<int64_t> ids;
    size_t end = w;
    while (end < windows.size() && static_cast<int64_t>(end - w) < batch && windows[end].second == n) {
      for (int64_t i = 0; i < n; ++i) ids.push_back(tokens[windows[end].first + i]);
      ++end;
    }
    const int64_t b = static_cast<int64_t>(end - w);
    auto x = torch::tensor(ids, torch::kLong).view({b, n}).to(device);
    auto logits = model->forward(x.narrow(1, 0, n - 1));  // [b, n-1, V]
    auto nll = ops::cross_entropy_terms(logits.reshape({-1, logits.size(-1)}), x.narrow(1, 1, n - 1).reshape({-1}))
                   .sum();
    total_nll += nll.item<double>();
    total_tokens += b * (n - 1);
    w = end;
    if (progress) progress(static_cast<int64_t>(w), static_cast<int64_t>(windows.size()));
  }
  PerplexityResult r;
  r.tokens = total_tokens;
  r.nll = total_nll / total_tokens;
  r.ppl = std::exp(r.nll);
  return r;
}

}  // namespace linearize
