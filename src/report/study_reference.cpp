// The study's reference numbers and Spearman's rank correlation (see study_reference.h).
#include "report/study_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace linearize {

const std::map<std::string, double>& study_niah_2k() {
  static const std::map<std::string, double> m = {{"gated_deltanet", 81.8}, {"mlstm", 25.2}, {"kda", 2.0},
                                                  {"deltanet", 0.0},        {"gla", 0.0},    {"linear_attention", 0.0},
                                                  {"retnet", 0.0}};
  return m;
}

std::vector<double> average_ranks(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(values.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;  // ranks i+1 .. j+1
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = mean_rank;
    i = j + 1;
  }
  return ranks;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2) return std::nan("");
  const auto ra = average_ranks(a), rb = average_ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - ma) * (rb[i] - mb);
    va += (ra[i] - ma) * (ra[i] - ma);
    vb += (rb[i] - mb) * (rb[i] - mb);
  }
  if (va == 0 || vb == 0) return std::nan("");
  return cov / std::sqrt(va * vb);
}

}  // namespace linearize
