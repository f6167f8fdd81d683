// The sequential part of the chunked forms of the GLA and delta-rule families as CUDA kernels (see state_pass.h).
//
// The GLA family (no W): the chunk contributions dS_n = KdT_n U_n do not depend on the state, so the caller
// forms them in one batched product and the recurrence is a plain decayed scan,
//   S^(n+1) = Diag(D_n) S^(n) + dS_n,
// one thread per state entry walking the chunks (decay_scan_*; memory-bound, every read coalesced).
//
// The delta rule (delta rule): X_n = U_n - W_n S^(n) needs the state, so the products stay inside the walk.
// The recurrence over chunks never mixes value columns, so each block owns kTile columns of one
// (batch, head) and walks the chunks with its [K, kTile] slice of the state in shared memory;
// B*H*ceil(V/kTile) independent blocks. Per chunk the block stages one [C, K] matrix (W_n, then KdT_n)
// with padded rows (no bank conflicts) and each thread computes four adjacent columns of two rows,
// reading a float4 of the right operand once for eight multiply-adds. Everything is fp32.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/state_pass.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/shared_memory.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kTile = 16;                  // value columns per block
constexpr int kQuads = kTile / 4;          // float4 columns per row
constexpr int kThreads = 256;
constexpr int kGroups = kThreads / kQuads;  // rows handled at once (each thread: one quad of a row)

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

// Copies a row-major [rows, cols] matrix from global memory into shared memory with row stride cols + 1.
__device__ void stage_padded(float* dst, const float* __restrict__ src, int rows, int cols) {
  for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) dst[(e / cols) * (cols + 1) + e % cols] = src[e];
}

// Four columns (quad) of row r of a global [*, V] matrix, zeros past V or where it is absent.
__device__ float4 load_quad(const float* __restrict__ src, size_t row, int V, int j0, int tv, int quad) {
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
  if (src == nullptr) return x;
  const int j = quad * 4;
  const float* p = src + row * V + j0 + j;
  if (j + 0 < tv) x.x = p[0];
  if (j + 1 < tv) x.y = p[1];
  if (j + 2 < tv) x.z = p[2];
  if (j + 3 < tv) x.w = p[3];
  return x;
}
__device__ void store_quad(float* __restrict__ dst, size_t row, int V, int j0, int tv, int quad, float4 x) {
  const int j = quad * 4;
  float* p = dst + row * V + j0 + j;
  if (j + 0 < tv) p[0] = x.x;
  if (j + 1 < tv) p[1] = x.y;
  if (j + 2 < tv) p[2] = x.z;
  if (j + 3 < tv) p[3] = x.w;
}

__device__ void fma4(float4& acc, float a, float4 b) {
  acc.x += a * b.x, acc.y += a * b.y, acc.z += a * b.z, acc.w += a * b.w;
}
__device__ float4 scale4(float a, float4 b) { return make_float4(a * b.x, a * b.y, a * b.z, a * b.w); }

// acc_i += sign Σ_t A(row_i, t) B[t, :] for the thread's quad of B's kTile columns, rows row0 and row1
// (row1 < 0: only row0). A(r, t) sits at A[r * rs + t * ts] in shared memory (a padded row-major
// matrix or its transpose); B is [inner][kTile] in shared memory.
__device__ void rows_times_slice(float4& acc0, float4& acc1, const float* A, int rs, int ts, int row0, int row1,
                                 const float* Bm, int inner, int quad, float sign) {
  const float4* B4 = reinterpret_cast<const float4*>(Bm);
  const float* a0 = A + row0 * rs;
  const float* a1 = A + (row1 >= 0 ? row1 : row0) * rs;
  for (int t = 0; t < inner; ++t) {
    const float4 b = B4[t * kQuads + quad];
    fma4(acc0, sign * a0[t * ts], b);
    if (row1 >= 0) fma4(acc1, sign * a1[t * ts], b);
  }
}

