// Norms over the last dim of [rows, D], one warp a row: the RMS norm of the Llama blocks and the mixers'
// output norms, and the L2 norm of the delta-rule mixers' q and k (see row_norms.h for the contract):
//   r = (mean_scale Σ_c x_c² + eps)^-1/2,   n = x r,   y = w ⊙ round(n)   (no w: y = round(n))
// with round() to x's dtype and the product in y's dtype, as the libtorch formula does it. Backward:
//   dn = dy ⊙ w,   dx = r (dn - n mean_scale Σ_c dn_c n_c),   dw = Σ_rows dy ⊙ round(n)
// Each warp reads its row twice (the second read mostly from L1/L2): the sum first, then the outputs. The
// libtorch formula makes some six passes over [rows, D] forward and more backward (pow, mean, the products,
// the casts, and their gradients) and keeps an fp32 copy of n for the backward; this keeps r [rows] only.
// dw: each warp adds its rows' terms into its own row of shared memory (lane l owns columns l, l + 32, ...,
// so no two threads touch a word), then a block sums its warps into partials [blocks, D] fp32, and the host
// adds those up. Block counts depend on the shape only, so dw is the same from run to run.
// With a gate (the mixers' gated output norms), z = round(y ⊙ a), a = round(act(gate)) in x's dtype, as
// `norm(o) * sigmoid(g)` or `* silu(g)` gives it; backward dy = round(dz ⊙ a), da = round(dz ⊙ y) and
// dgate = round(da act'(gate)), y recomputed from x and r.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/row_norms.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/shared_memory.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kWarps = 4;  // rows a block walks at once
constexpr int kThreads = kWarps * 32;
constexpr int64_t kPartialFloats = int64_t{1} << 20;  // dw's partials [blocks, D] take at most 4 MiB

