#include "infer/graphed_step.h"

#include "io/error.h"

#ifdef LINEARIZE_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace linearize {

bool GraphedDecodeStep::usable(const CausalLM& model, const ModelState& state, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
#ifndef LINEARIZE_WITH_CUDA
  (void)model, (void)state;
  return no("this build has no CUDA");
#else
  if (!model->lm_head_weight().is_cuda()) return no("the model is not on CUDA");
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    const auto kind = model->layer(i)->mixer->kind();
    if (kind == "softmax_attention") return no("layer " + std::to_string(i) + " keeps softmax attention (growing KV cache)");
    if (kind == "retnet") return no("RetNet rotates by absolute position, which a graph would freeze");
  }
  if (state.empty() || state[0].tensors.empty()) return no("the state is empty (prefill first)");
  return true;
#endif
}

#ifdef LINEARIZE_WITH_CUDA

namespace {
// Work queued on `waiter` from now on starts after what is queued on `on` so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  at::cuda::CUDAEvent event;
  event.record(on);
  event.block(waiter);
}
}  // namespace

struct GraphedDecodeStep::Impl {
  CausalLM model{nullptr};
  ModelState buffers;  // the state the graph reads and then overwrites in place
  torch::Tensor ids, logits;
  at::cuda::CUDAGraph graph;
};

GraphedDecodeStep::GraphedDecodeStep(CausalLM model, const ModelState& state, int64_t batch)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!usable(model, state, &why)) throw Error("CUDA graph decode: " + why);
  torch::NoGradGuard no_grad;
  auto& m = *impl_;
  m.model = model;
  const auto device = model->lm_head_weight().device();
  const c10::cuda::CUDAGuard device_guard(device);
  m.buffers = state;
  for (auto& layer : m.buffers)
    for (auto& [name, t] : layer.tensors) t = t.clone();
  m.ids = torch::zeros({batch, 1}, torch::TensorOptions().dtype(torch::kLong).device(device));

  // One step: run the model on the buffers, then write the new state back into them.
  auto run_step = [&] {
    ModelState s = m.buffers;
    auto logits = m.model->forward(m.ids, &s);
    for (size_t l = 0; l < s.size(); ++l)
      for (auto& [name, t] : s[l].tensors) {
        auto& buf = m.buffers[l].tensors.at(name);
        if (t.sizes() != buf.sizes())
          throw Error("CUDA graph decode: state tensor " + name + " of layer " + std::to_string(l) +
                      " changes shape from step to step");
        buf.copy_(t);
      }
    return logits;
  };
  // Capture runs on a side stream, after warm-up there (cuBLAS workspaces, allocator pools).
  auto side = c10::cuda::getStreamFromPool(false, device.index());
  const auto main_stream = c10::cuda::getCurrentCUDAStream(device.index());
  wait_for(side, main_stream);
  {
    const c10::cuda::CUDAStreamGuard stream_guard(side);
    auto saved = m.buffers;  // warm-up steps change the buffers: restore them before capture
    for (auto& layer : saved)
      for (auto& [name, t] : layer.tensors) t = t.clone();
    for (int i = 0; i < 2; ++i) run_step();
    for (size_t l = 0; l < saved.size(); ++l)
      for (auto& [name, t] : saved[l].tensors) m.buffers[l].tensors.at(name).copy_(t);
    try {
      m.graph.capture_begin();
      m.logits = run_step();
      m.graph.capture_end();
    } catch (const c10::Error& e) {
      throw Error(std::string("CUDA graph decode: capture failed: ") + e.what_without_backtrace());
    }
  }
  wait_for(main_stream, side);
}

GraphedDecodeStep::~GraphedDecodeStep() = default;

torch::Tensor GraphedDecodeStep::step(const torch::Tensor& ids) {
  auto& m = *impl_;
  if (ids.sizes() != m.ids.sizes())
    throw Error("CUDA graph decode: captured for ids of shape [" + std::to_string(m.ids.size(0)) + ", 1]");
  m.ids.copy_(ids);
  m.graph.replay();
  for (auto& layer : m.buffers) ++layer.position;
  return m.logits;
}

ModelState GraphedDecodeStep::state() const {
  ModelState out = impl_->buffers;
  for (auto& layer : out)
    for (auto& [name, t] : layer.tensors) t = t.clone();
  return out;
}

#else

struct GraphedDecodeStep::Impl {};

GraphedDecodeStep::GraphedDecodeStep(CausalLM, const ModelState&, int64_t) {
  throw Error("CUDA graph decode: this build has no CUDA");
}
GraphedDecodeStep::~GraphedDecodeStep() = default;
torch::Tensor GraphedDecodeStep::step(const torch::Tensor&) { return {}; }
ModelState GraphedDecodeStep::state() const { return {}; }

#endif

}  // namespace linearize
