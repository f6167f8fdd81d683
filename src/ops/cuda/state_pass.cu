// The sequential part of the chunked forms of families A and B as two kernels (see kernels.h).
//
// The recurrence over chunks never mixes value columns: column j of S^(n+1) depends only on column j
// of S^(n). So each block owns kTile columns of one (batch, head) and walks the chunks in order,
// keeping its slice of the state in shared memory; there are B*H*ceil(V/kTile) independent blocks.
// Per chunk the block stages one [C, K] matrix (W_n, then KdT_n) in shared memory and does two small
// matrix products against its slice. Blocks of the same head are adjacent in the grid, so the staged
// matrices are read from L2 after the first. Everything is fp32.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/kernels.h"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kTile = 16;     // value columns per block
constexpr int kThreads = 256;

// The block's [K, kTile] slice of a [B*H, K, V] tensor at head bh: into shared memory (zeros where the
// tensor is absent or past V), and back out.
__device__ void load_slice(float* dst, const float* __restrict__ src, int bh, int K, int V, int j0, int tv) {
  for (int e = threadIdx.x; e < K * kTile; e += blockDim.x) {
    const int k = e / kTile, j = e % kTile;
    dst[e] = (src != nullptr && j < tv) ? src[(static_cast<size_t>(bh) * K + k) * V + j0 + j] : 0.f;
  }
}
__device__ void store_slice(float* __restrict__ dst, const float* src, size_t row0, int K, int V, int j0, int tv) {
  for (int e = threadIdx.x; e < K * kTile; e += blockDim.x) {
    const int k = e / kTile, j = e % kTile;
    if (j < tv) dst[(row0 + k) * V + j0 + j] = src[e];
  }
}

// S [K][kTile] state slice, X [C][kTile] the chunk's write vectors, M [C*K] the staged matrix.
template <bool kDelta>
__global__ void state_pass_forward_kernel(const float* __restrict__ W, const float* __restrict__ U,
                                          const float* __restrict__ KdT, const float* __restrict__ D,
                                          const float* __restrict__ S0, float* __restrict__ Sn,
                                          float* __restrict__ Vnew, float* __restrict__ S_final, int N, int C,
                                          int K, int V) {
  extern __shared__ float shared[];
  float* S = shared;
  float* X = S + K * kTile;
  float* M = X + C * kTile;
  const int j0 = blockIdx.x * kTile, bh = blockIdx.y, tid = threadIdx.x;
  const int tv = min(kTile, V - j0);
  load_slice(S, S0, bh, K, V, j0, tv);
  __syncthreads();
  for (int n = 0; n < N; ++n) {
    const size_t chunk = static_cast<size_t>(bh) * N + n;
    store_slice(Sn, S, chunk * K, K, V, j0, tv);
    if (kDelta)
      for (int e = tid; e < C * K; e += blockDim.x) M[e] = W[chunk * C * K + e];
    __syncthreads();
    // X = U_n - W_n S  (family A: X = U_n)
    for (int e = tid; e < C * kTile; e += blockDim.x) {
      const int r = e / kTile, j = e % kTile;
      float acc = j < tv ? U[(chunk * C + r) * V + j0 + j] : 0.f;
      if (kDelta) {
        for (int k = 0; k < K; ++k) acc -= M[r * K + k] * S[k * kTile + j];
        if (j < tv) Vnew[(chunk * C + r) * V + j0 + j] = acc;
      }
      X[e] = acc;
    }
    __syncthreads();
    for (int e = tid; e < K * C; e += blockDim.x) M[e] = KdT[chunk * K * C + e];
    __syncthreads();
    // S = Diag(D_n) S + KdT_n X
    for (int e = tid; e < K * kTile; e += blockDim.x) {
      const int k = e / kTile, j = e % kTile;
      float acc = (D != nullptr ? D[chunk * K + k] : 1.f) * S[e];
      for (int r = 0; r < C; ++r) acc += M[k * C + r] * X[r * kTile + j];
      S[e] = acc;
    }
    __syncthreads();
  }
  store_slice(S_final, S, static_cast<size_t>(bh) * K, K, V, j0, tv);
}