// The delta rule forward. S [K][kTile] the state slice, X [C][kTile] the chunk's write vectors, M the staged
// matrix (W_n as [C][K+1], then KdT_n as [K][C+1]).
__global__ void delta_pass_forward_kernel(const float* __restrict__ W, const float* __restrict__ U,
                                          const float* __restrict__ KdT, const float* __restrict__ D,
                                          const float* __restrict__ S0, float* __restrict__ Sn,
                                          float* __restrict__ Vnew, float* __restrict__ S_final, int N, int C,
                                          int K, int V) {
  LINEARIZE_DYNAMIC_SHARED(float4, shared4);
  float* S = reinterpret_cast<float*>(shared4);
  float* X = S + K * kTile;
  float* M = X + C * kTile;
  float4* S4 = reinterpret_cast<float4*>(S);
  float4* X4 = reinterpret_cast<float4*>(X);
  const int j0 = blockIdx.x * kTile, bh = blockIdx.y;
  const int quad = threadIdx.x % kQuads, group = threadIdx.x / kQuads;
  const int tv = min(kTile, V - j0);
  load_slice(S, S0, bh, K, V, j0, tv);
  __syncthreads();
  for (int n = 0; n < N; ++n) {
    const size_t chunk = static_cast<size_t>(bh) * N + n;
    store_slice(Sn, S, chunk * K, K, V, j0, tv);
    stage_padded(M, W + chunk * C * K, C, K);
    __syncthreads();
    // X = U_n - W_n S
    for (int r0 = group; r0 < C; r0 += 2 * kGroups) {
      const int r1 = r0 + kGroups < C ? r0 + kGroups : -1;
      float4 x0 = load_quad(U, chunk * C + r0, V, j0, tv, quad);
      float4 x1 = r1 >= 0 ? load_quad(U, chunk * C + r1, V, j0, tv, quad) : x0;
      rows_times_slice(x0, x1, M, K + 1, 1, r0, r1, S, K, quad, -1.f);
      X4[r0 * kQuads + quad] = x0;
      store_quad(Vnew, chunk * C + r0, V, j0, tv, quad, x0);
      if (r1 >= 0) {
        X4[r1 * kQuads + quad] = x1;
        store_quad(Vnew, chunk * C + r1, V, j0, tv, quad, x1);
      }
    }
    __syncthreads();
    stage_padded(M, KdT + chunk * K * C, K, C);
    __syncthreads();
    // S = Diag(D_n) S + KdT_n X
    for (int k0 = group; k0 < K; k0 += 2 * kGroups) {
      const int k1 = k0 + kGroups < K ? k0 + kGroups : -1;
      float4 s0 = scale4(D != nullptr ? D[chunk * K + k0] : 1.f, S4[k0 * kQuads + quad]);
      float4 s1 = k1 >= 0 ? scale4(D != nullptr ? D[chunk * K + k1] : 1.f, S4[k1 * kQuads + quad]) : s0;
      rows_times_slice(s0, s1, M, C + 1, 1, k0, k1, X, C, quad, 1.f);
      S4[k0 * kQuads + quad] = s0;
      if (k1 >= 0) S4[k1 * kQuads + quad] = s1;
    }
    __syncthreads();
  }
  store_slice(S_final, S, static_cast<size_t>(bh) * K, K, V, j0, tv);
}

