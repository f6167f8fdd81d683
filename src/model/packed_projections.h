// Linear layers that read one input (a mixer's q, k, v and gate projections, the MLP's gate and up), run
// as one matrix product in a forward without gradients once packed.
//
//   pack():    W = [W_1; W_2; ...] [Σ out_i, in] (biases alike, zeros for a layer without one); each layer's
//              own weight becomes the view W[rows of i], so packing adds no memory, and whatever trains,
//              loads or saves through the layers sees and changes the same numbers.
//   forward(): y = x W^T + b split by layer, [..., out_i] each (views of y), when packed, no gradient
//              wanted for the weights (no gradient mode, or frozen weights: a distillation teacher), x of
//              at most kMaxPackedRows rows and every layer still holding its view; otherwise each layer
//              on its own.
//
// One launch instead of several matters where a step is bound by launching kernels: decoding. The outputs
// of one product are strided views; the short conv, the decode step, the norms and SwiGLU read them in
// place, but the chunked kernels copy them first, and for many rows (a prefill, an evaluation batch)
// those copies would cost more than the launches saved, so such inputs run the layers one by one. A move to another device or dtype gives the layers
// new weights, which ends the packing (forward falls back; pack() again to renew it).
#pragma once
#include <torch/torch.h>

#include <vector>

namespace linearize {

// The outputs of one forward, looked up by the layer that made them.
class ProjectionOutputs {
 public:
  ProjectionOutputs(std::vector<const torch::nn::LinearImpl*> layers, std::vector<torch::Tensor> outputs)
      : layers_(std::move(layers)), outputs_(std::move(outputs)) {}
  // The output of `layer`, [..., out]; throws std::logic_error for a layer not in the group.
  const torch::Tensor& operator[](const torch::nn::Linear& layer) const;

 private:
  std::vector<const torch::nn::LinearImpl*> layers_;
  std::vector<torch::Tensor> outputs_;
};

class PackedProjections {
 public:
  static constexpr int64_t kMaxPackedRows = 1024;  // rows of x (tokens of the batch) a packed product takes

  // Adds a layer reading the group's input; an empty holder (an optional layer left out) is skipped.
  void add(const torch::nn::Linear& layer);
  ProjectionOutputs forward(const torch::Tensor& x);
  ProjectionOutputs operator()(const torch::Tensor& x) { return forward(x); }

  // Stacks the weights; nothing to do for fewer than two layers or for layers on different devices or
  // dtypes. It rebinds the layers' weights: call it before an optimizer or anything else keeps their
  // storage, i.e. on models loaded for inference.
  void pack();
  // Packed, and every layer still reads its rows of the stack.
  bool packed() const;

 private:
  std::vector<torch::nn::Linear> layers_;
  torch::Tensor weight_, bias_;    // [Σ out_i, in], [Σ out_i] or undefined
  std::vector<int64_t> sizes_;     // out_i
};

}  // namespace linearize
