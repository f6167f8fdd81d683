// The per-token terms of stage-3 distillation over the vocabulary (see distill_loss.h for the contract), one
// thread block a row of student logits s and teacher logits t, with temperature T:
//   ce  = lse(s) - s[y]
//   kl  = KL(softmax(t/T) || softmax(s/T)) = Σ_j p_j (t_j - s_j) / T - lse(t/T) + lse(s/T),   p = softmax(t/T)
// Forward, one pass over the row: each thread keeps running maxima and sums of exponentials (rescaled when
// its maximum grows) for s, s/T and t/T, and for t/T also Σ e^{t_j/T - m} (t_j - s_j) / T; the block then
// merges the threads' partial sums. It keeps the three logsumexps [3, N] for the backward:
//   ds_j = dce (e^{s_j - lse(s)} - [j = y]) + dkl / T (e^{s_j/T - lse(s/T)} - e^{t_j/T - lse(t/T)})
// written in s's dtype. Without teacher logits (plain next-token training, Teacher = false) the kernels give ce
// and its gradient alone. The libtorch formula (casts to fp32, log_softmax of both, their difference, the
// product and the sum, then as many passes back) reads and writes [N, V] fp32 tensors some twenty times and
// keeps several of them for the backward: at SmolLM2's 49152 words and 8192 tokens each is 1.6 GB. These
// kernels read s and t once each way and keep nothing of that size.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cfloat>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/distill_loss.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// A running sum of exponentials e^{x - m} with its maximum m (m starts at -FLT_MAX: e^{x - m} of any finite
// x below it is 0, and two empty sums merge to an empty one).
struct ExpSum {
  float m = -FLT_MAX, z = 0.f;
  // Makes m at least mx, rescaling z, and returns the factor z took.
  __device__ __forceinline__ float raise(float mx) {
    if (mx <= m) return 1.f;
    const float f = __expf(m - mx);
    z *= f, m = mx;
    return f;
  }
  __device__ __forceinline__ float lse() const { return m + logf(z); }
};

// Merges b into a: the sums at the larger maximum. Returns a's factor and sets fb to b's.
__device__ __forceinline__ float join(ExpSum& a, const ExpSum& b, float& fb) {
  const float m = fmaxf(a.m, b.m), fa = __expf(a.m - m);
  fb = __expf(b.m - m);
  a.z = a.z * fa + b.z * fb, a.m = m;
  return fa;
}

// What one thread (then the block) has summed of a row.
struct RowSums {
  ExpSum s, sT, tT;  // s, s/T, t/T
  float c = 0.f;     // Σ e^{t_j/T - tT.m} (t_j - s_j) / T, scaled with tT.z
  static constexpr int kFloats = 7;

  __device__ __forceinline__ void merge(const RowSums& o, bool unit, bool teacher) {
    float fb;
    join(s, o.s, fb);
    if (!teacher) return;
    if (!unit) join(sT, o.sT, fb);
    const float fa = join(tT, o.tT, fb);
    c = c * fa + o.c * fb;
  }
  __device__ __forceinline__ void put(float* f) const {
    f[0] = s.m, f[1] = s.z, f[2] = sT.m, f[3] = sT.z, f[4] = tT.m, f[5] = tT.z, f[6] = c;
  }
  __device__ __forceinline__ void get(const float* f) {
    s.m = f[0], s.z = f[1], sT.m = f[2], sT.z = f[3], tT.m = f[4], tT.z = f[5], c = f[6];
  }
};

__device__ __forceinline__ RowSums shuffle_xor(const RowSums& r, int mask) {
  float f[RowSums::kFloats];
  r.put(f);
#pragma unroll
  for (int i = 0; i < RowSums::kFloats; ++i) f[i] = __shfl_xor_sync(0xffffffffu, f[i], mask);
  RowSums o;
  o.get(f);
  return o;
}