// The gate's activation (ops.h's Gate) at v, rounded to the gate's dtype E, and its slope there (from
// the unrounded sigmoid: libtorch's sigmoid backward takes the rounded output, which near 1 loses 1 - s).
template <typename E>
__device__ __forceinline__ float gate_value(float v, Gate act) {
  const float s = sigmoid_of(v);
  return static_cast<float>(static_cast<E>(act == Gate::silu ? v * s : s));
}
__device__ __forceinline__ float gate_slope(float v, Gate act) {
  const float s = sigmoid_of(v);
  return act == Gate::silu ? silu_slope(v, s) : s * (1.f - s);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Where row r of an input lies: groups of `per` rows D apart, the groups `group` elements apart (a contiguous
// [rows, D] is one row a group, D apart; a packed product's heads [B, H, D] are H rows a group).
struct Rows {
  int64_t per, group;
  int D;
  __device__ __forceinline__ int64_t at(int64_t r) const { return (r / per) * group + (r % per) * D; }
};

// y's dtype: fp32 if x or w is, else x's (libtorch's type promotion for w * n).
template <typename E, typename W>
using OutOf = std::conditional_t<std::is_same_v<E, float> || std::is_same_v<W, float>, float, E>;

// x [rows, D] (E), w [D] (W) or null, gate [rows, D] (E) or null -> y [rows, D] (z with a gate), r [rows] fp32.
template <typename E, typename W>
__global__ void __launch_bounds__(kThreads)
    row_norm_forward_kernel(const E* __restrict__ x, Rows x_rows, const W* __restrict__ w,
                            const E* __restrict__ gate, Rows gate_rows, Gate act, const E* __restrict__ res,
                            E* __restrict__ sum, OutOf<E, W>* __restrict__ y, float* __restrict__ r, int64_t rows,
                            int D, float mean_scale, float eps) {
  using Out = OutOf<E, W>;
  const int lane = threadIdx.x % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const E* xr = x + x_rows.at(row);
    // With a residual the row normed is round(x + res), as a separate addition in E would give it.
    const E* rr = res == nullptr ? nullptr : res + row * D;
    auto x_at = [&](int c) {
      return rr == nullptr ? static_cast<float>(xr[c])
                           : static_cast<float>(static_cast<E>(static_cast<float>(xr[c]) + static_cast<float>(rr[c])));
    };
    float ss = 0.f;
    for (int c = lane; c < D; c += 32) {
      const float v = x_at(c);
      if (sum != nullptr) sum[row * D + c] = static_cast<E>(v);
      ss += v * v;
    }
    const float s = rsqrtf(warp_sum(ss) * mean_scale + eps);
    if (lane == 0) r[row] = s;
    Out* yr = y + row * D;
    const E* gr = gate == nullptr ? nullptr : gate + gate_rows.at(row);
    for (int c = lane; c < D; c += 32) {
      const float n = static_cast<float>(static_cast<E>(x_at(c) * s));
      const Out yc = static_cast<Out>(w == nullptr ? n : static_cast<float>(w[c]) * n);
      if (gr == nullptr) yr[c] = yc;
      else yr[c] = static_cast<Out>(static_cast<float>(yc) * gate_value<E>(static_cast<float>(gr[c]), act));
    }
  }
}

// Given x, w (or null), gate (or null), r and dy (dz with a gate; y's dtype): dx [rows, D] (E), with a gate
// dgate [rows, D] (E), and with partials dw's partial sums [gridDim.x, D] fp32. Shared memory: [kWarps, D]
// fp32 with partials, else none.
template <typename E, typename W>
__global__ void __launch_bounds__(kThreads)
    row_norm_backward_kernel(const E* __restrict__ x, Rows x_rows, const W* __restrict__ w,
                             const E* __restrict__ gate, Rows gate_rows, Gate act, const float* __restrict__ r,
                             const OutOf<E, W>* __restrict__ dy,
                             E* __restrict__ dx, E* __restrict__ dgate, float* __restrict__ partials, int64_t rows,
                             int D, float mean_scale) {
  using Out = OutOf<E, W>;
  LINEARIZE_DYNAMIC_SHARED(float, sdw);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* own = sdw + warp * D;  // this warp's terms of dw
  if (partials != nullptr)
    for (int c = lane; c < D; c += 32) own[c] = 0.f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const E* xr = x + x_rows.at(row);
    const Out* dyr = dy + row * D;
    const E* gr = gate == nullptr ? nullptr : gate + gate_rows.at(row);
    // The norm's output gradient at column c: dy, or through the gate round(dz a).
    auto dy_at = [&](int c) {
      if (gr == nullptr) return static_cast<float>(dyr[c]);
      const float a = gate_value<E>(static_cast<float>(gr[c]), act);
      return static_cast<float>(static_cast<Out>(static_cast<float>(dyr[c]) * a));
    };
    const float s = r[row];
    float dot = 0.f;  // Σ dn ⊙ x, times s below: Σ dn ⊙ n
    for (int c = lane; c < D; c += 32) {
      const float wc = w == nullptr ? 1.f : static_cast<float>(w[c]);
      dot += dy_at(c) * wc * static_cast<float>(xr[c]);
    }
    const float k = warp_sum(dot) * s * mean_scale;
    E* dxr = dx + row * D;
    for (int c = lane; c < D; c += 32) {
      const float g = dy_at(c), n = static_cast<float>(xr[c]) * s, nr = static_cast<float>(static_cast<E>(n));
      const float wc = w == nullptr ? 1.f : static_cast<float>(w[c]);
      dxr[c] = static_cast<E>(s * (g * wc - n * k));
      if (partials != nullptr) own[c] += g * nr;
      if (gr != nullptr) {
        const float yc = static_cast<float>(static_cast<Out>(w == nullptr ? nr : wc * nr));
        const float da = static_cast<float>(static_cast<E>(static_cast<float>(dyr[c]) * yc));
        const float v = static_cast<float>(gr[c]);
        dgate[row * D + c] = static_cast<E>(da * gate_slope(v, act));
      }
    }
  }
  if (partials == nullptr) return;
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += sdw[v * D + c];
    partials[static_cast<int64_t>(blockIdx.x) * D + c] = sum;
  }
}

