// The log decay of Gated DeltaNet and KDA (Mamba2's parameterisation) in one kernel each way (see softplus_decay.h
// for the contract): for f [rows, C] with C = H * K channels, channel c in head c / K,
//   g[r, c] = -exp(A_log[c / K]) softplus(f[r, c] + dt_bias[c])          (fp32)
// and backward, given dg [rows, C] fp32, with z = f + dt_bias and a = exp(A_log):
//   df = d_dt_bias terms = -a sigmoid(z) dg,   d_dt_bias[c] = Σ_r df[r, c],   dA_log[h] = Σ_r Σ_{c in h} dg g
// The libtorch formula takes a cast of f, the bias's sum, softplus, exp, a negation and the product
// forward (five or six passes over [rows, C] fp32) and more backward. One thread per channel walks a block
// of rows (consecutive threads, consecutive channels: coalesced); the two sums go into per-block partials
// [row blocks, 2, C] fp32 that the host adds up, so they are the same from run to run.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/softplus_decay.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kThreads = 128;     // channels a block
constexpr int64_t kRowBlock = 64;  // rows a thread walks

// softplus as libtorch computes it (threshold 20: x itself above).
__device__ __forceinline__ float softplus_of(float z) { return z > 20.f ? z : log1pf(expf(z)); }

// f [rows, C] (E), dt_bias [C] and A_log [H] (P: fp32 or E) -> g [rows, C] fp32.
template <typename E, typename P>
__global__ void __launch_bounds__(kThreads)
    softplus_decay_forward_kernel(const E* __restrict__ f, const P* __restrict__ dt_bias, const P* __restrict__ A_log,
                                  float* __restrict__ g, int64_t rows, int C, int K) {
  const int c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (c >= C) return;
  const float a = -expf(static_cast<float>(A_log[c / K])), b = static_cast<float>(dt_bias[c]);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowBlock;
  const int64_t r1 = r0 + kRowBlock < rows ? r0 + kRowBlock : rows;
  for (int64_t r = r0; r < r1; ++r) g[r * C + c] = a * softplus_of(static_cast<float>(f[r * C + c]) + b);
}

// Given f, dt_bias, A_log and dg: df [rows, C] (E) and partials [gridDim.y, 2, C] fp32 of Σ df (row 0) and
// Σ dg g (row 1) over the block's rows.
template <typename E, typename P>
__global__ void __launch_bounds__(kThreads)
    softplus_decay_backward_kernel(const E* __restrict__ f, const P* __restrict__ dt_bias, const P* __restrict__ A_log,
                                   const float* __restrict__ dg, E* __restrict__ df, float* __restrict__ partials,
                                   int64_t rows, int C, int K) {
  const int c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (c >= C) return;
  const float a = -expf(static_cast<float>(A_log[c / K])), b = static_cast<float>(dt_bias[c]);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowBlock;
  const int64_t r1 = r0 + kRowBlock < rows ? r0 + kRowBlock : rows;
  float sum_df = 0.f, sum_dgg = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float z = static_cast<float>(f[r * C + c]) + b, d = dg[r * C + c];
    const float dz = d * a * sigmoid_of(z);
    df[r * C + c] = static_cast<E>(dz);
    sum_df += dz;
    sum_dgg += d * a * softplus_of(z);
  }
  float* part = partials + static_cast<int64_t>(blockIdx.y) * 2 * C + c;
  part[0] = sum_df;
  part[C] = sum_dgg;
}

struct DecayShape {
  int64_t rows, C, K;
  dim3 grid() const {
    const auto channel_blocks = (C + kThreads - 1) / kThreads, row_blocks = (rows + kRowBlock - 1) / kRowBlock;
    return dim3(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(row_blocks));
  }
};

