#include "infer/graphed_step.h"

#include "io/error.h"

#ifdef LINEARIZE_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace linearize {

bool GraphedDecodeStep::usable(const CausalLM& model, const ModelState& state, std::string* why, Replay replay) {
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
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    const auto kind = model->layer(i)->mixer->kind();
    if (kind == "softmax_attention") return no("layer " + std::to_string(i) + " keeps softmax attention (growing KV cache)");
    if (kind == "retnet") return no("RetNet rotates by absolute position, which a graph would freeze");
  }
  if (state.empty() || state[0].tensors.empty()) return no("the state is empty (prefill first)");
  return true;
}

struct GraphedDecodeStep::Impl {
  CausalLM model{nullptr};
  Replay replay = Replay::cuda_graph;
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

namespace {
// Work queued on `waiter` from now on starts after what is queued on `on` so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  at::cuda::CUDAEvent event;
  event.record(on);
  event.block(waiter);
}
}  // namespace

void GraphedDecodeStep::Impl::capture() {
  // Capture runs on a side stream, after warm-up there (cuBLAS workspaces, allocator pools).
  const auto device = model->lm_head_weight().device();
  const c10::cuda::CUDAGuard device_guard(device);
  auto side = c10::cuda::getStreamFromPool(false, device.index());
  const auto main_stream = c10::cuda::getCurrentCUDAStream(device.index());
  wait_for(side, main_stream);
  {
    const c10::cuda::CUDAStreamGuard stream_guard(side);
    auto saved = buffers;  // warm-up steps change the buffers: restore them before capture
    for (auto& layer : saved)
      for (auto& [name, t] : layer.tensors) t = t.clone();
    for (int i = 0; i < 2; ++i) run_step();
    for (size_t l = 0; l < saved.size(); ++l)
      for (auto& [name, t] : saved[l].tensors) buffers[l].tensors.at(name).copy_(t);
    try {
      graph = std::make_unique<at::cuda::CUDAGraph>();
      graph->capture_begin();
      logits = run_step();
      graph->capture_end();
    } catch (const c10::Error& e) {
      throw Error(std::string("CUDA graph decode: capture failed: ") + e.what_without_backtrace());
    }
  }
  wait_for(main_stream, side);
}

#else

void GraphedDecodeStep::Impl::capture() { throw Error("CUDA graph decode: this build has no CUDA"); }

#endif

GraphedDecodeStep::GraphedDecodeStep(CausalLM model, const ModelState& state, int64_t batch, Replay replay)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!usable(model, state, &why, replay)) throw Error("CUDA graph decode: " + why);
  torch::NoGradGuard no_grad;
  auto& m = *impl_;
  m.model = model;
  m.replay = replay;
  m.buffers = state;
  for (auto& layer : m.buffers) {
    for (auto& [name, t] : layer.tensors) t = t.clone();
    layer.update_in_place = true;  // the buffers are the graph's alone
  }
  m.ids = torch::zeros({batch, 1}, torch::TensorOptions().dtype(torch::kLong).device(model->lm_head_weight().device()));
  if (replay == Replay::cuda_graph) m.capture();
}

GraphedDecodeStep::~GraphedDecodeStep() = default;

torch::Tensor GraphedDecodeStep::step(const torch::Tensor& ids) {
  auto& m = *impl_;
  if (ids.sizes() != m.ids.sizes())
    throw Error("CUDA graph decode: captured for ids of shape [" + std::to_string(m.ids.size(0)) + ", 1]");
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
  for (auto& layer : out) {
    for (auto& [name, t] : layer.tensors) t = t.clone();
    layer.update_in_place = false;
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
    if (state[l].tensors.size() != mine.tensors.size())
      refuse("layer " + std::to_string(l) + " has other state tensors than the ones captured");
    for (auto& [name, buf] : mine.tensors) {
      const auto t = state[l].get(name);
      if (!t.defined() || t.sizes() != buf.sizes())
        refuse("layer " + std::to_string(l) + "'s " + name + " is missing or has another shape than the one captured");
      buf.copy_(t);
    }
    mine.position = state[l].position;
  }
}

int64_t GraphedDecodeStep::batch() const { return impl_->ids.size(0); }

}  // namespace linearize