// Calls fn(E{}, W{}) for x's and w's dtypes (w undefined: W = E).
template <typename Fn>
void dispatch_pair(const torch::Tensor& x, const torch::Tensor& w, Fn fn) {
  dispatch_float_types(x.scalar_type(), [&](auto e) {
    dispatch_float_types(w.defined() ? w.scalar_type() : x.scalar_type(), [&](auto wt) { fn(e, wt); });
  });
}

// One block for every kWarps rows, at most `cap` blocks (each warp then walks several rows).
unsigned blocks_for(int64_t rows, int64_t cap) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((rows + kWarps - 1) / kWarps, cap)));
}

// t's rows as the kernels read them: [rows, D] contiguous, or [G, H, D] with each group's rows contiguous.
Rows rows_of(const torch::Tensor& t, const char* what) {
  const int64_t D = t.size(-1);
  if (t.dim() == 2) {
    TORCH_CHECK(t.is_contiguous(), "row norm: expects ", what, " [rows, D] contiguous; got strides ", t.strides());
    return Rows{1, D, static_cast<int>(D)};
  }
  TORCH_CHECK(t.dim() == 3 && (D <= 1 || t.stride(2) == 1) && (t.size(1) <= 1 || t.stride(1) == D),
              "row norm: expects ", what, " [rows, D] contiguous or [G, H, D] with each group's rows contiguous; got ",
              t.sizes(), " strides ", t.strides());
  return Rows{std::max<int64_t>(1, t.size(1)), t.size(0) <= 1 ? t.size(1) * D : t.stride(0), static_cast<int>(D)};
}

int64_t rows_in(const torch::Tensor& t) { return t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }

void check_input(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& gate) {
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && float_type(x.scalar_type()),
              "row norm: expects x [rows, D] or [G, H, D] fp32, bf16 or fp16; got ", x.sizes(), " ", x.scalar_type());
  const int64_t D = x.size(-1);
  TORCH_CHECK(row_norm_supported(x.scalar_type(), w.defined() ? w.scalar_type() : x.scalar_type(), D),
              "row norm: unsupported x dtype ", x.scalar_type(), ", weight dtype ",
              w.defined() ? w.scalar_type() : x.scalar_type(), " or row length ", D);
  rows_of(x, "x");
  if (w.defined())
    TORCH_CHECK(w.dim() == 1 && w.size(0) == D && w.is_contiguous() && w.device() == x.device(),
                "row norm: expects weight [", D, "] contiguous on ", x.device(), "; got ", w.sizes(), " on ",
                w.device());
  if (gate.defined()) {
    TORCH_CHECK(gate.size(-1) == D && rows_in(gate) == rows_in(x) && gate.scalar_type() == x.scalar_type() &&
                    gate.device() == x.device(),
                "row norm: expects the gate with x's ", rows_in(x), " rows of ", D, " ", x.scalar_type(), " on ",
                x.device(), "; got ", gate.sizes(), " ", gate.scalar_type(), " on ", gate.device());
    rows_of(gate, "the gate");
  }
}

}  // namespace

bool row_norm_supported(torch::ScalarType x_dtype, torch::ScalarType w_dtype, int64_t D) {
  const bool pair = w_dtype == x_dtype || w_dtype == torch::kFloat || x_dtype == torch::kFloat;
  return float_type(x_dtype) && float_type(w_dtype) && pair && D >= 1 && D <= kMaxRowNormSize;
}

