// Diagonal sub-blocks of the vector-gated intra-chunk scores (see diagonal_scores.h for the math and shapes).
//
// The libtorch form builds the pairwise factors exp(G_r - G_j) as a [c, c, K] tensor per sub-chunk
// (c = 16: 16x the size of q); these kernels keep them in registers.
// Forward: one block per sub-chunk, one thread per (r, j); X, Y, G staged in shared memory with padded
// rows, so the 16 different j of a warp read 16 different banks.
// Backward: one thread per (sub-chunk, channel d) holds the column d of X, Y and G in registers and
// walks the c(c+1)/2 pairs once, accumulating dX and dY; dG = X dX - Y dY follows from the sign of G
// in each exponent. dOut of the sub-chunk sits in shared memory (read as broadcasts).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/diagonal_scores.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/shared_memory.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kSub = 16;            // rows per sub-chunk (detail::kSubChunk)
constexpr int kBackwardThreads = 128;

__global__ void diagonal_scores_forward_kernel(const float* __restrict__ X, const float* __restrict__ Y,
                                               const float* __restrict__ G, float* __restrict__ out, int K,
                                               bool strict) {
  LINEARIZE_DYNAMIC_SHARED(float, shared);
  const int stride = K + 1;
  float* Xs = shared;
  float* Ys = Xs + kSub * stride;
  float* Gs = Ys + kSub * stride;
  const size_t base = static_cast<size_t>(blockIdx.x) * kSub * K;
  for (int e = threadIdx.x; e < kSub * K; e += blockDim.x) {
    const int at = (e / K) * stride + e % K;
    Xs[at] = X[base + e];
    Ys[at] = Y[base + e];
    Gs[at] = G[base + e];
  }
  __syncthreads();
  const int r = threadIdx.x / kSub, j = threadIdx.x % kSub;
  float acc = 0.f;
  if (j < r || (j == r && !strict)) {
    const float *x = Xs + r * stride, *y = Ys + j * stride, *gr = Gs + r * stride, *gj = Gs + j * stride;
    for (int d = 0; d < K; ++d) acc += x[d] * y[d] * expf(gr[d] - gj[d]);
  }
  out[static_cast<size_t>(blockIdx.x) * kSub * kSub + threadIdx.x] = acc;
}

__global__ void diagonal_scores_backward_kernel(const float* __restrict__ X, const float* __restrict__ Y,
                                                const float* __restrict__ G, const float* __restrict__ dOut,
                                                float* __restrict__ dX, float* __restrict__ dY,
                                                float* __restrict__ dG, int K, int d_blocks, bool strict) {
  __shared__ float dO[kSub * kSub];
  const size_t m = blockIdx.x / d_blocks;  // sub-chunk (one grid dimension: there can be more than 65535)
  for (int e = threadIdx.x; e < kSub * kSub; e += blockDim.x) dO[e] = dOut[m * kSub * kSub + e];
  __syncthreads();
  const int d = static_cast<int>(blockIdx.x % d_blocks) * blockDim.x + threadIdx.x;
  if (d >= K) return;
  float x[kSub], y[kSub], g[kSub], dx[kSub], dy[kSub];
#pragma unroll
  for (int r = 0; r < kSub; ++r) {
    const size_t at = (m * kSub + r) * K + d;
    x[r] = X[at], y[r] = Y[at], g[r] = G[at], dx[r] = 0.f, dy[r] = 0.f;
  }
#pragma unroll
  for (int r = 0; r < kSub; ++r) {
#pragma unroll
    for (int j = 0; j <= r; ++j) {
      if (j == r && strict) continue;
      const float w = dO[r * kSub + j] * expf(g[r] - g[j]);
      dx[r] += w * y[j];
      dy[j] += w * x[r];
    }
  }
#pragma unroll
  for (int r = 0; r < kSub; ++r) {
    const size_t at = (m * kSub + r) * K + d;
    dX[at] = dx[r], dY[at] = dy[r], dG[at] = x[r] * dx[r] - y[r] * dy[r];
  }
}

}  // namespace

torch::Tensor diagonal_scores_forward(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                                      bool strict) {
  TORCH_CHECK(X.size(-2) == kSub, "diagonal_scores_forward: sub-chunks of ", kSub, " rows expected, got ",
              X.size(-2));
  const c10::cuda::CUDAGuard guard(X.device());
  const int64_t K = X.size(-1), M = X.numel() / (kSub * K);
  auto shape = X.sizes().vec();
  shape.back() = kSub;
  auto out = torch::empty(shape, X.options());
  if (M == 0) return out;
  const size_t smem = 3 * kSub * (K + 1) * sizeof(float);
  launch(diagonal_scores_forward_kernel, static_cast<unsigned>(M), kSub * kSub, smem,
      X.data_ptr<float>(), Y.data_ptr<float>(), G.data_ptr<float>(), out.data_ptr<float>(), static_cast<int>(K),
      strict);
  return out;
}

DiagonalScoresGrads diagonal_scores_backward(const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& G,
                                             const torch::Tensor& d_out, bool strict) {
  const c10::cuda::CUDAGuard guard(X.device());
  const int64_t K = X.size(-1), M = X.numel() / (kSub * K);
  DiagonalScoresGrads g{torch::empty_like(X), torch::empty_like(X), torch::empty_like(X)};
  if (M == 0) return g;
  auto dO = d_out.to(torch::kFloat).contiguous();
  const int64_t d_blocks = (K + kBackwardThreads - 1) / kBackwardThreads;
  launch(diagonal_scores_backward_kernel, static_cast<unsigned>(M * d_blocks), kBackwardThreads, 0,
      X.data_ptr<float>(), Y.data_ptr<float>(), G.data_ptr<float>(), dO.data_ptr<float>(), g.dX.data_ptr<float>(),
      g.dY.data_ptr<float>(), g.dG.data_ptr<float>(), static_cast<int>(K), static_cast<int>(d_blocks), strict);
  return g;
}

}  // namespace linearize::ops::cuda_kernels
