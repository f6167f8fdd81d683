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

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n) {
  uint64_t bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < 4; ++r) keys_[r] = splitmix64(key * 4 + static_cast<uint64_t>(r));
}

uint64_t Permutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ (splitmix64(right ^ k) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);  // cycle walking: stays a permutation of [0, n)
  return x;
}

WindowLoader::WindowLoader(const std::vector<int32_t>& tokens, TokenRange range, int64_t seq_len, uint64_t seed,
                           const std::string& what)
    : owned_(std::make_shared<const TokenDataset>(TokenDataset::from_tokens(tokens, what))), data_(owned_.get()),
      range_(range), seq_len_(seq_len), seed_(seed), vocab_(0), what_(what) {
  init();
}

WindowLoader::WindowLoader(const TokenDataset& data, TokenRange range, int64_t seq_len, uint64_t seed,
                           const std::string& what, int64_t vocab)
    : data_(&data), range_(range), seq_len_(seq_len), seed_(seed), vocab_(vocab), what_(what) {
  init();
}

void WindowLoader::init() {
  if (seq_len_ < 1) throw Error(what_ + ": sequence length must be positive");
  if (range_.end > data_->size() || range_.begin < 0 || range_.size() < 0)
    throw Error(what_ + ": token range out of bounds");
  num_windows_ = range_.size() > seq_len_ ? (range_.size() - 1) / seq_len_ : 0;
  if (num_windows_ < 1)
    throw Error(what_ + ": " + std::to_string(range_.size()) + " tokens are fewer than one window of " +
                std::to_string(seq_len_ + 1) + " (sequence length + 1); give more data or a shorter --seq-len");
}

int64_t WindowLoader::window_start(const Position& p) const {
  const Permutation order(static_cast<uint64_t>(num_windows_), seed_ * 1000003ULL + static_cast<uint64_t>(p.epoch));
  return range_.begin + static_cast<int64_t>(order(static_cast<uint64_t>(p.index))) * seq_len_;
}

void WindowLoader::set_position(const Position& p) { pos_ = p; }

void WindowLoader::set_position_json(const nlohmann::json& p) {
  set_position({p.at("epoch").get<int64_t>(), p.at("index").get<int64_t>()});
}

torch::Tensor WindowLoader::next_part(int64_t rows, int64_t begin, int64_t count) {
  auto out = torch::empty({count, seq_len_ + 1}, torch::kLong);
  auto* dst = out.data_ptr<int64_t>();
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  for (int64_t b = 0; b < rows; ++b) {
    if (pos_.index >= num_windows_) {
      pos_.epoch += 1;
      pos_.index = 0;
    }
    const Position at = pos_;
    pos_.index += 1;
    if (b < begin || b >= begin + count) continue;  // another process's row: not read
    const int64_t start = window_start(at);
    data_->read(start, seq_len_ + 1, window.data());
    if (vocab_ > 0) data_->check_ids(window.data(), seq_len_ + 1, vocab_, start);
    std::copy(window.begin(), window.end(), dst + (b - begin) * (seq_len_ + 1));
  }
  return out;
}

torch::Tensor WindowLoader::next(int64_t batch, torch::Device device) { return next_part(batch, 0, batch).to(device); }

}  // namespace linearize
