// Capturing a CUDA graph the way the graphed decode step (infer/graphed_step.h) and the graphed training step
// (train/graphed_train_step.h) both do it. CUDA builds only.
#pragma once
#ifdef LINEARIZE_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace linearize::compat {

// Runs warm_up() once and then captures body() into a graph, both on a side stream of `device` (cuBLAS
// workspaces, the allocator's pools and autograd's threads are set up there before the capture). The side
// stream starts after the work queued on the current stream so far, and the current stream's later work
// waits for the side's. A capture that fails is ended, so that the caller can go on eagerly, and throws
// linearize::Error "<what>: capture failed: <reason>".
std::unique_ptr<at::cuda::CUDAGraph> capture_cuda_graph(const torch::Device& device,
                                                        const std::function<void()>& warm_up,
                                                        const std::function<void()>& body, const std::string& what);

}  // namespace linearize::compat
#endif