// L [K][kTile] the gradient of the state leaving the current chunk, X [C][kTile] dV_total.
template <bool kDelta>
__global__ void state_pass_backward_kernel(const float* __restrict__ W, const float* __restrict__ KdT,
                                           const float* __restrict__ D, const float* __restrict__ dSn,
                                           const float* __restrict__ dVnew, const float* __restrict__ dS_final,
                                           float* __restrict__ Lambda, float* __restrict__ dVtot,
                                           float* __restrict__ dS0, int N, int C, int K, int V) {
  extern __shared__ float shared[];
  float* L = shared;
  float* X = L + K * kTile;
  float* M = X + C * kTile;
  const int j0 = blockIdx.x * kTile, bh = blockIdx.y, tid = threadIdx.x;
  const int tv = min(kTile, V - j0);
  load_slice(L, dS_final, bh, K, V, j0, tv);
  __syncthreads();
  for (int n = N - 1; n >= 0; --n) {
    const size_t chunk = static_cast<size_t>(bh) * N + n;
    store_slice(Lambda, L, chunk * K, K, V, j0, tv);
    for (int e = tid; e < K * C; e += blockDim.x) M[e] = KdT[chunk * K * C + e];
    __syncthreads();
    // dV_total = dVnew_n + KdT_n^T L
    for (int e = tid; e < C * kTile; e += blockDim.x) {
      const int r = e / kTile, j = e % kTile;
      float acc = (dVnew != nullptr && j < tv) ? dVnew[(chunk * C + r) * V + j0 + j] : 0.f;
      for (int k = 0; k < K; ++k) acc += M[k * C + r] * L[k * kTile + j];
      X[e] = acc;
      if (j < tv) dVtot[(chunk * C + r) * V + j0 + j] = acc;
    }
    __syncthreads();
    if (kDelta) {
      for (int e = tid; e < C * K; e += blockDim.x) M[e] = W[chunk * C * K + e];
      __syncthreads();
    }
    // L = Diag(D_n) L - W_n^T dV_total + dSn_n
    for (int e = tid; e < K * kTile; e += blockDim.x) {
      const int k = e / kTile, j = e % kTile;
      float acc = (D != nullptr ? D[chunk * K + k] : 1.f) * L[e];
      if (kDelta)
        for (int r = 0; r < C; ++r) acc -= M[r * K + k] * X[r * kTile + j];
      if (dSn != nullptr && j < tv) acc += dSn[(chunk * K + k) * V + j0 + j];
      L[e] = acc;
    }
    __syncthreads();
  }
  store_slice(dS0, L, static_cast<size_t>(bh) * K, K, V, j0, tv);
}

const float* ptr_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

torch::Tensor fp32_contiguous(const torch::Tensor& t) {
  return t.defined() ? t.to(torch::kFloat).contiguous() : torch::Tensor();
}

template <typename Kernel>
void prepare(Kernel kernel, size_t smem) {
  if (smem > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

}  // namespace

detail::StatePass state_pass_forward(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                                const torch::Tensor& D, const torch::Tensor& S0) {
  const int64_t B = U.size(0), H = U.size(1), N = U.size(2), C = U.size(3), V = U.size(4), K = KdT.size(3);
  const c10::cuda::CUDAGuard guard(U.device());
  auto Wc = fp32_contiguous(W), Uc = fp32_contiguous(U), Kc = fp32_contiguous(KdT), Dc = fp32_contiguous(D),
       S0c = fp32_contiguous(S0);
  const auto opts = Uc.options();
  detail::StatePass out;
  out.states = torch::empty({B, H, N, K, V}, opts);
  out.writes = W.defined() ? torch::empty({B, H, N, C, V}, opts) : torch::Tensor();
  out.final_state = torch::empty({B, H, K, V}, opts);
  const dim3 grid(static_cast<unsigned>((V + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  const size_t smem = (K * kTile + C * kTile + C * K) * sizeof(float);
  auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    prepare(kernel, smem);
    kernel<<<grid, kThreads, smem, stream>>>(ptr_or_null(Wc), Uc.data_ptr<float>(), Kc.data_ptr<float>(),
                                             ptr_or_null(Dc), ptr_or_null(S0c), out.states.data_ptr<float>(),
                                             out.writes.defined() ? out.writes.data_ptr<float>() : nullptr,
                                             out.final_state.data_ptr<float>(), static_cast<int>(N),
                                             static_cast<int>(C), static_cast<int>(K), static_cast<int>(V));
  };
  if (W.defined()) launch(state_pass_forward_kernel<true>);
  else launch(state_pass_forward_kernel<false>);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

StatePassGrads state_pass_backward(const torch::Tensor& W, const torch::Tensor& KdT, const torch::Tensor& D,
                                   const torch::Tensor& d_states, const torch::Tensor& d_writes,
                                   const torch::Tensor& d_final, int64_t V) {
  const int64_t B = KdT.size(0), H = KdT.size(1), N = KdT.size(2), K = KdT.size(3), C = KdT.size(4);
  const c10::cuda::CUDAGuard guard(KdT.device());
  auto Wc = fp32_contiguous(W), Kc = fp32_contiguous(KdT), Dc = fp32_contiguous(D), dSn = fp32_contiguous(d_states),
       dVn = fp32_contiguous(d_writes), dSf = fp32_contiguous(d_final);
  const auto opts = Kc.options();
  StatePassGrads g;
  g.lambda = torch::empty({B, H, N, K, V}, opts);
  g.d_writes_total = torch::empty({B, H, N, C, V}, opts);
  g.d_initial = torch::empty({B, H, K, V}, opts);
  const dim3 grid(static_cast<unsigned>((V + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  const size_t smem = (K * kTile + C * kTile + C * K) * sizeof(float);
  auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    prepare(kernel, smem);
    kernel<<<grid, kThreads, smem, stream>>>(ptr_or_null(Wc), Kc.data_ptr<float>(), ptr_or_null(Dc), ptr_or_null(dSn),
                                             ptr_or_null(dVn), ptr_or_null(dSf), g.lambda.data_ptr<float>(),
                                             g.d_writes_total.data_ptr<float>(), g.d_initial.data_ptr<float>(),
                                             static_cast<int>(N), static_cast<int>(C), static_cast<int>(K),
                                             static_cast<int>(V));
  };
  if (W.defined()) launch(state_pass_backward_kernel<true>);
  else launch(state_pass_backward_kernel<false>);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return g;
}

}  // namespace linearize::ops::cuda_kernels
