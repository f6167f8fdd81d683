// Batched decoding of independent sequences (see batched_decode.h).
#include "serve/batched_decode.h"

#include <algorithm>
#include <iostream>

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

// Row `row` of a stacked layer state, as views: a KV cache's `position` entries from `first` (the left
// padding before them dropped), any other tensor's row (the batch's "row_position" excepted). A row that
// later writes its cache copies it first (model/llama.cpp).
LayerState row_of(const LayerState& all, int64_t row, bool attention, int64_t first, int64_t position) {
  LayerState mine;
  if (attention) {
    for (const char* name : {"k", "v"}) mine.tensors[name] = all.get(name).narrow(0, row, 1).narrow(2, first, position);
  } else {
    for (const auto& [name, t] : all.tensors)
      if (name != "row_position") mine.tensors[name] = t.narrow(0, row, 1);
  }
  mine.position = position;
  return mine;
}

bool is_attention(CausalLM& model, size_t layer) {
  return model->layer(static_cast<int64_t>(layer))->mixer->kind() == "softmax_attention";
}

}  // namespace

torch::Tensor decode_rows(CausalLM& model, const std::vector<DecodeRow>& rows) {
  DecodeBatch batch(model);
  auto logits = batch.step(rows);
  batch.flush();
  return logits;
}

torch::Tensor prefill_rows(CausalLM& model, const std::vector<const std::vector<int32_t>*>& prompts,
                           const std::vector<ModelState*>& states) {
  torch::NoGradGuard no_grad;
  const auto device = model->lm_head_weight().device();
  const int64_t N = static_cast<int64_t>(prompts.size());
  if (N == 0) return torch::Tensor();
  if (states.size() != prompts.size()) throw Error("prefill_rows: one state per prompt");
  size_t shortest = prompts[0]->size();
  for (const auto* p : prompts) {
    if (p->empty()) throw Error("prefill_rows: an empty prompt");
    shortest = std::min(shortest, p->size());
  }
  const int64_t P = N > 1 ? static_cast<int64_t>(shortest) - 1 : 0;
  ModelState shared = model->new_state();
  if (P > 0) {
    std::vector<int64_t> ids;
    for (const auto* p : prompts) ids.insert(ids.end(), p->begin(), p->begin() + P);
    model->hidden_states(torch::tensor(ids, torch::kLong).view({N, P}).to(device), &shared);
  }
  std::vector<torch::Tensor> logits;
  for (int64_t i = 0; i < N; ++i) {
    ModelState& mine = *states[static_cast<size_t>(i)];
    mine = model->new_state();
    if (P > 0)
      for (size_t l = 0; l < shared.size(); ++l) {
        for (const auto& [name, t] : shared[l].tensors)
          if (t.dim() == 0 || t.size(0) != N)
            throw Error("prefill_rows: layer " + std::to_string(l) + "'s state tensor " + name + " is not one row per prompt");
        mine[l] = row_of(shared[l], i, is_attention(model, l), 0, shared[l].position);
      }
    const auto& p = *prompts[static_cast<size_t>(i)];
    const auto tail = torch::tensor(std::vector<int64_t>(p.begin() + P, p.end()), torch::kLong).unsqueeze(0).to(device);
    const auto h = model->hidden_states(tail, &mine);  // [1, T, hidden]
    logits.push_back(model->logits_from_hidden(h.narrow(1, h.size(1) - 1, 1)).view({1, -1}));
  }
  return torch::cat(logits, 0).to(torch::kFloat);
}

DecodeBatch::~DecodeBatch() = default;

namespace {

// `t` with its first row repeated until it has `size` rows.
torch::Tensor pad_rows(const torch::Tensor& t, int64_t size) {
  if (t.size(0) >= size) return t;
  std::vector<int64_t> reps(static_cast<size_t>(t.dim()), 1);
  reps[0] = size - t.size(0);
  return torch::cat({t, t.narrow(0, 0, 1).repeat(reps)}, 0);
}

GraphedDecodeStep::Replay replay_of(DecodeGraphs graphs) {
  return graphs == DecodeGraphs::stand_in ? GraphedDecodeStep::Replay::eager : GraphedDecodeStep::Replay::cuda_graph;
}

}  // namespace

