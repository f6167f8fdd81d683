// The mixers' short convolutions (fla's ShortConvolution) in one kernel each way (see short_conv.h for the
// contract): a causal depthwise convolution over time of width W with an optional bias and silu,
//   p[b, t, c] = bias[c] + Σ_{i < W} w[c, i] x̃[b, t + i, c],   y = round(silu(round(p))) or round(p)
// where x̃ = [prefix; x] along time (the W-1 inputs before x, from a decoding state, or zeros), with w and
// bias rounded to x's dtype and the sum in fp32, as the libtorch formula (cat, conv1d, silu) computes it. The
// kernel also returns the W-1 last inputs of x̃, the state the next call starts from. Backward, with
// dz = dy silu'(p) (p recomputed):
//   dx[b, u, c] = Σ_i w[c, i] dz[b, u + W-1 - i, c],   dw[c, i] = Σ_{b,t} dz[b, t, c] x̃[b, t + i, c],
//   dbias[c] = Σ_{b,t} dz[b, t, c]
// One thread per (batch row, segment of kSegment steps, channel): consecutive threads take consecutive
// channels, so each step's loads and stores are coalesced, and the thread slides its window of x̃ (and in
// the backward of dz) along its steps. dw and dbias go into per-segment partial sums [B * segments, W + 1, C]
// fp32 that the host adds up, so they are the same from run to run.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/short_conv.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kThreads = 128;  // channels a block
constexpr int kSegment = 32;   // steps a thread

// Where thread (b, segment, c) works, and the window of x̃ it reads.
struct ConvAt {
  int64_t b;
  int t0, t1, c;  // steps [t0, t1) of x; channel c
  __device__ ConvAt(int T, int C) {
    b = blockIdx.z, c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
    t0 = static_cast<int>(blockIdx.y) * kSegment, t1 = min(t0 + kSegment, T);
  }
};

// Where x's rows lie: x[b, t, c] at b * batch + t * step + c (a row may be a slice of a wider one, as the
// packed projections' outputs are).
struct XRows {
  int64_t batch, step;
  __device__ __forceinline__ int64_t at(int64_t b, int t) const { return b * batch + t * step; }
};

// x̃[b, s, c] in fp32 for s in x̃'s steps (s < W-1: the prefix, or 0 without one).
template <typename E>
__device__ __forceinline__ float input_at(const E* x, XRows rows, const E* prefix, int64_t b, int s, int c, int C,
                                          int W) {
  if (s >= W - 1) return static_cast<float>(x[rows.at(b, s - (W - 1)) + c]);
  return prefix == nullptr ? 0.f : static_cast<float>(prefix[(b * C + c) * (W - 1) + s]);
}

// x [B, T, C] (E, rows where `rows` says), w [C, W] (Wt), bias [C] (Wt) or null, prefix [B, C, W-1] (E) or
// null -> y [B, T, C] (E) and, with cache, x̃'s last W-1 steps [B, C, W-1] (E). cache may be prefix when T = 1 (one thread a channel reads
// its prefix before it writes the cache over it), so neither is __restrict__.
template <typename E, typename Wt, int W>
__global__ void __launch_bounds__(kThreads)
    short_conv_forward_kernel(const E* __restrict__ x, XRows rows, const Wt* __restrict__ w,
                              const Wt* __restrict__ bias, const E* prefix, E* __restrict__ y, E* cache, int T, int C,
                              bool silu) {
  const ConvAt at(T, C);
  if (at.c >= C) return;
  float wc[W], window[W];  // window[i] = x̃[t + i] at step t
#pragma unroll
  for (int i = 0; i < W; ++i) {
    wc[i] = static_cast<float>(static_cast<E>(w[at.c * W + i]));
    window[i] = i + 1 < W ? input_at(x, rows, prefix, at.b, at.t0 + i, at.c, C, W) : 0.f;
  }
  const float b0 = bias == nullptr ? 0.f : static_cast<float>(static_cast<E>(bias[at.c]));
  for (int t = at.t0; t < at.t1; ++t) {
    window[W - 1] = static_cast<float>(x[rows.at(at.b, t) + at.c]);
    float p = b0;
#pragma unroll
    for (int i = 0; i < W; ++i) p += wc[i] * window[i];
    if (silu) {
      const float pr = static_cast<float>(static_cast<E>(p));
      p = pr * sigmoid_of(pr);
    }
    y[(at.b * T + t) * C + at.c] = static_cast<E>(p);
#pragma unroll
    for (int i = 0; i + 1 < W; ++i) window[i] = window[i + 1];
  }
  // The state after x: x̃'s steps T .. T + W-2 (the last W-1), written by the last segment.
  if (cache != nullptr && at.t1 == T) {
    for (int j = 0; j < W - 1; ++j)
      cache[(at.b * C + at.c) * (W - 1) + j] = static_cast<E>(input_at(x, rows, prefix, at.b, T + j, at.c, C, W));
  }
}

