#include "infer/sampler.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "io/error.h"

namespace linearize {

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  if (!options.greedy && options.temperature <= 0)
    throw Error("sampling temperature must be positive, got " + std::to_string(options.temperature));
  if (options.top_p <= 0 || options.top_p > 1)
    throw Error("top-p must be in (0, 1], got " + std::to_string(options.top_p));
}

int64_t Sampler::next(const torch::Tensor& logits) {
  auto l = logits.detach().to(torch::kCPU, torch::kFloat).contiguous();
  if (options_.greedy) return l.argmax().item<int64_t>();
  auto probs = torch::softmax(l / options_.temperature, -1).contiguous();
  const float* p = probs.data_ptr<float>();
  const int64_t V = probs.numel();
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  // Nucleus: the smallest prefix of the sorted distribution whose mass reaches top_p.
  double mass = 0;
  int64_t keep = 0;
  while (keep < V) {
    mass += p[order[keep++]];
    if (mass >= options_.top_p) break;
  }
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng_), acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[order[i]];
    if (r < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<int64_t> next_tokens(const torch::Tensor& logits, const std::vector<Sampler*>& samplers) {
  if (logits.dim() != 2 || logits.size(0) != static_cast<int64_t>(samplers.size()))
    throw Error("next_tokens: logits [N, V] and one sampler per row");
  std::vector<int64_t> out(samplers.size());
  const bool all_greedy = std::all_of(samplers.begin(), samplers.end(), [](const Sampler* s) { return s->greedy(); });
  if (all_greedy) {  // as next(): the float logits' first maximum
    const auto ids = logits.detach().to(torch::kFloat).argmax(-1).to(torch::kCPU).contiguous();
    std::copy(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel(), out.begin());
    return out;
  }
  const auto host = logits.detach().to(torch::kCPU, torch::kFloat).contiguous();
  for (size_t i = 0; i < samplers.size(); ++i) out[i] = samplers[i]->next(host[static_cast<int64_t>(i)]);
  return out;
}

}  // namespace linearize