// s, t [N, V] (E), y [N] -> ce, kl [N] fp32 and lse [3, N] fp32 (rows: lse(s), lse(s/T), lse(t/T)); without
// the teacher (t, kl null) ce and lse [1, N]. Block `row`, W elements a thread at a time (words = V / W a row).
// unit: T = 1, where s/T is s.
template <typename E, int W, bool Teacher>
__global__ void __launch_bounds__(kThreads)
    distill_loss_forward_kernel(const E* __restrict__ s, const E* __restrict__ t, const int64_t* __restrict__ y,
                                float* __restrict__ ce, float* __restrict__ kl, float* __restrict__ lse,
                                int64_t N, int64_t V, float inv_T, bool unit) {
  __shared__ float parts[kWarps * RowSums::kFloats];
  const int64_t row = blockIdx.x, words = V / W;
  const Word<E, W>* sr = reinterpret_cast<const Word<E, W>*>(s + row * V);
  const Word<E, W>* tr = Teacher ? reinterpret_cast<const Word<E, W>*>(t + row * V) : nullptr;
  RowSums acc;
  for (int64_t w = threadIdx.x; w < words; w += kThreads) {
    const Word<E, W> sw = sr[w];
    float sv[W], tv[W], mx = -FLT_MAX, mt = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < W; ++j) sv[j] = static_cast<float>(sw.x[j]), mx = fmaxf(mx, sv[j]);
    acc.s.raise(mx);
#pragma unroll
    for (int j = 0; j < W; ++j) acc.s.z += __expf(sv[j] - acc.s.m);
    if (!Teacher) continue;
    const Word<E, W> tw = tr[w];
#pragma unroll
    for (int j = 0; j < W; ++j) tv[j] = static_cast<float>(tw.x[j]) * inv_T, mt = fmaxf(mt, tv[j]);
    if (!unit) acc.sT.raise(mx * inv_T);
    acc.c *= acc.tT.raise(mt);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if (!unit) acc.sT.z += __expf(sv[j] * inv_T - acc.sT.m);
      const float e = __expf(tv[j] - acc.tT.m);
      acc.tT.z += e;
      acc.c += e * (tv[j] - sv[j] * inv_T);
    }
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) acc.merge(shuffle_xor(acc, mask), unit, Teacher);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) acc.put(parts + warp * RowSums::kFloats);
  __syncthreads();
  if (threadIdx.x != 0) return;
  RowSums total;
  total.get(parts);
  for (int i = 1; i < kWarps; ++i) {
    RowSums part;
    part.get(parts + i * RowSums::kFloats);
    total.merge(part, unit, Teacher);
  }
  const float l1 = total.s.lse();
  lse[row] = l1;
  const int64_t target = y[row];
  ce[row] = target >= 0 && target < V ? l1 - static_cast<float>(s[row * V + target]) : 0.f;
  if (!Teacher) return;
  if (unit) total.sT = total.s;
  const float lS = total.sT.lse(), lT = total.tT.lse();
  lse[N + row] = lS, lse[2 * N + row] = lT;
  kl[row] = total.c / total.tT.z - lT + lS;
}

// Given the forward's lse and the terms' gradients dce, dkl [N] fp32 (without the teacher: t, dkl null): ds
// [N, V] (E).
template <typename E, int W, bool Teacher>
__global__ void __launch_bounds__(kThreads)
    distill_loss_backward_kernel(const E* __restrict__ s, const E* __restrict__ t, const int64_t* __restrict__ y,
                                 const float* __restrict__ lse, const float* __restrict__ dce,
                                 const float* __restrict__ dkl, E* __restrict__ ds, int64_t N, int64_t V, float inv_T) {
  const int64_t row = blockIdx.x, words = V / W, target = y[row];
  const float l1 = lse[row], lS = Teacher ? lse[N + row] : 0.f, lT = Teacher ? lse[2 * N + row] : 0.f;
  const float gce = target >= 0 && target < V ? dce[row] : 0.f;  // ignored: no CE
  const float gkl = Teacher ? dkl[row] * inv_T : 0.f;
  const Word<E, W>* sr = reinterpret_cast<const Word<E, W>*>(s + row * V);
  const Word<E, W>* tr = Teacher ? reinterpret_cast<const Word<E, W>*>(t + row * V) : nullptr;
  Word<E, W>* out = reinterpret_cast<Word<E, W>*>(ds + row * V);
  for (int64_t w = threadIdx.x; w < words; w += kThreads) {
    const Word<E, W> sw = sr[w];
    Word<E, W> tw;
    if (Teacher) tw = tr[w];
    Word<E, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float sv = static_cast<float>(sw.x[j]), hit = w * W + j == target ? 1.f : 0.f;
      float g = gce * (__expf(sv - l1) - hit);
      if (Teacher) g += gkl * (__expf(sv * inv_T - lS) - __expf(static_cast<float>(tw.x[j]) * inv_T - lT));
      o.x[j] = static_cast<E>(g);
    }
    out[w] = o;
  }
}

// dispatch_words (elementwise.cuh) with a third argument, std::bool_constant<Teacher>{}.
template <typename Fn>
void dispatch(torch::ScalarType dt, bool wide, bool teacher, Fn fn) {
  dispatch_words(dt, wide, [&](auto e, auto w) {
    if (teacher) fn(e, w, std::true_type{});
    else fn(e, w, std::false_type{});
  });
}

// Whether s's rows (and t's, ds's) go 16 bytes at a time.
bool wide_rows(const torch::Tensor& s, std::initializer_list<const torch::Tensor*> ts) {
  return wide_words(s.size(1), s.scalar_type(), ts);
}

