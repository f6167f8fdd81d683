#include "model/recompute.h"

#include "compat/torch_compat.h"
#include "model/causal_lm.h"

namespace linearize {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs: x, the layer's address, and the CUDA and CPU autocast states of the forward.
struct RecomputedLayer : public torch::autograd::Function<RecomputedLayer> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t layer, bool cuda_autocast,
                               int64_t cuda_dtype, bool cpu_autocast, int64_t cpu_dtype) {
    ctx->save_for_backward({x});
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["cuda_autocast"] = cuda_autocast;
    ctx->saved_data["cuda_dtype"] = cuda_dtype;
    ctx->saved_data["cpu_autocast"] = cpu_autocast;
    ctx->saved_data["cpu_dtype"] = cpu_dtype;
    return reinterpret_cast<DecoderLayerImpl*>(layer)->forward(x, nullptr);  // grad mode is off here
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    torch::Tensor y;
    {
      // Backward runs on autograd's thread, where autocast is off: replay the forward's state.
      torch::AutoGradMode grad_on(true);
      compat::AutocastGuard cuda(torch::kCUDA, static_cast<torch::ScalarType>(ctx->saved_data["cuda_dtype"].toInt()),
                                 ctx->saved_data["cuda_autocast"].toBool());
      compat::AutocastGuard cpu(torch::kCPU, static_cast<torch::ScalarType>(ctx->saved_data["cpu_dtype"].toInt()),
                                ctx->saved_data["cpu_autocast"].toBool());
      y = layer->forward(x, nullptr);
    }
    // Parameter gradients accumulate into .grad as in a plain backward; x's comes back to the caller.
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor forward_recomputed(DecoderLayerImpl& layer, const torch::Tensor& x) {
  // With an input outside the graph (a frozen embedding), the layer's own parameters would get no
  // gradient: give the function an input that autograd tracks.
  const torch::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  const auto cuda = compat::autocast_state(torch::kCUDA), cpu = compat::autocast_state(torch::kCPU);
  return RecomputedLayer::apply(input, reinterpret_cast<int64_t>(&layer), cuda.enabled, static_cast<int64_t>(cuda.dtype),
                                cpu.enabled, static_cast<int64_t>(cpu.dtype));
}

}  // namespace linearize
