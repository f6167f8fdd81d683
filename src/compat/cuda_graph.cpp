#include "compat/cuda_graph.h"

#ifdef LINEARIZE_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "io/error.h"

namespace linearize::compat {

namespace {

// Work queued on `waiter` from now on starts after what is queued on `on` so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  at::cuda::CUDAEvent event;
  event.record(on);
  event.block(waiter);
}

}  // namespace

std::unique_ptr<at::cuda::CUDAGraph> capture_cuda_graph(const torch::Device& device,
                                                        const std::function<void()>& warm_up,
                                                        const std::function<void()>& body, const std::string& what) {
  const c10::cuda::CUDAGuard device_guard(device);
  auto side = c10::cuda::getStreamFromPool(false, device.index());
  const auto main_stream = c10::cuda::getCurrentCUDAStream(device.index());
  wait_for(side, main_stream);
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  bool failed = false;
  std::string failure;
  {
    const c10::cuda::CUDAStreamGuard stream_guard(side);
    try {
      warm_up();
      graph = std::make_unique<at::cuda::CUDAGraph>();
      graph->capture_begin();
      body();
      graph->capture_end();
    } catch (const c10::Error& e) {
      failed = true, failure = e.what_without_backtrace();
    } catch (const std::exception& e) {
      failed = true, failure = e.what();
    }
    if (failed) {
      // An op the graph cannot hold (one that reads the device on the host, say): end the capture the error
      // left open.
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
        cudaGraph_t abandoned = nullptr;
        if (cudaStreamEndCapture(side.stream(), &abandoned) == cudaSuccess && abandoned) cudaGraphDestroy(abandoned);
      }
      (void)cudaGetLastError();
      graph.reset();
    }
  }
  wait_for(main_stream, side);  // what follows (eager work, or the replays) comes after the side's work
  if (failed) throw Error(what + ": capture failed: " + failure);
  return graph;
}

}  // namespace linearize::compat
#endif
