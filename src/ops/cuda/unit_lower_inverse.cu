// Inverse of unit lower-triangular matrices, (I + L)^{-1} with L strictly lower (see unit_lower_inverse.h).
//
// One block per matrix, one thread per column c of the inverse: forward substitution of
// (I + L) x = e_c, x_r = [r == c] - Σ_{j<r} L[r,j] x_j. Every thread runs the same (r, j) loop, so the
// L[r,j] reads are shared-memory broadcasts and x (column c of X, [C][C] in shared memory) is read
// without bank conflicts; entries above the diagonal come out zero without a branch. fp32.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/unit_lower_inverse.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/shared_memory.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

__global__ void unit_lower_inverse_kernel(const float* __restrict__ L, float* __restrict__ T, int C) {
  LINEARIZE_DYNAMIC_SHARED(float, shared);
  float* Ls = shared;         // [C][C]
  float* X = shared + C * C;  // [C][C], column c belongs to thread c
  const size_t base = static_cast<size_t>(blockIdx.x) * C * C;
  for (int e = threadIdx.x; e < C * C; e += blockDim.x) Ls[e] = L[base + e];
  __syncthreads();
  const int c = threadIdx.x;
  for (int r = 0; r < C; ++r) {
    float x = (r == c) ? 1.f : 0.f;
    for (int j = 0; j < r; ++j) x -= Ls[r * C + j] * X[j * C + c];
    X[r * C + c] = x;
  }
  for (int r = 0; r < C; ++r) T[base + r * C + c] = X[r * C + c];
}

}  // namespace

torch::Tensor unit_lower_inverse(const torch::Tensor& L) {
  const int64_t C = L.size(-1);
  TORCH_CHECK(L.size(-2) == C && C <= kMaxInverseSize, "unit_lower_inverse: square matrices of at most ",
              kMaxInverseSize, " rows expected");
  const c10::cuda::CUDAGuard guard(L.device());
  auto Lc = L.to(torch::kFloat).contiguous();
  auto T = torch::empty_like(Lc);
  const int64_t M = Lc.numel() / (C * C);
  if (M == 0) return T;
  const size_t smem = 2 * C * C * sizeof(float);
  launch(unit_lower_inverse_kernel, static_cast<unsigned>(M), static_cast<unsigned>(C), smem, Lc.data_ptr<float>(),
         T.data_ptr<float>(), static_cast<int>(C));
  return T;
}

}  // namespace linearize::ops::cuda_kernels