// Given x, w, bias, prefix as the forward took them and dy [B, T, C] (E): dx [B, T, C] (E) and the partial
// sums [B * segments, W + 1, C] fp32 of dw (rows 0 .. W-1) and dbias (row W).
template <typename E, typename Wt, int W>
__global__ void __launch_bounds__(kThreads)
    short_conv_backward_kernel(const E* __restrict__ x, XRows rows, const Wt* __restrict__ w,
                               const Wt* __restrict__ bias, const E* __restrict__ prefix, const E* __restrict__ dy,
                               E* __restrict__ dx, float* __restrict__ partials, int T, int C, bool silu) {
  const ConvAt at(T, C);
  if (at.c >= C) return;
  float wc[W], window[W], dz[W], dw[W];
#pragma unroll
  for (int i = 0; i < W; ++i) {
    wc[i] = static_cast<float>(static_cast<E>(w[at.c * W + i]));
    window[i] = i + 1 < W ? input_at(x, rows, prefix, at.b, at.t0 + i, at.c, C, W) : 0.f;
    dz[i] = 0.f, dw[i] = 0.f;
  }
  const float b0 = bias == nullptr ? 0.f : static_cast<float>(static_cast<E>(bias[at.c]));
  float db = 0.f;
  // Step t's dz for t from t0 to W-2 steps past the segment (zero from T on), as the segment's dx needs them;
  // dx[u] once dz[u .. u + W-1] are known. dz[i] holds dz[t - (W-1) + i].
  for (int t = at.t0; t < at.t1 + W - 1; ++t) {
    float g = 0.f;
    if (t < T) {
      window[W - 1] = static_cast<float>(x[rows.at(at.b, t) + at.c]);
      float p = b0;
#pragma unroll
      for (int i = 0; i < W; ++i) p += wc[i] * window[i];
      g = static_cast<float>(dy[(at.b * T + t) * C + at.c]);
      if (silu) {
        const float pr = static_cast<float>(static_cast<E>(p)), s = sigmoid_of(pr);
        g *= silu_slope(pr, s);
      }
    }
#pragma unroll
    for (int i = 0; i + 1 < W; ++i) dz[i] = dz[i + 1];
    dz[W - 1] = g;
    if (t < at.t1) {
#pragma unroll
      for (int i = 0; i < W; ++i) dw[i] += g * window[i];
      db += g;
    }
    const int u = t - (W - 1);
    if (u >= at.t0) {
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < W; ++j) sum += wc[W - 1 - j] * dz[j];
      dx[(at.b * T + u) * C + at.c] = static_cast<E>(sum);
    }
#pragma unroll
    for (int i = 0; i + 1 < W; ++i) window[i] = window[i + 1];
  }
  float* part = partials + ((at.b * gridDim.y + blockIdx.y) * (W + 1)) * C + at.c;
#pragma unroll
  for (int i = 0; i < W; ++i) part[static_cast<int64_t>(i) * C] = dw[i];
  part[static_cast<int64_t>(W) * C] = db;
}

// Calls fn(E{}, Wt{}, std::integral_constant<int, W>{}) for x's and w's dtypes (w fp32 or x's dtype) and
// the width (kMinShortConvWidth .. kMaxShortConvWidth).
template <typename Fn>
void dispatch(torch::ScalarType x, torch::ScalarType w, int64_t width, Fn fn) {
  auto with_width = [&](auto e, auto wt) {
    static_assert(kMinShortConvWidth == 2 && kMaxShortConvWidth == 4, "the widths below");
    if (width == 2) fn(e, wt, std::integral_constant<int, 2>{});
    else if (width == 3) fn(e, wt, std::integral_constant<int, 3>{});
    else fn(e, wt, std::integral_constant<int, 4>{});
  };
  dispatch_with_params(x, w, with_width);
}

struct ConvShape {
  int64_t B, T, C, W;
  XRows rows;
  dim3 grid() const {
    const auto channel_blocks = (C + kThreads - 1) / kThreads, segments = (T + kSegment - 1) / kSegment;
    return dim3(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(segments), static_cast<unsigned>(B));
  }
};