// The delta rule backward. L [K][kTile] the gradient of the state leaving the current chunk, X [C][kTile]
// dV_total of the chunk, M the staged matrix (KdT_n as [K][C+1], then W_n as [C][K+1]).
__global__ void delta_pass_backward_kernel(const float* __restrict__ W, const float* __restrict__ KdT,
                                           const float* __restrict__ D, const float* __restrict__ dSn,
                                           const float* __restrict__ dVnew, const float* __restrict__ dS_final,
                                           float* __restrict__ Lambda, float* __restrict__ dVtot,
                                           float* __restrict__ dS0, int N, int C, int K, int V) {
  LINEARIZE_DYNAMIC_SHARED(float4, shared4);
  float* L = reinterpret_cast<float*>(shared4);
  float* X = L + K * kTile;
  float* M = X + C * kTile;
  float4* L4 = reinterpret_cast<float4*>(L);
  float4* X4 = reinterpret_cast<float4*>(X);
  const int j0 = blockIdx.x * kTile, bh = blockIdx.y;
  const int quad = threadIdx.x % kQuads, group = threadIdx.x / kQuads;
  const int tv = min(kTile, V - j0);
  load_slice(L, dS_final, bh, K, V, j0, tv);
  __syncthreads();
  for (int n = N - 1; n >= 0; --n) {
    const size_t chunk = static_cast<size_t>(bh) * N + n;
    store_slice(Lambda, L, chunk * K, K, V, j0, tv);
    stage_padded(M, KdT + chunk * K * C, K, C);
    __syncthreads();
    // dV_total = dVnew_n + KdT_n^T L   (row r of KdT^T is column r of the staged [K][C+1] KdT)
    for (int r0 = group; r0 < C; r0 += 2 * kGroups) {
      const int r1 = r0 + kGroups < C ? r0 + kGroups : -1;
      float4 x0 = load_quad(dVnew, chunk * C + r0, V, j0, tv, quad);
      float4 x1 = r1 >= 0 ? load_quad(dVnew, chunk * C + r1, V, j0, tv, quad) : x0;
      rows_times_slice(x0, x1, M, 1, C + 1, r0, r1, L, K, quad, 1.f);
      X4[r0 * kQuads + quad] = x0;
      store_quad(dVtot, chunk * C + r0, V, j0, tv, quad, x0);
      if (r1 >= 0) {
        X4[r1 * kQuads + quad] = x1;
        store_quad(dVtot, chunk * C + r1, V, j0, tv, quad, x1);
      }
    }
    __syncthreads();
    stage_padded(M, W + chunk * C * K, C, K);
    __syncthreads();
    // L = Diag(D_n) L - W_n^T dV_total + dSn_n   (row k of W^T is column k of the staged [C][K+1] W)
    for (int k0 = group; k0 < K; k0 += 2 * kGroups) {
      const int k1 = k0 + kGroups < K ? k0 + kGroups : -1;
      float4 l0 = scale4(D != nullptr ? D[chunk * K + k0] : 1.f, L4[k0 * kQuads + quad]);
      float4 l1 = k1 >= 0 ? scale4(D != nullptr ? D[chunk * K + k1] : 1.f, L4[k1 * kQuads + quad]) : l0;
      rows_times_slice(l0, l1, M, 1, K + 1, k0, k1, X, C, quad, -1.f);
      const float4 g0 = load_quad(dSn, chunk * K + k0, V, j0, tv, quad);
      L4[k0 * kQuads + quad] = make_float4(l0.x + g0.x, l0.y + g0.y, l0.z + g0.z, l0.w + g0.w);
      if (k1 >= 0) {
        const float4 g1 = load_quad(dSn, chunk * K + k1, V, j0, tv, quad);
        L4[k1 * kQuads + quad] = make_float4(l1.x + g1.x, l1.y + g1.y, l1.z + g1.z, l1.w + g1.w);
      }
    }
    __syncthreads();
  }
  store_slice(dS0, L, static_cast<size_t>(bh) * K, K, V, j0, tv);
}

// The GLA family, forward: thread i owns entry i of the flattened [B*H, K*V] state and walks the chunks.
__global__ void decay_scan_forward_kernel(const float* __restrict__ dS, const float* __restrict__ D,
                                          const float* __restrict__ S0, float* __restrict__ Sn,
                                          float* __restrict__ S_final, int N, int K, int V, int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t KV = static_cast<int64_t>(K) * V, bh = i / KV, kv = i % KV;
  const int k = static_cast<int>(kv / V);
  float s = S0 != nullptr ? S0[i] : 0.f;
  for (int n = 0; n < N; ++n) {
    const int64_t chunk = bh * N + n, at = chunk * KV + kv;
    Sn[at] = s;
    s = (D != nullptr ? D[chunk * K + k] : 1.f) * s + dS[at];
  }
  S_final[i] = s;
}

// The GLA family, backward: Lambda[n] = dLoss/dS^(n+1), walking the chunks in reverse.
__global__ void decay_scan_backward_kernel(const float* __restrict__ D, const float* __restrict__ dSn,
                                           const float* __restrict__ dS_final, float* __restrict__ Lambda,
                                           float* __restrict__ dS0, int N, int K, int V, int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t KV = static_cast<int64_t>(K) * V, bh = i / KV, kv = i % KV;
  const int k = static_cast<int>(kv / V);
  float l = dS_final != nullptr ? dS_final[i] : 0.f;
  for (int n = N - 1; n >= 0; --n) {
    const int64_t chunk = bh * N + n, at = chunk * KV + kv;
    Lambda[at] = l;
    l = (D != nullptr ? D[chunk * K + k] : 1.f) * l + (dSn != nullptr ? dSn[at] : 0.f);
  }
  dS0[i] = l;
}

torch::Tensor fp32_contiguous(const torch::Tensor& t) {
  return t.defined() ? t.to(torch::kFloat).contiguous() : torch::Tensor();
}

// Shared memory of the family-B kernels: the state slice, the chunk's columns and one padded [C, K].
size_t delta_pass_smem(int64_t C, int64_t K) {
  return (K * kTile + C * kTile + std::max(C * (K + 1), K * (C + 1))) * sizeof(float);
}

unsigned scan_blocks(int64_t total) { return static_cast<unsigned>((total + kThreads - 1) / kThreads); }

}  // namespace