RowNormForward row_norm_forward(const torch::Tensor& x, const torch::Tensor& w, double mean_scale, double eps,
                                const torch::Tensor& gate, Gate act, const torch::Tensor& residual) {
  check_input(x, w, gate);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = rows_in(x), D = x.size(-1);
  TORCH_CHECK(!residual.defined() || (residual.sizes() == torch::IntArrayRef({rows, D}) &&
                                      residual.scalar_type() == x.scalar_type() && residual.is_contiguous() &&
                                      residual.device() == x.device()),
              "row norm: expects a residual [", rows, ", ", D, "] ", x.scalar_type(), " contiguous; got ",
              residual.defined() ? residual.sizes() : torch::IntArrayRef{});
  const Rows x_rows = rows_of(x, "x"), gate_rows = gate.defined() ? rows_of(gate, "the gate") : x_rows;
  const auto y_dtype = w.defined() ? at::promote_types(x.scalar_type(), w.scalar_type()) : x.scalar_type();
  RowNormForward out{torch::empty({rows, D}, x.options().dtype(y_dtype)),
                     torch::empty({rows}, x.options().dtype(torch::kFloat))};
  if (residual.defined()) out.sum = torch::empty({rows, D}, x.options());
  if (rows == 0) return out;
  dispatch_pair(x, w, [&](auto e, auto wt) {
    using E = decltype(e);
    using W = decltype(wt);
    launch(row_norm_forward_kernel<E, W>, blocks_for(rows, int64_t{1} << 20), kThreads, 0, data_as<E>(x), x_rows,
           data_or_null<W>(w), data_or_null<E>(gate), gate_rows, act, data_or_null<E>(residual),
           out.sum.defined() ? data_as<E>(out.sum) : nullptr, data_as<OutOf<E, W>>(out.y),
           out.rstd.data_ptr<float>(), rows, static_cast<int>(D), static_cast<float>(mean_scale), static_cast<float>(eps));
  });
  return out;
}

RowNormGrads row_norm_backward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& rstd,
                               const torch::Tensor& dy, double mean_scale, bool want_dw, const torch::Tensor& gate,
                               Gate act) {
  check_input(x, w, gate);
  const int64_t rows = rows_in(x), D = x.size(-1);
  const Rows x_rows = rows_of(x, "x"), gate_rows = gate.defined() ? rows_of(gate, "the gate") : x_rows;
  TORCH_CHECK(rstd.sizes() == torch::IntArrayRef{rows} && rstd.scalar_type() == torch::kFloat && rstd.is_contiguous(),
              "row norm backward: expects rstd [", rows, "] fp32 contiguous; got ", rstd.sizes(), " ",
              rstd.scalar_type());
  const auto y_dtype = w.defined() ? at::promote_types(x.scalar_type(), w.scalar_type()) : x.scalar_type();
  TORCH_CHECK(dy.sizes() == torch::IntArrayRef({rows, D}) && dy.scalar_type() == y_dtype && dy.is_contiguous(),
              "row norm backward: expects dy [", rows, ", ", D, "] ", y_dtype, " contiguous; got ", dy.sizes(), " ",
              dy.scalar_type());
  want_dw = want_dw && w.defined();
  const c10::cuda::CUDAGuard guard(x.device());
  RowNormGrads out;
  out.dx = torch::empty({rows, D}, x.options());
  if (gate.defined()) out.dgate = torch::empty({rows, D}, gate.options());
  const unsigned blocks = blocks_for(rows, std::max<int64_t>(1, kPartialFloats / D));
  torch::Tensor partials;
  if (want_dw) partials = torch::empty({static_cast<int64_t>(blocks), D}, x.options().dtype(torch::kFloat));
  if (rows > 0) {
    dispatch_pair(x, w, [&](auto e, auto wt) {
      using E = decltype(e);
      using W = decltype(wt);
      launch(row_norm_backward_kernel<E, W>, blocks, kThreads, want_dw ? kWarps * D * sizeof(float) : 0,
             data_as<E>(x), x_rows, data_or_null<W>(w), data_or_null<E>(gate), gate_rows, act,
             rstd.data_ptr<float>(),
             data_as<OutOf<E, W>>(dy), data_as<E>(out.dx), gate.defined() ? data_as<E>(out.dgate) : nullptr,
             want_dw ? partials.data_ptr<float>() : nullptr, rows, static_cast<int>(D), static_cast<float>(mean_scale));
    });
  }
  if (want_dw) out.dw = rows > 0 ? partials.sum(0).to(w.scalar_type()) : torch::zeros_like(w);
  return out;
}

}  // namespace linearize::ops::cuda_kernels