ConvShape check_inputs(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                       const torch::Tensor& prefix) {
  TORCH_CHECK(x.dim() == 3 && (x.stride(2) == 1 || x.size(2) <= 1),
              "short conv: expects x [B, T, C] with each row's channels contiguous; got ", x.sizes(), " strides ",
              x.strides());
  TORCH_CHECK(w.dim() == 2 && w.size(0) == x.size(2) && w.is_contiguous() && w.device() == x.device(),
              "short conv: expects the weight [", x.size(2), ", W] contiguous on ", x.device(), "; got ", w.sizes());
  TORCH_CHECK(short_conv_supported(x.scalar_type(), w.scalar_type(), w.size(1)),
              "short conv: unsupported x dtype ", x.scalar_type(), ", weight dtype ", w.scalar_type(), " or width ",
              w.size(1));
  if (bias.defined())
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(2) && bias.scalar_type() == w.scalar_type() &&
                    bias.is_contiguous() && bias.device() == x.device(),
                "short conv: expects the bias [", x.size(2), "] ", w.scalar_type(), " contiguous; got ", bias.sizes(),
                " ", bias.scalar_type());
  const int64_t W = w.size(1);
  if (prefix.defined())
    TORCH_CHECK(prefix.sizes() == torch::IntArrayRef({x.size(0), x.size(2), W - 1}) &&
                    prefix.scalar_type() == x.scalar_type() && prefix.is_contiguous() && prefix.device() == x.device(),
                "short conv: expects the prefix [", x.size(0), ", ", x.size(2), ", ", W - 1, "] ", x.scalar_type(),
                " contiguous; got ", prefix.sizes(), " ", prefix.scalar_type());
  TORCH_CHECK(x.size(0) <= 65535 && x.size(1) < (int64_t{1} << 30) && x.size(2) < (int64_t{1} << 30),
              "short conv: too large ", x.sizes());
  return ConvShape{x.size(0), x.size(1), x.size(2), W, XRows{x.stride(0), x.stride(1)}};
}

}  // namespace

bool short_conv_supported(torch::ScalarType x_dtype, torch::ScalarType w_dtype, int64_t width) {
  return float_type(x_dtype) && (w_dtype == x_dtype || w_dtype == torch::kFloat) && width >= kMinShortConvWidth &&
         width <= kMaxShortConvWidth;
}

ShortConvForward short_conv_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                    const torch::Tensor& prefix, bool silu, bool want_cache, bool cache_into_prefix) {
  const ConvShape s = check_inputs(x, w, bias, prefix);
  const c10::cuda::CUDAGuard guard(x.device());
  ShortConvForward out{torch::empty(x.sizes(), x.options()), torch::Tensor()};
  if (want_cache) out.cache = cache_into_prefix && s.T == 1 && prefix.defined() ? prefix : torch::empty({s.B, s.C, s.W - 1}, x.options());
  if (s.B == 0 || s.C == 0) return out;
  if (s.T == 0) {  // nothing to convolve: the state passes through
    if (want_cache) out.cache = prefix.defined() ? prefix.clone() : torch::zeros({s.B, s.C, s.W - 1}, x.options());
    return out;
  }
  dispatch(x.scalar_type(), w.scalar_type(), s.W, [&](auto e, auto wt, auto width) {
    using E = decltype(e);
    using Wt = decltype(wt);
    launch(short_conv_forward_kernel<E, Wt, decltype(width)::value>, s.grid(), kThreads, 0, data_as<E>(x), s.rows,
           data_as<Wt>(w), data_or_null<Wt>(bias), data_or_null<E>(prefix), data_as<E>(out.y),
           want_cache ? data_as<E>(out.cache) : nullptr, static_cast<int>(s.T), static_cast<int>(s.C), silu);
  });
  return out;
}

ShortConvGrads short_conv_backward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                   const torch::Tensor& prefix, const torch::Tensor& dy, bool silu) {
  const ConvShape s = check_inputs(x, w, bias, prefix);
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() && dy.is_contiguous(),
              "short conv backward: expects dy ", x.sizes(), " ", x.scalar_type(), " contiguous; got ", dy.sizes(),
              " ", dy.scalar_type());
  const c10::cuda::CUDAGuard guard(x.device());
  ShortConvGrads out{torch::empty(x.sizes(), x.options()), torch::Tensor(), torch::Tensor()};
  const dim3 grid = s.grid();
  auto partials = torch::zeros({s.B * grid.y, s.W + 1, s.C}, x.options().dtype(torch::kFloat));
  if (s.B > 0 && s.C > 0 && s.T > 0) {
    dispatch(x.scalar_type(), w.scalar_type(), s.W, [&](auto e, auto wt, auto width) {
      using E = decltype(e);
      using Wt = decltype(wt);
      launch(short_conv_backward_kernel<E, Wt, decltype(width)::value>, grid, kThreads, 0, data_as<E>(x), s.rows,
             data_as<Wt>(w), data_or_null<Wt>(bias), data_or_null<E>(prefix), data_as<E>(dy), data_as<E>(out.dx),
             partials.data_ptr<float>(), static_cast<int>(s.T), static_cast<int>(s.C), silu);
    });
  }
  auto sums = partials.sum(0);  // [W + 1, C]
  out.dw = sums.narrow(0, 0, s.W).t().contiguous().to(w.scalar_type());  // [C, W]
  if (bias.defined()) out.dbias = sums.select(0, s.W).to(bias.scalar_type());
  return out;
}

}  // namespace linearize::ops::cuda_kernels
