// Stand-in for c10's CUDA device guard in the emulated build of ops/cuda (see ../../../simt.h): the
// emulated kernels run on the CPU, so there is no device to switch to.
#pragma once
#include <c10/core/Device.h>

namespace c10::cuda {
struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
};
}  // namespace c10::cuda
