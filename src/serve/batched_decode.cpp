// Batched decoding of independent sequences (see batched_decode.h).
#include "serve/batched_decode.h"

#include <algorithm>

#include "io/error.h"

namespace linearize {

namespace {

// Layer l of every row stacked: KV caches left-padded with "row_start", other tensors concatenated.
LayerState merge_layer(const std::vector<DecodeRow>& rows, size_t l, bool attention) {
  const int64_t N = static_cast<int64_t>(rows.size());
  std::vector<int64_t> pos(N);
  for (int64_t i = 0; i < N; ++i) {
    const auto& s = rows[i].state->at(l);
    if (s.position <= 0) throw Error("decode_rows: a row's state is empty (prefill it first)");
    pos[i] = s.position;
  }
  const auto [lo, hi] = std::minmax_element(pos.begin(), pos.end());
  LayerState merged;
  merged.position = *hi;
  if (attention) {
    for (const char* name : {"k", "v"}) {
      const auto first = rows[0].state->at(l).get(name);
      if (!first.defined()) throw Error(std::string("decode_rows: a row has no KV cache ") + name);
      auto padded = torch::zeros({N, first.size(1), *hi, first.size(3)}, first.options());
      for (int64_t i = 0; i < N; ++i)
        padded[i].narrow(1, *hi - pos[i], pos[i]).copy_(rows[i].state->at(l).get(name)[0].narrow(1, 0, pos[i]));
      merged.tensors[name] = padded;
    }
    if (*lo != *hi) {
      std::vector<int64_t> start(N);
      for (int64_t i = 0; i < N; ++i) start[i] = *hi - pos[i];
      merged.tensors["row_start"] = torch::tensor(start, torch::kLong).to(merged.tensors["k"].device());
    }
    return merged;
  }
  for (const auto& [name, first] : rows[0].state->at(l).tensors) {
    std::vector<torch::Tensor> parts;
    for (const auto& r : rows) {
      auto t = r.state->at(l).get(name);
      if (!t.defined()) throw Error("decode_rows: rows differ in their state tensors (" + name + ")");
      parts.push_back(t);
    }
    merged.tensors[name] = torch::cat(parts, 0);
  }
  if (*lo != *hi)
    merged.tensors["row_position"] = torch::tensor(pos, torch::kLong).to(merged.tensors.begin()->second.device());
  return merged;
}

}  // namespace

torch::Tensor decode_rows(CausalLM& model, const std::vector<DecodeRow>& rows) {
  torch::NoGradGuard no_grad;
  const auto device = model->lm_head_weight().device();
  const int64_t N = static_cast<int64_t>(rows.size());
  if (N == 0) return torch::Tensor();
  std::vector<int64_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = rows[i].token;
  const auto input = torch::tensor(ids, torch::kLong).view({N, 1}).to(device);
  if (N == 1) return model->forward(input, rows[0].state).select(1, -1).to(torch::kFloat);

  const size_t L = static_cast<size_t>(model->num_layers());
  std::vector<bool> attention(L);
  ModelState merged(L);
  for (size_t l = 0; l < L; ++l) {
    attention[l] = model->layer(static_cast<int64_t>(l))->mixer->kind() == "softmax_attention";
    merged[l] = merge_layer(rows, l, attention[l]);
  }
  auto logits = model->forward(input, &merged).select(1, -1).to(torch::kFloat);  // [N,V]

  // Each row's part: views into the batch's tensors (a row that later decodes alone copies its cache
  // before writing, model/llama.cpp).
  for (int64_t i = 0; i < N; ++i) {
    for (size_t l = 0; l < L; ++l) {
      auto& mine = rows[i].state->at(l);
      const int64_t before = mine.position;
      if (attention[l]) {
        const int64_t first = merged[l].position - 1 - before;  // the row's first real entry
        for (const char* name : {"k", "v"}) mine.tensors[name] = merged[l].get(name).narrow(0, i, 1).narrow(2, first, before + 1);
      } else {
        for (auto& [name, t] : mine.tensors) t = merged[l].get(name).narrow(0, i, 1);
      }
      mine.position = before + 1;
    }
  }
  return logits;
}

}  // namespace linearize
