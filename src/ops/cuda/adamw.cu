// AdamW's update of many fp32 tensors in a few launches (see adamw.h for the contract). libtorch's
// optimizer runs some nine element-wise launches a parameter (the decay, the two moments' mul and add, sqrt,
// div, add, addcdiv); at SmolLM2-135M's 270 to 570 trainable tensors that is thousands of launches a step,
// and the step is bound by the host. Here up to kMaxTensors tensors go in one launch, block row y taking
// tensor y with a grid-stride loop, with libtorch's formula and order of operations per element:
//   p = p (1 - lr wd);   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g g
//   p = p - step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps),   step_size = lr / (1 - b1^t)
// with g first multiplied by *grad_scale where there is one (gradient clipping's factor, read on the device).
// The factors decay, step_size and bias2_sqrt come as launch arguments, or from a device array that a CUDA
// graph's replays refill each step; with a skip flag (the gradients' norm on the device) a non-finite one
// leaves everything as it was.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cuda/adamw.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTensors = 32;    // a launch's tensors (its parameter block stays under 2 KiB)
constexpr int64_t kMaxBlocks = 512;  // per tensor; then each thread walks several elements

struct TensorBatch {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  int64_t n[kMaxTensors];
  float decay[kMaxTensors], step_size[kMaxTensors], bias2_sqrt[kMaxTensors];
  int index[kMaxTensors];  // the tensor's row of the device factors
};

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(TensorBatch b, const float* grad_scale, const float* factors, const float* skip_unless_finite,
                 float beta1, float one_minus_beta1, float beta2, float one_minus_beta2, float eps) {
  // Finite: |x| <= FLT_MAX (false for NaN and inf).
  if (skip_unless_finite != nullptr && !(fabsf(*skip_unless_finite) <= 3.402823466e+38f)) return;
  const int i = blockIdx.y;
  const int64_t n = b.n[i];
  float *p = b.p[i], *m = b.m[i], *v = b.v[i];
  const float* g = b.g[i];
  const float* f = factors == nullptr ? nullptr : factors + 3 * b.index[i];
  const float decay = f ? f[0] : b.decay[i], step_size = f ? f[1] : b.step_size[i];
  const float bias2_sqrt = f ? f[2] : b.bias2_sqrt[i];
  const float scale = grad_scale ? *grad_scale : 1.0f;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float ge = __fmul_rn(g[e], scale);  // exact where scale is 1
    const float me = __fadd_rn(__fmul_rn(m[e], beta1), __fmul_rn(ge, one_minus_beta1));
    const float ve = __fadd_rn(__fmul_rn(v[e], beta2), __fmul_rn(__fmul_rn(ge, ge), one_minus_beta2));
    const float denom = __fadd_rn(__fdiv_rn(sqrtf(ve), bias2_sqrt), eps);
    const float pe = __fmul_rn(p[e], decay);
    p[e] = __fadd_rn(pe, __fmul_rn(-step_size, __fdiv_rn(me, denom)));
    m[e] = me, v[e] = ve;
  }
}

}  // namespace

bool adamw_supported(const torch::Tensor& p, const torch::Tensor& g) {
  return p.scalar_type() == torch::kFloat && g.scalar_type() == torch::kFloat && p.is_contiguous() &&
         g.is_contiguous() && p.sizes() == g.sizes() && p.device() == g.device();
}

void adamw_update(const AdamWUpdate& t) {
  const size_t count = t.p.size(), factors = t.factors.defined() ? 0 : count;
  TORCH_CHECK(t.g.size() == count && t.m.size() == count && t.v.size() == count && t.decay.size() == factors &&
                  t.step_size.size() == factors && t.bias2_sqrt.size() == factors,
              "adamw_update: expects as many grads, moments and factors as parameters (", count, ")");
  if (count == 0) return;
  for (size_t i = 0; i < count; ++i)
    TORCH_CHECK(adamw_supported(t.p[i], t.g[i]) && adamw_supported(t.m[i], t.g[i]) &&
                    adamw_supported(t.v[i], t.g[i]) && t.p[i].device() == t.p[0].device(),
                "adamw_update: expects fp32 contiguous parameters, grads and moments of one shape on one device; "
                "tensor ",
                i, " is ", t.p[i].sizes(), " ", t.p[i].scalar_type(), " on ", t.p[i].device());
  TORCH_CHECK(!t.grad_scale.defined() || (t.grad_scale.scalar_type() == torch::kFloat &&
                                          t.grad_scale.numel() == 1 && t.grad_scale.device() == t.p[0].device()),
              "adamw_update: expects grad_scale to be one fp32 number on the parameters' device");
  TORCH_CHECK(!t.factors.defined() ||
                  (t.factors.scalar_type() == torch::kFloat && t.factors.sizes() == torch::IntArrayRef({int64_t(count), 3}) &&
                   t.factors.is_contiguous() && t.factors.device() == t.p[0].device()),
              "adamw_update: expects factors [", count, ", 3] fp32 contiguous on the parameters' device");
  TORCH_CHECK(!t.skip_unless_finite.defined() ||
                  (t.skip_unless_finite.scalar_type() == torch::kFloat && t.skip_unless_finite.numel() == 1 &&
                   t.skip_unless_finite.device() == t.p[0].device()),
              "adamw_update: expects skip_unless_finite to be one fp32 number on the parameters' device");
  const c10::cuda::CUDAGuard guard(t.p[0].device());
  const float* grad_scale = t.grad_scale.defined() ? t.grad_scale.data_ptr<float>() : nullptr;
  const float* factor_rows = t.factors.defined() ? t.factors.data_ptr<float>() : nullptr;
  const float* skip = t.skip_unless_finite.defined() ? t.skip_unless_finite.data_ptr<float>() : nullptr;
  // Largest first, so that a launch's tensors are of like sizes and its grid fits them all.
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.p[a].numel() > t.p[b].numel(); });
  for (size_t from = 0; from < count; from += kMaxTensors) {
    const size_t k = std::min<size_t>(kMaxTensors, count - from);
    TensorBatch b{};
    int64_t largest = 0;
    for (size_t j = 0; j < k; ++j) {
      const size_t i = order[from + j];
      b.p[j] = t.p[i].data_ptr<float>(), b.g[j] = t.g[i].data_ptr<float>();
      b.m[j] = t.m[i].data_ptr<float>(), b.v[j] = t.v[i].data_ptr<float>();
      b.n[j] = t.p[i].numel(), largest = std::max(largest, b.n[j]);
      b.index[j] = static_cast<int>(i);
      if (!factor_rows) {
        b.decay[j] = static_cast<float>(t.decay[i]), b.step_size[j] = static_cast<float>(t.step_size[i]);
        b.bias2_sqrt[j] = static_cast<float>(t.bias2_sqrt[i]);
      }
    }
    if (largest == 0) continue;
    const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((largest + kThreads - 1) / kThreads, 1, kMaxBlocks));
    launch(adamw_kernel, dim3(blocks, static_cast<unsigned>(k)), kThreads, 0, b, grad_scale, factor_rows, skip,
           static_cast<float>(t.beta1), static_cast<float>(1.0 - t.beta1), static_cast<float>(t.beta2),
           static_cast<float>(1.0 - t.beta2), static_cast<float>(t.eps));
  }
}

}  // namespace linearize::ops::cuda_kernels
