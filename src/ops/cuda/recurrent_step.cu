// The fused recurrent decode step (see recurrent_step.h for the math and shapes).
//
// One thread block per (batch, head); each thread owns columns j of the state (the value dimension),
// so every read and write of S is coalesced across the block. q, k and the per-channel decay sit in
// shared memory (3 K floats). The delta rule reads its column twice (prediction S'^T k, then update); the
// second read hits L2. Decode is bound by moving the state once in and once out. S_new may be S (in place):
// each thread reads every entry of its columns before it writes it.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <tuple>

#include "ops/cuda/recurrent_step.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/shared_memory.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

// gate_mode: 0 none, 1 fixed [H], 2 scalar [B,Hkv], 3 vector [B,Hkv,K], 4 vector logits [B,Hkv,K] in T (g_logits,
// log decay log_sigmoid(x) / logit_scale); k, v (and those gates) have Hkv = H / groups heads, query head h
// reading head h / groups.
// q, k, v: each batch row's heads contiguous ([H, K] or [Hkv, K], [Hkv, V]), the rows q_row, k_row, v_row
// elements apart (a packed product's slices at batch > 1).
template <typename T>
__global__ void recurrent_step_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                      int64_t q_row, int64_t k_row, int64_t v_row, const float* __restrict__ g,
                                      const T* __restrict__ g_logits, float logit_scale, int gate_mode,
                                      const float* __restrict__ beta, const T* __restrict__ beta_logits,
                                      int64_t beta_row, float beta_scale, float l2_eps, const float* S, float* S_new,
                                      T* __restrict__ o, int H, int groups, int K, int V, float scale) {
  LINEARIZE_DYNAMIC_SHARED(float, shared);
  float* qs = shared;          // [K] q
  float* ks = shared + K;      // [K] k
  float* decay = shared + 2 * K;  // [K] exp(g)
  const int bh = blockIdx.x, b = bh / H, h = bh % H;
  const int kvh = b * (H / groups) + h / groups;  // (b, h / groups) in [B, Hkv]
  const T* qb = q + b * q_row + static_cast<int64_t>(h) * K;
  const T* kb = k + b * k_row + static_cast<int64_t>(h / groups) * K;
  const T* vb = v + b * v_row + static_cast<int64_t>(h / groups) * V;
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    qs[i] = static_cast<float>(qb[i]);
    ks[i] = static_cast<float>(kb[i]);
    float lg = 0.f;
    if (gate_mode == 1) lg = g[h];
    else if (gate_mode == 2) lg = g[kvh];
    else if (gate_mode == 3) lg = g[kvh * K + i];
    else if (gate_mode == 4) {  // log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), as libtorch computes it
      const float x = static_cast<float>(g_logits[kvh * K + i]);
      lg = (fminf(x, 0.f) - log1pf(expf(-fabsf(x)))) / logit_scale;
    }
    decay[i] = __expf(lg);
  }
  __syncthreads();
  // The factors q and k are read with: scale, and with l2_eps > 0 their L2 norms (x rsqrt(|x|^2 + eps), as
  // ops::l2_norm), which every thread sums from shared memory (K is at most a few hundred).
  float qf = scale, kf = 1.f;
  if (l2_eps > 0.f) {
    float sq = 0.f, sk = 0.f;
    for (int i = 0; i < K; ++i) sq += qs[i] * qs[i], sk += ks[i] * ks[i];
    qf *= rsqrtf(sq + l2_eps), kf = rsqrtf(sk + l2_eps);
  }
  // beta given, or beta_scale sigmoid(x) of its logits (a row of H every beta_row elements)
  const bool has_beta = beta != nullptr || beta_logits != nullptr;
  float b_t = 0.f;
  if (beta != nullptr) b_t = beta[bh];
  else if (beta_logits != nullptr) b_t = beta_scale / (1.f + expf(-static_cast<float>(beta_logits[b * beta_row + h])));
  const float* Sb = S + static_cast<size_t>(bh) * K * V;
  float* Nb = S_new + static_cast<size_t>(bh) * K * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float u = static_cast<float>(vb[j]);
    if (has_beta) {
      float pred = 0.f;  // (S'^T k)_j
      for (int i = 0; i < K; ++i) pred += decay[i] * Sb[i * V + j] * ks[i];
      u = b_t * (u - pred * kf);
    }
    float out = 0.f;
    for (int i = 0; i < K; ++i) {
      const float s = decay[i] * Sb[i * V + j] + ks[i] * kf * u;
      Nb[i * V + j] = s;
      out += qs[i] * s;
    }
    out *= qf;
    o[bh * V + j] = static_cast<T>(out);
  }
}

