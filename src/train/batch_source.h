// Where the training loop takes its batches from. A source hands out rows (one sequence each) in a
// fixed order that is a pure function of its seed, and can report and restore its position, so a
// checkpoint resumes exactly, with the same or a different number of processes.
//
// The layout of a row is the source's business; the loop only slices along the first dimension
// (micro-batches, data-parallel shards) and hands the slices to the caller's step function.
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>

namespace linearize {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next `rows` rows of the order, on `device`.
  virtual torch::Tensor next(int64_t rows, torch::Device device) = 0;
  // Advances past the next `rows` rows but returns only [begin, begin + count) of them, on the CPU: a
  // data-parallel rank reads only its own rows. By default all rows are made and sliced.
  virtual torch::Tensor next_part(int64_t rows, int64_t begin, int64_t count) {
    return next(rows, torch::kCPU).narrow(0, begin, count);
  }
  // Tokens a row contributes to the tokens/s figure.
  virtual int64_t tokens_per_row() const = 0;
  virtual nlohmann::json position_json() const = 0;
  virtual void set_position_json(const nlohmann::json& position) = 0;
};

}  // namespace linearize
