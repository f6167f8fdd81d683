// Training data: fixed windows cut from one token stream (a token dataset: shards read memory-mapped),
// in a shuffled order that is a pure function of (seed, epoch), so that a checkpointed position resumes
// exactly. The order is a keyed permutation computed window by window, so memory does not grow with the
// corpus, and a process reads only the windows of its own rows.
//
// A window holds seq_len + 1 tokens (inputs are the first seq_len, targets the last seq_len);
// consecutive windows overlap by one token, so every token of the slice is a target once per epoch.
// The stream is split into consecutive disjoint slices for the distillation stages, by fractions
// (the study: 0.026 | 0.053 | 0.92) or by token counts.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "data/token_dataset.h"
#include "train/batch_source.h"

namespace linearize {

struct TokenRange {
  int64_t begin = 0, end = 0;  // [begin, end) in the stream
  int64_t size() const { return end - begin; }
};

// Consecutive disjoint ranges of a stream of n tokens: `parts` are fractions (summing to <= 1) when
// all are < 1 and sum <= 1, token counts otherwise. Throws when they do not fit.
std::vector<TokenRange> split_stream(int64_t n, const std::vector<double>& parts);

// A permutation of [0, n) that is a pure function of its key, evaluated one index at a time in O(1)
// memory: a 4-round Feistel network on the smallest even number of bits that covers n, with cycle walking
// back into [0, n).
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t n_, half_bits_, half_mask_, keys_[4];
};

class WindowLoader : public BatchSource {
 public:
  struct Position {
    int64_t epoch = 0;
    int64_t index = 0;  // next window within the epoch's order
  };

  // `data` must outlive the loader. Throws when the range holds less than one window. With vocab > 0 every
  // window read is checked for ids outside the vocabulary.
  WindowLoader(const TokenDataset& data, TokenRange range, int64_t seq_len, uint64_t seed,
               const std::string& what = "training data", int64_t vocab = 0);
  // Over in-memory tokens (copied).
  WindowLoader(const std::vector<int32_t>& tokens, TokenRange range, int64_t seq_len, uint64_t seed,
               const std::string& what = "training data");

  // [batch, seq_len + 1] int64 on `device`.
  torch::Tensor next(int64_t batch, torch::Device device = torch::kCPU) override;
  torch::Tensor next_part(int64_t rows, int64_t begin, int64_t count) override;
  int64_t tokens_per_row() const override { return seq_len_; }
  nlohmann::json position_json() const override { return {{"epoch", pos_.epoch}, {"index", pos_.index}}; }
  void set_position_json(const nlohmann::json& p) override;

  int64_t num_windows() const { return num_windows_; }
  int64_t seq_len() const { return seq_len_; }
  Position position() const { return pos_; }
  void set_position(const Position& p);

 private:
  void init();
  int64_t window_start(const Position& p) const;  // in the stream
  std::shared_ptr<const TokenDataset> owned_;     // the copy of in-memory tokens
  const TokenDataset* data_;
  TokenRange range_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t num_windows_;
  int64_t vocab_;
  std::string what_;
  Position pos_;
};

}  // namespace linearize