DeltaPassForward delta_pass_forward(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                                    const torch::Tensor& D, const torch::Tensor& S0) {
  const int64_t B = U.size(0), H = U.size(1), N = U.size(2), C = U.size(3), V = U.size(4), K = KdT.size(3);
  const c10::cuda::CUDAGuard guard(U.device());
  auto Wc = fp32_contiguous(W), Uc = fp32_contiguous(U), Kc = fp32_contiguous(KdT), Dc = fp32_contiguous(D),
       S0c = fp32_contiguous(S0);
  const auto opts = Uc.options();
  DeltaPassForward out;
  out.states = torch::empty({B, H, N, K, V}, opts);
  out.writes = torch::empty({B, H, N, C, V}, opts);
  out.final_state = torch::empty({B, H, K, V}, opts);
  TORCH_CHECK(B * H <= 65535, "delta rule state pass: at most 65535 (batch x head) pairs per call, got ", B * H);
  const dim3 grid(static_cast<unsigned>((V + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  const size_t smem = delta_pass_smem(C, K);
  launch(delta_pass_forward_kernel, grid, kThreads, smem,
      Wc.data_ptr<float>(), Uc.data_ptr<float>(), Kc.data_ptr<float>(), ptr_or_null(Dc), ptr_or_null(S0c),
      out.states.data_ptr<float>(), out.writes.data_ptr<float>(), out.final_state.data_ptr<float>(),
      static_cast<int>(N), static_cast<int>(C), static_cast<int>(K), static_cast<int>(V));
  return out;
}

StatePassGrads delta_pass_backward(const torch::Tensor& W, const torch::Tensor& KdT, const torch::Tensor& D,
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
  TORCH_CHECK(B * H <= 65535, "delta rule state pass: at most 65535 (batch x head) pairs per call, got ", B * H);
  const dim3 grid(static_cast<unsigned>((V + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  const size_t smem = delta_pass_smem(C, K);
  launch(delta_pass_backward_kernel, grid, kThreads, smem,
      Wc.data_ptr<float>(), Kc.data_ptr<float>(), ptr_or_null(Dc), ptr_or_null(dSn), ptr_or_null(dVn),
      ptr_or_null(dSf), g.lambda.data_ptr<float>(), g.d_writes_total.data_ptr<float>(), g.d_initial.data_ptr<float>(),
      static_cast<int>(N), static_cast<int>(C), static_cast<int>(K), static_cast<int>(V));
  return g;
}

std::pair<torch::Tensor, torch::Tensor> decay_scan_forward(const torch::Tensor& dS, const torch::Tensor& D,
                                                           const torch::Tensor& S0) {
  const int64_t B = dS.size(0), H = dS.size(1), N = dS.size(2), K = dS.size(3), V = dS.size(4);
  const c10::cuda::CUDAGuard guard(dS.device());
  auto dSc = fp32_contiguous(dS), Dc = fp32_contiguous(D), S0c = fp32_contiguous(S0);
  auto states = torch::empty({B, H, N, K, V}, dSc.options());
  auto final_state = torch::empty({B, H, K, V}, dSc.options());
  const int64_t total = B * H * K * V;
  launch(decay_scan_forward_kernel, scan_blocks(total), kThreads, 0, dSc.data_ptr<float>(), ptr_or_null(Dc),
         ptr_or_null(S0c), states.data_ptr<float>(), final_state.data_ptr<float>(), static_cast<int>(N),
         static_cast<int>(K), static_cast<int>(V), total);
  return {states, final_state};
}

std::pair<torch::Tensor, torch::Tensor> decay_scan_backward(const torch::Tensor& D, const torch::Tensor& d_states,
                                                            const torch::Tensor& d_final, int64_t B, int64_t H,
                                                            int64_t N, int64_t K, int64_t V,
                                                            const torch::TensorOptions& opts) {
  const c10::cuda::CUDAGuard guard(opts.device());
  auto Dc = fp32_contiguous(D), dSn = fp32_contiguous(d_states), dSf = fp32_contiguous(d_final);
  auto lambda = torch::empty({B, H, N, K, V}, opts.dtype(torch::kFloat));
  auto d_initial = torch::empty({B, H, K, V}, opts.dtype(torch::kFloat));
  const int64_t total = B * H * K * V;
  launch(decay_scan_backward_kernel, scan_blocks(total), kThreads, 0, ptr_or_null(Dc), ptr_or_null(dSn),
         ptr_or_null(dSf), lambda.data_ptr<float>(), d_initial.data_ptr<float>(), static_cast<int>(N),
         static_cast<int>(K), static_cast<int>(V), total);
  return {lambda, d_initial};
}

}  // namespace linearize::ops::cuda_kernels
