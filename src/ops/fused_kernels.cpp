// Compiled only in builds with kernels (the GPU build, or the CPU build's emulator), as every fused_*.cpp of
// src/ops; ops/no_kernels.cpp takes their place otherwise.
#include "ops/chunk/chunk.h"

namespace linearize::ops::detail {

bool kernels_built() { return true; }

}  // namespace linearize::ops::detail
