#include "train/data_loader.h"

#include <algorithm>
#include <numeric>

#include "io/error.h"

namespace linearize {

std::vector<TokenRange> split_stream(int64_t n, const std::vector<double>& parts) {
  if (parts.empty()) throw Error("token splits: no parts given");
  double sum = 0;
  bool fractions = true;
  for (double p : parts) {
    if (p < 0) throw Error("token splits: negative part " + std::to_string(p));
    if (p > 1) fractions = false;
    sum += p;
  }
  if (fractions && sum > 1.0 + 1e-9) fractions = false;  // e.g. "1|1|2" are counts
  std::vector<TokenRange> out;
  int64_t at = 0;
  for (double p : parts) {
    const int64_t len = fractions ? static_cast<int64_t>(p * static_cast<double>(n)) : static_cast<int64_t>(p);
    out.push_back({at, at + len});
    at += len;
  }
  if (at > n)
    throw Error("token splits need " + std::to_string(at) + " tokens but the data has " + std::to_string(n));
  return out;
}

WindowLoader::WindowLoader(const std::vector<int32_t>& tokens, TokenRange range, int64_t seq_len, uint64_t seed,
                           const std::string& what)
    : tokens_(tokens), range_(range), seq_len_(seq_len), seed_(seed) {
  if (seq_len < 1) throw Error(what + ": sequence length must be positive");
  if (range.end > static_cast<int64_t>(tokens.size()) || range.begin < 0 || range.size() < 0)
    throw Error(what + ": token range out of bounds");
  num_windows_ = range.size() > seq_len ? (range.size() - 1) / seq_len : 0;
  if (num_windows_ < 1)
    throw Error(what + ": " + std::to_string(range.size()) + " tokens are fewer than one window of " +
                std::to_string(seq_len + 1) + " (sequence length + 1); give more data or a shorter --seq-len");
}

void WindowLoader::shuffle_epoch() {
  order_.resize(num_windows_);
  for (int64_t i = 0; i < num_windows_; ++i) order_[i] = range_.begin + i * seq_len_;
  std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(pos_.epoch));
  // Fisher-Yates with our own draws: identical on every platform and library version.
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
  order_epoch_ = pos_.epoch;
}

void WindowLoader::set_position(const Position& p) {
  pos_ = p;
  order_epoch_ = -1;
}

void WindowLoader::set_position_json(const nlohmann::json& p) {
  set_position({p.at("epoch").get<int64_t>(), p.at("index").get<int64_t>()});
}

torch::Tensor WindowLoader::next(int64_t batch, torch::Device device) {
  auto out = torch::empty({batch, seq_len_ + 1}, torch::kLong);
  auto* dst = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    if (pos_.index >= num_windows_) {
      pos_.epoch += 1;
      pos_.index = 0;
    }
    if (order_epoch_ != pos_.epoch) shuffle_epoch();
    const int64_t start = order_[pos_.index++];
    for (int64_t t = 0; t <= seq_len_; ++t) dst[b * (seq_len_ + 1) + t] = tokens_[start + t];
  }
  return out.to(device);
}

}  // namespace linearize
