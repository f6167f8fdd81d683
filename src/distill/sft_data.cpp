// SFT rows (see sft_data.h).
#include "distill/sft_data.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "io/error.h"

namespace linearize {

SftSource::SftSource(const std::vector<EncodedChat>& chats, int64_t seq_len, bool packing, int32_t pad_id,
                     uint64_t seed)
    : seq_len_(seq_len), seed_(seed) {
  if (chats.empty()) throw Error("sft: no conversations to train on");
  const int64_t W = seq_len + 1;
  std::vector<std::vector<int64_t>> tok, mask, doc;
  auto new_row = [&] {
    tok.emplace_back(W, pad_id), mask.emplace_back(W, 0), doc.emplace_back(W, -1);
  };
  int64_t fill = W, docs_in_row = 0;
  for (const auto& c : chats) {
    int64_t n = static_cast<int64_t>(c.ids.size());
    if (n > W) n = W, ++truncated_;
    if (!packing || fill + n > W) new_row(), fill = 0, docs_in_row = 0;
    for (int64_t j = 0; j < n; ++j) {
      tok.back()[fill + j] = c.ids[j];
      mask.back()[fill + j] = j == 0 ? 0 : c.mask[j];  // a document's first token has no input of its own
      doc.back()[fill + j] = docs_in_row;
    }
    fill += n, ++docs_in_row;
  }
  const int64_t N = static_cast<int64_t>(tok.size());
  rows_ = torch::empty({N, 3, W}, torch::kLong);
  auto a = rows_.accessor<int64_t, 3>();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < W; ++j) a[r][0][j] = tok[r][j], a[r][1][j] = mask[r][j], a[r][2][j] = doc[r][j];
}

void SftSource::shuffle() {
  order_.resize(rows_.size(0));
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(epoch_));
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng() % i]);
  order_epoch_ = epoch_;
}

torch::Tensor SftSource::next(int64_t n, torch::Device device) {
  std::vector<int64_t> pick;
  for (int64_t i = 0; i < n; ++i) {
    if (index_ >= rows_.size(0)) ++epoch_, index_ = 0;
    if (order_epoch_ != epoch_) shuffle();
    pick.push_back(order_[index_++]);
  }
  return rows_.index_select(0, torch::tensor(pick, torch::kLong)).to(device);
}

void SftSource::set_position_json(const nlohmann::json& p) {
  epoch_ = p.at("epoch").get<int64_t>();
  index_ = p.at("index").get<int64_t>();
  order_epoch_ = -1;
}

}  // namespace linearize
