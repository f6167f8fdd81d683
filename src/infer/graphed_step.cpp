#include "infer/graphed_step.h"

#include "compat/cuda_graph.h"
#include "io/error.h"

namespace linearize {

namespace {

bool softmax_layer(const CausalLM& model, int64_t i) { return model->layer(i)->mixer->kind() == "softmax_attention"; }

// A softmax layer's growing KV cache as one of `capacity` entries, its first `position` those of the state
// and the entry the next token goes to in "slot" [1] on the device (LlamaAttention::forward_fixed_cache).
void to_fixed_cache(LayerState& s, int64_t capacity) {
  for (const char* name : {"k", "v"}) {
    const auto t = s.get(name);  // [B,Hkv,>= position,D]
    auto fixed = torch::zeros({t.size(0), t.size(1), capacity, t.size(3)}, t.options());
    fixed.narrow(2, 0, s.position).copy_(t.narrow(2, 0, s.position));
    s.tensors[name] = fixed;
  }
  s.tensors["slot"] = torch::full({1}, s.position, s.get("k").options().dtype(torch::kLong));
}

}  // namespace

bool GraphedDecodeStep::usable(const CausalLM& model, const ModelState& state, std::string* why, Replay replay,
                               int64_t capacity) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (replay == Replay::cuda_graph) {
#ifndef LINEARIZE_WITH_CUDA
    return no("this build has no CUDA");
#else
    if (!model->lm_head_weight().is_cuda()) return no("the model is not on CUDA");
#endif
  }
  if (state.empty() || state[0].tensors.empty()) return no("the state is empty (prefill first)");
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    const auto kind = model->layer(i)->mixer->kind();
    if (kind == "retnet") return no("RetNet rotates by absolute position, which a graph would freeze");
    if (kind == "softmax_attention" && capacity <= state.at(i).position)
      return no("layer " + std::to_string(i) + " keeps softmax attention, whose KV cache needs a capacity beyond the " +
                std::to_string(state.at(i).position) + " tokens it holds");
  }
  return true;
}

struct GraphedDecodeStep::Impl {
  CausalLM model{nullptr};
  Replay replay = Replay::cuda_graph;
  int64_t capacity = 0;        // the softmax layers' KV cache entries
  std::vector<bool> fixed;     // per layer: a fixed-capacity KV cache (softmax attention)
  ModelState buffers;  // the state the step reads and then overwrites in place (update_in_place)
  torch::Tensor ids, logits;
#ifdef LINEARIZE_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  // One step: run the model on the buffers, then write back what the mixers did not update in place.
  torch::Tensor run_step() {
    ModelState s = buffers;
    auto out = model->forward(ids, &s);
    for (size_t l = 0; l < s.size(); ++l)
      for (auto& [name, t] : s[l].tensors) {
        auto& buf = buffers[l].tensors.at(name);
        if (t.sizes() != buf.sizes())
          throw Error("CUDA graph decode: state tensor " + name + " of layer " + std::to_string(l) +
                      " changes shape from step to step");
        if (!t.is_same(buf)) buf.copy_(t);
      }
    return out;
  }
  void capture();
};

#ifdef LINEARIZE_WITH_CUDA

void GraphedDecodeStep::Impl::capture() {
  const auto device = model->lm_head_weight().device();
  auto warm_up = [&] {
    auto saved = buffers;  // warm-up steps change the buffers: restore them before capture
    for (auto& layer : saved)
      for (auto& [name, t] : layer.tensors) t = t.clone();
    for (int i = 0; i < 2; ++i) run_step();
    for (size_t l = 0; l < saved.size(); ++l)
      for (auto& [name, t] : saved[l].tensors) buffers[l].tensors.at(name).copy_(t);
  };
  graph = compat::capture_cuda_graph(device, warm_up, [&] { logits = run_step(); }, "CUDA graph decode");
}

#else

void GraphedDecodeStep::Impl::capture() { throw Error("CUDA graph decode: this build has no CUDA"); }

#endif

