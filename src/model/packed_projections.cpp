#include "model/packed_projections.h"

#include <stdexcept>

namespace linearize {

const torch::Tensor& ProjectionOutputs::operator[](const torch::nn::Linear& layer) const {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i] == layer.get()) return outputs_[i];
  throw std::logic_error("ProjectionOutputs: the layer asked for was not added to the group");
}

void PackedProjections::add(const torch::nn::Linear& layer) {
  if (!layer.is_empty()) layers_.push_back(layer);
}

void PackedProjections::pack() {
  weight_ = bias_ = torch::Tensor();
  sizes_.clear();
  if (layers_.size() < 2) return;
  const auto& first = layers_.front()->weight;
  bool any_bias = false;
  for (const auto& l : layers_) {
    const auto& w = l->weight;
    if (w.device() != first.device() || w.scalar_type() != first.scalar_type() || w.size(1) != first.size(1)) return;
    if (l->bias.defined()) {
      if (l->bias.scalar_type() != first.scalar_type()) return;
      any_bias = true;
    }
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> weights, biases;
  for (const auto& l : layers_) {
    weights.push_back(l->weight);
    sizes_.push_back(l->weight.size(0));
    if (any_bias) biases.push_back(l->bias.defined() ? l->bias : torch::zeros({l->weight.size(0)}, first.options()));
  }
  weight_ = torch::cat(weights, 0);  // [Σ out_i, in]
  if (any_bias) bias_ = torch::cat(biases, 0);
  int64_t row = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto& l = layers_[i];
    l->weight.set_data(weight_.narrow(0, row, sizes_[i]));
    if (l->bias.defined()) l->bias.set_data(bias_.narrow(0, row, sizes_[i]));
    row += sizes_[i];
  }
}

bool PackedProjections::packed() const {
  if (!weight_.defined()) return false;
  const auto* w0 = static_cast<const char*>(weight_.data_ptr());
  const auto* b0 = bias_.defined() ? static_cast<const char*>(bias_.data_ptr()) : nullptr;
  const auto row_bytes = weight_.stride(0) * weight_.element_size();
  int64_t row = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto& w = layers_[i]->weight;
    if (w.scalar_type() != weight_.scalar_type() || w.size(0) != sizes_[i] || w.data_ptr() != w0 + row * row_bytes)
      return false;
    const auto& b = layers_[i]->bias;
    if (b.defined() && (!b0 || b.scalar_type() != bias_.scalar_type() || b.data_ptr() != b0 + row * bias_.element_size()))
      return false;
    row += sizes_[i];
  }
  return true;
}

ProjectionOutputs PackedProjections::forward(const torch::Tensor& x) {
  const bool is_packed = packed();
  if (weight_.defined() && !is_packed) weight_ = bias_ = torch::Tensor();  // the layers moved on: free the stack
  std::vector<const torch::nn::LinearImpl*> keys;
  std::vector<torch::Tensor> outputs;
  for (const auto& l : layers_) keys.push_back(l.get());
  const auto weights_need_grad = [&] {
    if (!torch::GradMode::is_enabled()) return false;
    for (const auto& l : layers_)
      if (l->weight.requires_grad() || (l->bias.defined() && l->bias.requires_grad())) return true;
    return false;
  };
  const int64_t rows = x.dim() > 0 && x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
  if (rows <= kMaxPackedRows && is_packed && !weights_need_grad()) {
    outputs = torch::linear(x, weight_, bias_).split_with_sizes(sizes_, -1);  // [..., out_i] views
  } else {
    for (auto& l : layers_) outputs.push_back(l->forward(x));
  }
  return {std::move(keys), std::move(outputs)};
}

}  // namespace linearize