// t [B, heads, D] as the kernel reads it: each batch row's heads contiguous, the rows anywhere (returned
// with the distance between rows); otherwise a contiguous copy.
std::pair<torch::Tensor, int64_t> rows_of(const torch::Tensor& t) {
  const bool rows = (t.size(2) <= 1 || t.stride(2) == 1) && (t.size(1) <= 1 || t.stride(1) == t.size(2));
  const auto r = rows ? t : t.contiguous();
  return {r, r.size(0) <= 1 ? r.size(1) * r.size(2) : r.stride(0)};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> recurrent_step(const torch::Tensor& q, const torch::Tensor& k,
                                                       const torch::Tensor& v, const torch::Tensor& g,
                                                       const torch::Tensor& beta, const torch::Tensor& S,
                                                       double scale, int64_t groups, bool in_place,
                                                       double gate_logits, double beta_logit_scale, double l2_eps) {
  const int64_t B = q.size(0), H = q.size(1), K = q.size(2), V = v.size(2);
  TORCH_CHECK(groups >= 1 && H % groups == 0 && k.size(1) * groups == H && v.size(1) * groups == H,
              "recurrent step: expects k and v with H / groups heads; got q ", q.sizes(), ", k ", k.sizes(), ", v ",
              v.sizes(), " and groups ", groups);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto vr = rows_of(v), qr = rows_of(q.to(v.scalar_type())), kr = rows_of(k.to(v.scalar_type()));
  const auto &vc = vr.first, &qc = qr.first, &kc = kr.first;
  const int64_t v_row = vr.second, q_row = qr.second, k_row = kr.second;
  auto Sc = S.to(torch::kFloat).contiguous();
  int gate_mode = 0;
  torch::Tensor gc, logits;
  if (gate_logits > 0) {
    TORCH_CHECK(g.defined() && g.dim() == 3, "recurrent step: gate logits need g [B,H,K]; got ",
                g.defined() ? g.sizes() : torch::IntArrayRef{});
    logits = g.to(vc.scalar_type()).contiguous();  // in the step's dtype: no cast where the layer made them so
    gate_mode = 4;
  } else if (g.defined()) {
    gc = g.to(torch::kFloat).contiguous();
    gate_mode = g.dim() == 1 ? 1 : g.dim() == 2 ? 2 : 3;
  }
  torch::Tensor bc, blc;  // beta in fp32, or its logits in the step's dtype (read in place where they allow)
  int64_t beta_row = 0;
  if (beta.defined() && beta_logit_scale > 0) {
    TORCH_CHECK(beta.dim() == 2 && beta.size(0) == B && beta.size(1) == H,
                "recurrent step: beta logits need [B,H]; got ", beta.sizes());
    std::tie(blc, beta_row) = rows_of(beta.to(vc.scalar_type()).unsqueeze(-1));
  } else if (beta.defined()) {
    bc = beta.to(torch::kFloat).contiguous();
  }
  auto S_new = in_place && Sc.is_same(S) ? Sc : torch::empty_like(Sc);
  auto o = torch::empty({B, H, V}, vc.options());
  const int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (V + 31) / 32 * 32)));
  const size_t smem = 3 * K * sizeof(float);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, vc.scalar_type(), "recurrent_step", [&] {
    launch(recurrent_step_kernel<scalar_t>, static_cast<unsigned>(B * H), threads, smem, qc.data_ptr<scalar_t>(),
           kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), q_row, k_row, v_row, ptr_or_null(gc),
           logits.defined() ? logits.data_ptr<scalar_t>() : nullptr, static_cast<float>(gate_logits), gate_mode,
           ptr_or_null(bc), blc.defined() ? blc.data_ptr<scalar_t>() : nullptr, beta_row,
           static_cast<float>(beta_logit_scale), static_cast<float>(l2_eps), Sc.data_ptr<float>(),
           S_new.data_ptr<float>(), o.data_ptr<scalar_t>(), static_cast<int>(H), static_cast<int>(groups),
           static_cast<int>(K), static_cast<int>(V), static_cast<float>(scale));
  });
  return {o, S_new};
}

}  // namespace linearize::ops::cuda_kernels
