// Training data: fixed windows cut from one token stream (a .u32 shard), in a shuffled order that is
// a pure function of (seed, epoch), so that a checkpointed position resumes exactly.
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

#include "train/batch_source.h"

namespace linearize {

struct TokenRange {
  int64_t begin = 0, end = 0;  // [begin, end) in the stream
  int64_t size() const { return end - begin; }
};

// Consecutive disjoint ranges of a stream of n tokens: `parts` are fractions (summing to <= 1) when
// all are < 1 and sum <= 1, token counts otherwise. Throws when they do not fit.
std::vector<TokenRange> split_stream(int64_t n, const std::vector<double>& parts);

class WindowLoader : public BatchSource {
 public:
  struct Position {
    int64_t epoch = 0;
    int64_t index = 0;  // next window within the epoch's order
  };

  // tokens must outlive the loader. Throws when the range holds less than one window.
  WindowLoader(const std::vector<int32_t>& tokens, TokenRange range, int64_t seq_len, uint64_t seed,
               const std::string& what = "training data");

  // [batch, seq_len + 1] int64 on `device`.
  torch::Tensor next(int64_t batch, torch::Device device = torch::kCPU) override;
  int64_t tokens_per_row() const override { return seq_len_; }
  nlohmann::json position_json() const override { return {{"epoch", pos_.epoch}, {"index", pos_.index}}; }
  void set_position_json(const nlohmann::json& p) override;

  int64_t num_windows() const { return num_windows_; }
  int64_t seq_len() const { return seq_len_; }
  Position position() const { return pos_; }
  void set_position(const Position& p);

 private:
  void shuffle_epoch();
  const std::vector<int32_t>& tokens_;
  TokenRange range_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t num_windows_;
  std::vector<int64_t> order_;  // window starts of the current epoch
  int64_t order_epoch_ = -1;
  Position pos_;
};

}  // namespace linearize
