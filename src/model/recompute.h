// Activation recomputation for training large students in little memory: a decoder layer run this way
// keeps only its input for the backward pass; backward runs the layer again (with the autocast state
// of the forward) and back-propagates through that second run. Costs one more forward per layer.
#pragma once
#include <torch/torch.h>

namespace linearize {

class DecoderLayerImpl;

// layer->forward(x, nullptr) with recomputation in backward. The layer must outlive the graph.
torch::Tensor forward_recomputed(DecoderLayerImpl& layer, const torch::Tensor& x);

}  // namespace linearize