GraphedDecodeStep::GraphedDecodeStep(CausalLM model, const ModelState& state, int64_t batch, Replay replay,
                                     int64_t capacity)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!usable(model, state, &why, replay, capacity)) throw Error("CUDA graph decode: " + why);
  torch::NoGradGuard no_grad;
  auto& m = *impl_;
  m.model = model;
  m.replay = replay;
  m.capacity = capacity;
  m.buffers = state;
  for (size_t l = 0; l < m.buffers.size(); ++l) {
    auto& layer = m.buffers[l];
    layer.update_in_place = true;  // the buffers are the graph's alone
    m.fixed.push_back(softmax_layer(model, static_cast<int64_t>(l)));
    if (m.fixed.back()) to_fixed_cache(layer, capacity);  // new k, v and slot: copies of the caches already
    for (auto& [name, t] : layer.tensors)
      if (!m.fixed.back() || (name != "k" && name != "v" && name != "slot")) t = t.clone();
  }
  m.ids = torch::zeros({batch, 1}, torch::TensorOptions().dtype(torch::kLong).device(model->lm_head_weight().device()));
  if (replay == Replay::cuda_graph) m.capture();
}

GraphedDecodeStep::~GraphedDecodeStep() = default;

torch::Tensor GraphedDecodeStep::step(const torch::Tensor& ids) {
  auto& m = *impl_;
  if (ids.sizes() != m.ids.sizes())
    throw Error("CUDA graph decode: captured for ids of shape [" + std::to_string(m.ids.size(0)) + ", 1]");
  for (size_t l = 0; l < m.buffers.size(); ++l)
    if (m.fixed[l] && m.buffers[l].position >= m.capacity)
      throw Error("CUDA graph decode: the KV cache is full (its capacity is " + std::to_string(m.capacity) + " tokens)");
  torch::NoGradGuard no_grad;
  m.ids.copy_(ids);
#ifdef LINEARIZE_WITH_CUDA
  if (m.graph) m.graph->replay();
#endif
  if (m.replay == Replay::eager) m.logits = m.run_step();
  for (auto& layer : m.buffers) ++layer.position;
  return m.logits;
}

ModelState GraphedDecodeStep::state() const {
  ModelState out = impl_->buffers;
  for (size_t l = 0; l < out.size(); ++l) {
    auto& layer = out[l];
    for (auto& [name, t] : layer.tensors) t = t.clone();
    layer.update_in_place = false;
    layer.tensors.erase("slot");  // a fixed cache goes back as a growing one: `position` entries, room after them
  }
  return out;
}

void GraphedDecodeStep::load(const ModelState& state) {
  auto& m = *impl_;
  auto refuse = [](const std::string& what) { throw Error("CUDA graph decode: load: " + what); };
  if (state.size() != m.buffers.size()) refuse("a state of " + std::to_string(state.size()) + " layers, captured for " + std::to_string(m.buffers.size()));
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < state.size(); ++l) {
    auto& mine = m.buffers[l];
    const std::string layer = "layer " + std::to_string(l);
    if (state[l].tensors.size() + (m.fixed[l] ? 1 : 0) != mine.tensors.size())
      refuse(layer + " has other state tensors than the ones captured");
    if (m.fixed[l] && state[l].position >= m.capacity)
      refuse(layer + " holds " + std::to_string(state[l].position) + " tokens, the KV cache " + std::to_string(m.capacity));
    for (auto& [name, buf] : mine.tensors) {
      if (m.fixed[l] && name == "slot") {
        buf.fill_(state[l].position);
        continue;
      }
      const auto t = state[l].get(name);
      const bool cache = m.fixed[l] && (name == "k" || name == "v");  // the first `position` entries
      if (!t.defined() || (cache ? t.dim() != 4 || t.size(2) < state[l].position || t.size(0) != buf.size(0) ||
                                       t.size(1) != buf.size(1) || t.size(3) != buf.size(3)
                                 : t.sizes() != buf.sizes()))
        refuse(layer + "'s " + name + " is missing or has another shape than the one captured");
      if (cache) buf.narrow(2, 0, state[l].position).copy_(t.narrow(2, 0, state[l].position));
      else buf.copy_(t);
    }
    mine.position = state[l].position;
  }
}

int64_t GraphedDecodeStep::batch() const { return impl_->ids.size(0); }

}  // namespace linearize
