// SFT rows for the training loop: encoded conversations laid out as BatchSource rows.
//
// A row is int64 [3, seq_len + 1]:
//   row[0] tokens; row[1] loss mask (1 where the token is an assistant token to be predicted);
//   row[2] document index within the row (0, 1, ...; -1 on padding).
// Inputs are tokens[0 .. seq_len), targets tokens[1 .. seq_len]; a target counts when its mask is 1
// and it lies in the same document as its input (so nothing is learned across a boundary).
// Without packing a row holds one conversation (cut to seq_len + 1, padded); with packing,
// conversations are placed one after another in file order, a new row starting when the next one
// does not fit (a conversation longer than a row is cut and takes a row of its own). Rows are
// visited in an order shuffled per epoch as a pure function of (seed, epoch), which is the position
// a checkpoint records.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "io/chat_template.h"
#include "train/batch_source.h"

namespace linearize {

class SftSource : public BatchSource {
 public:
  SftSource(const std::vector<EncodedChat>& chats, int64_t seq_len, bool packing, int32_t pad_id, uint64_t seed);

  torch::Tensor next(int64_t rows, torch::Device device) override;  // [rows, 3, seq_len + 1]
  int64_t tokens_per_row() const override { return seq_len_; }
  nlohmann::json position_json() const override { return {{"epoch", epoch_}, {"index", index_}}; }
  void set_position_json(const nlohmann::json& p) override;

  int64_t num_rows() const { return rows_.size(0); }
  int64_t truncated() const { return truncated_; }  // conversations cut to fit a row
  const torch::Tensor& rows() const { return rows_; }  // [N, 3, seq_len + 1] int64, CPU

 private:
  void shuffle();
  int64_t seq_len_;
  uint64_t seed_;
  torch::Tensor rows_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1, epoch_ = 0, index_ = 0, truncated_ = 0;
};

}  // namespace linearize