bool DecodeBatch::graphable(const ModelState& state) const {
  return graphs_ != DecodeGraphs::off && GraphedDecodeStep::usable(model_, state, nullptr, replay_of(graphs_));
}

bool DecodeBatch::enter_graph() {
  if (!graphable(merged_)) return false;
  const int64_t N = static_cast<int64_t>(members_.size());
  int64_t size = 1;
  while (size < N) size *= 2;
  ModelState padded = merged_;  // no per-row positions: the mixers a graph serves have none
  for (auto& layer : padded) {
    layer.tensors.erase("row_position");
    for (auto& [name, t] : layer.tensors) t = pad_rows(t, size);
  }
  auto& graph = graph_by_batch_[size];
  try {
    if (graph) graph->load(padded);
    else graph = std::make_unique<GraphedDecodeStep>(model_, padded, size, replay_of(graphs_));
  } catch (const std::exception& e) {
    std::cerr << "[decode] decoding without CUDA graphs: " << e.what() << "\n";
    graph_by_batch_.erase(size);
    graphs_ = DecodeGraphs::off;
    return false;
  }
  graph_ = graph.get();
  merged_.clear();  // the graph's buffers hold the state now
  return true;
}

torch::Tensor DecodeBatch::step(const std::vector<DecodeRow>& rows) {
  torch::NoGradGuard no_grad;
  const auto device = model_->lm_head_weight().device();
  const int64_t N = static_cast<int64_t>(rows.size());
  if (N == 0) return torch::Tensor();
  std::vector<int64_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = rows[i].token;
  const auto input = torch::tensor(ids, torch::kLong).view({N, 1}).to(device);
  bool same = static_cast<int64_t>(members_.size()) == N;
  for (int64_t i = 0; same && i < N; ++i) same = members_[i] == rows[i].state;
  if (!same) {
    flush();
    if (N == 1 && !graphable(*rows[0].state))  // alone: on its own state, nothing stacked
      return model_->forward(input, rows[0].state).select(1, -1).to(torch::kFloat);
    const size_t L = static_cast<size_t>(model_->num_layers());
    attention_.assign(L, false);
    merged_.assign(L, LayerState());
    for (size_t l = 0; l < L; ++l) {
      attention_[l] = is_attention(model_, l);
      merged_[l] = merge_layer(rows, l, attention_[l]);
    }
    for (const auto& r : rows) {
      members_.push_back(r.state);
      positions_.push_back(r.state->at(0).position);
      for (auto& layer : *r.state) layer.tensors.clear();  // held by the batch until flush()
    }
    enter_graph();
  }
  if (graph_) {  // rows past N feed row 0's token; the logits are copied out of the graph's buffer
    auto logits = graph_->step(pad_rows(input, graph_->batch())).narrow(0, 0, N).select(1, -1).to(torch::kFloat, false, true);
    for (auto& p : positions_) ++p;
    return logits;
  }
  auto logits = model_->forward(input, &merged_).select(1, -1).to(torch::kFloat);  // [N,V]
  for (auto& p : positions_) ++p;
  // Rows at different positions: RetNet's per-row positions move on with them (the KV caches' row
  // starts stay where they are).
  for (auto& layer : merged_)
    if (layer.has("row_position")) layer.tensors["row_position"] = layer.tensors["row_position"] + 1;
  return logits;
}

void DecodeBatch::flush() {
  if (graph_) {  // each row's part of a copy of the graph's buffers
    const ModelState all = graph_->state();
    for (size_t i = 0; i < members_.size(); ++i)
      for (size_t l = 0; l < all.size(); ++l)
        members_[i]->at(l) = row_of(all[l], static_cast<int64_t>(i), false, 0, positions_[i]);
    forget();
    return;
  }
  // Each row's part: views into the batch's tensors (a row that later decodes alone copies its cache
  // before writing, model/llama.cpp).
  for (size_t i = 0; i < members_.size(); ++i)
    for (size_t l = 0; l < merged_.size(); ++l)  // a KV cache's first real entry follows the row's left padding
      members_[i]->at(l) = row_of(merged_[l], static_cast<int64_t>(i), attention_[l],
                                  merged_[l].position - positions_[i], positions_[i]);
  forget();
}

}  // namespace linearize
