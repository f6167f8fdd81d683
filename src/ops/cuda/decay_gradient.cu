// The scalar decay's gradient from a fused walk's row sums, in one launch (the formula is
// detail::walk_decay_gradient's, common.h; its libtorch form is five to seven launches):
//   dg_s = Σ_{t >= s} (q_t·dq_t - k_t·dk_t) + Σ_{t >= first row of the chunk after s's} w_t·dw_t + <dS_T, S_T>
// One block per (batch, head) walks its row from the end in tiles of 512 steps: a suffix sum of
// q·dq - k·dk and one of w·dw, each carried from tile to tile, the second read at the next chunk's first
// row (chunks divide the tiles, so that row lies in this tile or is the first of the tile after it). fp32.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/decay_gradient.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kTile = 512;  // steps per tile, one per thread
constexpr int kTileWarps = kTile / 32;

// x_j -> Σ_{i >= j} x_i over the block's threads; `warp_totals` is kTileWarps floats of scratch.
__device__ float suffix_sum(float x, float* warp_totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_down_sync(0xffffffffu, x, off);
    if (lane + off < 32) x += y;
  }
  if (lane == 0) warp_totals[warp] = x;
  __syncthreads();
  for (int w = warp + 1; w < kTileWarps; ++w) x += warp_totals[w];
  __syncthreads();  // the scratch may be written again
  return x;
}

// dot_q, dot_k, dg [rows, T]; dot_w [rows, Tw] or null; d_final, final_state [rows, KV] (d_final may be null).
__global__ void __launch_bounds__(kTile)
    decay_gradient_kernel(const float* __restrict__ dot_q, const float* __restrict__ dot_k,
                          const float* __restrict__ dot_w, const float* __restrict__ d_final,
                          const float* __restrict__ final_state, float* __restrict__ dg, int T, int Tw, int chunk,
                          int KV) {
  __shared__ float scratch[kTileWarps], w_after[kTile], x_first, state_dot;
  const size_t row = blockIdx.x, at = row * T;
  // <dS_T, S_T>, the same for every step of the row.
  float part = 0.f;
  if (d_final != nullptr)
    for (int i = threadIdx.x; i < KV; i += kTile) part += d_final[row * KV + i] * final_state[row * KV + i];
  part = suffix_sum(part, scratch);
  if (threadIdx.x == 0) state_dot = part;
  float carry_x = 0.f, carry_w = 0.f;  // the sums over the tiles after this one
  const int len = dot_w != nullptr && Tw > T ? Tw : T;
  for (int base = (len - 1) / kTile * kTile; base >= 0; base -= kTile) {
    const int t = base + threadIdx.x;
    const float x = suffix_sum(t < T ? dot_q[at + t] - dot_k[at + t] : 0.f, scratch) + carry_x;
    float w = 0.f;
    if (dot_w != nullptr) w = suffix_sum(t < Tw ? dot_w[row * Tw + t] : 0.f, scratch) + carry_w;
    w_after[threadIdx.x] = w;
    if (threadIdx.x == 0) x_first = x;
    __syncthreads();
    const int next = (t / chunk + 1) * chunk - base;  // the next chunk's first row, from the tile's start
    if (t < T) dg[at + t] = x + (next < kTile ? w_after[next] : carry_w) + state_dot;
    carry_x = x_first, carry_w = w_after[0];
    // The next tile's sums pass two barriers before they write w_after and x_first again.
  }
}

}  // namespace

bool decay_gradient_supported(int64_t chunk) { return chunk > 0 && kTile % chunk == 0; }

torch::Tensor decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                             int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state) {
  TORCH_CHECK(decay_gradient_supported(chunk), "decay gradient kernel: the chunk must divide ", kTile, "; got ", chunk);
  auto fp32 = [](const torch::Tensor& t) { return t.scalar_type() == torch::kFloat && t.is_contiguous(); };
  TORCH_CHECK(dot_q.dim() == 3 && dot_k.sizes() == dot_q.sizes() && fp32(dot_q) && fp32(dot_k),
              "decay gradient kernel: dot_q and dot_k must be [B,H,T] fp32 contiguous; got ", dot_q.sizes(), " ",
              dot_k.sizes());
  const int64_t B = dot_q.size(0), H = dot_q.size(1), T = dot_q.size(2);
  int64_t Tw = 0;
  if (dot_w.defined()) {
    Tw = dot_w.size(-1);
    TORCH_CHECK(dot_w.dim() == 3 && dot_w.size(0) == B && dot_w.size(1) == H && Tw >= T && Tw % chunk == 0 &&
                    fp32(dot_w),
                "decay gradient kernel: dot_w must be [B,H,N*chunk] fp32 contiguous with N*chunk >= T = ", T, "; got ",
                dot_w.sizes());
  }
  TORCH_CHECK(final_state.dim() == 4 && final_state.size(0) == B && final_state.size(1) == H && fp32(final_state),
              "decay gradient kernel: the final state must be [B,H,K,V] fp32 contiguous; got ", final_state.sizes());
  TORCH_CHECK(!d_final.defined() || (d_final.sizes() == final_state.sizes() && fp32(d_final)),
              "decay gradient kernel: d_final must be the final state's shape in fp32; got ", d_final.sizes());
  const c10::cuda::CUDAGuard guard(dot_q.device());
  auto dg = torch::empty_like(dot_q);
  if (B * H == 0 || T == 0) return dg;
  launch(decay_gradient_kernel, static_cast<unsigned>(B * H), kTile, 0, dot_q.data_ptr<float>(),
         dot_k.data_ptr<float>(), ptr_or_null(dot_w), ptr_or_null(d_final), final_state.data_ptr<float>(), dg.data_ptr<float>(),
         static_cast<int>(T), static_cast<int>(Tw), static_cast<int>(chunk),
         static_cast<int>(final_state.size(2) * final_state.size(3)));
  return dg;
}

}  // namespace linearize::ops::cuda_kernels