void check_inputs(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y) {
  TORCH_CHECK(s.dim() == 2 && s.is_contiguous() && distill_loss_supported(s.scalar_type()),
              "distill_loss: expects student logits [N, V] contiguous, fp32, bf16 or fp16; got ", s.sizes(), " ",
              s.scalar_type());
  TORCH_CHECK(!t.defined() || (t.sizes() == s.sizes() && t.scalar_type() == s.scalar_type() && t.is_contiguous() &&
                                t.device() == s.device()),
              "distill_loss: expects teacher logits ", s.sizes(), " ", s.scalar_type(), " contiguous on ", s.device(),
              "; got ", t.sizes(), " ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(y.dim() == 1 && y.size(0) == s.size(0) && y.scalar_type() == torch::kLong && y.is_contiguous() &&
                  y.device() == s.device(),
              "distill_loss: expects targets [", s.size(0), "] int64 on ", s.device(), "; got ", y.sizes(), " ",
              y.scalar_type(), " on ", y.device());
}

}  // namespace

bool distill_loss_supported(torch::ScalarType dtype) { return float_type(dtype); }

DistillLossForward distill_loss_forward(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y,
                                        double temperature) {
  check_inputs(s, t, y);
  TORCH_CHECK(temperature > 0, "distill_loss: expects a positive temperature, got ", temperature);
  const c10::cuda::CUDAGuard guard(s.device());
  const int64_t N = s.size(0), V = s.size(1);
  const auto f32 = s.options().dtype(torch::kFloat);
  const bool teacher = t.defined();
  DistillLossForward out{torch::zeros({N}, f32), teacher ? torch::zeros({N}, f32) : torch::Tensor(),
                         torch::zeros({teacher ? 3 : 1, N}, f32)};
  if (N == 0 || V == 0) return out;
  TORCH_CHECK(N <= INT32_MAX, "distill_loss: at most 2^31 - 1 rows, got ", N);
  const float inv_T = static_cast<float>(1.0 / temperature);
  dispatch(s.scalar_type(), wide_rows(s, {&s, &t}), teacher, [&](auto e, auto w, auto with) {
    using E = decltype(e);
    constexpr int W = decltype(w)::value;
    launch(distill_loss_forward_kernel<E, W, decltype(with)::value>, static_cast<unsigned>(N), kThreads, 0,
           data_as<E>(s), data_or_null<E>(t), y.data_ptr<int64_t>(), out.ce.data_ptr<float>(), out_or_null(out.kl),
           out.lse.data_ptr<float>(), N, V, inv_T, temperature == 1.0);
  });
  return out;
}

torch::Tensor distill_loss_backward(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& y,
                                    const torch::Tensor& lse, const torch::Tensor& dce, const torch::Tensor& dkl,
                                    double temperature) {
  check_inputs(s, t, y);
  const int64_t N = s.size(0), V = s.size(1);
  const bool teacher = t.defined();
  for (const auto* g : {&dce, &dkl})
    TORCH_CHECK((g == &dkl && !teacher) || (g->dim() == 1 && g->size(0) == N && g->scalar_type() == torch::kFloat &&
                                            g->is_contiguous() && g->device() == s.device()),
                "distill_loss: expects the terms' gradients [", N, "] fp32 on ", s.device(), "; got ", g->sizes(),
                " ", g->scalar_type());
  TORCH_CHECK(lse.dim() == 2 && lse.size(0) == (teacher ? 3 : 1) && lse.size(1) == N &&
                  lse.scalar_type() == torch::kFloat && lse.is_contiguous(),
              "distill_loss: expects the forward's lse [", teacher ? 3 : 1, ", ", N, "] fp32; got ", lse.sizes(), " ",
              lse.scalar_type());
  const c10::cuda::CUDAGuard guard(s.device());
  auto ds = torch::empty_like(s);
  if (N == 0 || V == 0) return ds;
  const float inv_T = static_cast<float>(1.0 / temperature);
  dispatch(s.scalar_type(), wide_rows(s, {&s, &t, &ds}), teacher, [&](auto e, auto w, auto with) {
    using E = decltype(e);
    constexpr int W = decltype(w)::value;
    launch(distill_loss_backward_kernel<E, W, decltype(with)::value>, static_cast<unsigned>(N), kThreads, 0,
           data_as<E>(s), data_or_null<E>(t), y.data_ptr<int64_t>(), lse.data_ptr<float>(), dce.data_ptr<float>(),
           ptr_or_null(dkl), data_as<E>(ds), N, V, inv_T);
  });
  return ds;
}

}  // namespace linearize::ops::cuda_kernels