DecayShape check_inputs(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log) {
  TORCH_CHECK(f.dim() == 2 && f.is_contiguous() &&
                  softplus_decay_supported(f.scalar_type(), dt_bias.scalar_type(), A_log.scalar_type()),
              "softplus decay: expects f [rows, C] fp32, bf16 or fp16, contiguous, and dt_bias and A_log fp32 or f's "
              "dtype; got f ", f.sizes(), " ", f.scalar_type(), ", dt_bias ", dt_bias.scalar_type(), ", A_log ",
              A_log.scalar_type());
  const int64_t C = f.size(1);
  TORCH_CHECK(dt_bias.dim() == 1 && dt_bias.size(0) == C && dt_bias.is_contiguous() && dt_bias.device() == f.device(),
              "softplus decay: expects dt_bias [", C, "] contiguous on ", f.device(), "; got ", dt_bias.sizes());
  TORCH_CHECK(A_log.dim() == 1 && A_log.size(0) > 0 && C % A_log.size(0) == 0 && A_log.is_contiguous() &&
                  A_log.device() == f.device(),
              "softplus decay: expects A_log [H] contiguous with H dividing ", C, "; got ", A_log.sizes());
  TORCH_CHECK(f.size(0) / kRowBlock < 65535 && C < (int64_t{1} << 30), "softplus decay: too large ", f.sizes());
  return DecayShape{f.size(0), C, C / A_log.size(0)};
}

}  // namespace

bool softplus_decay_supported(torch::ScalarType f_dtype, torch::ScalarType dt_bias_dtype,
                              torch::ScalarType A_log_dtype) {
  const bool f_ok = float_type(f_dtype);
  const bool params_ok = dt_bias_dtype == A_log_dtype && (dt_bias_dtype == torch::kFloat || dt_bias_dtype == f_dtype);
  return f_ok && params_ok;
}

torch::Tensor softplus_decay_forward(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log) {
  const DecayShape s = check_inputs(f, dt_bias, A_log);
  const c10::cuda::CUDAGuard guard(f.device());
  auto g = torch::empty({s.rows, s.C}, f.options().dtype(torch::kFloat));
  if (s.rows == 0 || s.C == 0) return g;
  dispatch_with_params(f.scalar_type(), dt_bias.scalar_type(), [&](auto e, auto p) {
    using E = decltype(e);
    using P = decltype(p);
    launch(softplus_decay_forward_kernel<E, P>, s.grid(), kThreads, 0, data_as<E>(f), data_as<P>(dt_bias),
           data_as<P>(A_log), g.data_ptr<float>(), s.rows, static_cast<int>(s.C), static_cast<int>(s.K));
  });
  return g;
}

SoftplusDecayGrads softplus_decay_backward(const torch::Tensor& f, const torch::Tensor& dt_bias,
                                           const torch::Tensor& A_log, const torch::Tensor& dg) {
  const DecayShape s = check_inputs(f, dt_bias, A_log);
  TORCH_CHECK(dg.sizes() == f.sizes() && dg.scalar_type() == torch::kFloat && dg.is_contiguous(),
              "softplus decay backward: expects dg ", f.sizes(), " fp32 contiguous; got ", dg.sizes(), " ",
              dg.scalar_type());
  const c10::cuda::CUDAGuard guard(f.device());
  SoftplusDecayGrads out;
  out.df = torch::empty_like(f);
  const dim3 grid = s.grid();
  auto partials = torch::zeros({static_cast<int64_t>(grid.y), 2, s.C}, f.options().dtype(torch::kFloat));
  if (s.rows > 0 && s.C > 0) {
    dispatch_with_params(f.scalar_type(), dt_bias.scalar_type(), [&](auto e, auto p) {
      using E = decltype(e);
      using P = decltype(p);
      launch(softplus_decay_backward_kernel<E, P>, grid, kThreads, 0, data_as<E>(f), data_as<P>(dt_bias),
             data_as<P>(A_log), dg.data_ptr<float>(), data_as<E>(out.df), partials.data_ptr<float>(), s.rows,
             static_cast<int>(s.C), static_cast<int>(s.K));
    });
  }
  auto sums = partials.sum(0);  // [2, C]
  out.d_dt_bias = sums.select(0, 0).to(dt_bias.scalar_type());
  out.dA_log = sums.select(0, 1).reshape({s.C / s.K, s.K}).sum(1).to(A_log.scalar_type());
  return out;
}

}  // namespace linearize::ops::cuda_kernels
