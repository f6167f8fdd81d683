// The SwiGLU product of the Llama MLP, z = silu(gate) ⊙ up, element by element in one kernel each way (see
// swiglu.h for the contract), rounded as the libtorch formula `torch::silu(gate) * up` rounds it:
//   a = round(silu(gate)),   z = round(a up)
// and backward, given dz:
//   du = round(dz a),   dgate = round(round(dz up) silu'(gate)),   silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
// with round() to the tensors' dtype and fp32 inside. The formula takes two launches forward (silu, the
// product) and three backward (the product's two gradients, silu's backward), each a pass over the
// [rows, intermediate] tensors, and keeps silu(gate) for the backward besides gate and up; this keeps
// gate and up only. Threads take 16 bytes of each tensor at a time where every pointer allows it.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/swiglu.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // then each thread walks several words

template <typename E, int V>
__device__ __forceinline__ Word<E, V> load_word(const E* p, int64_t i) {
  return reinterpret_cast<const Word<E, V>*>(p)[i];
}

// z = round(round(silu(g)) u) for one word of each.
template <typename E, int V>
__device__ __forceinline__ Word<E, V> swiglu_word(const Word<E, V>& g, const Word<E, V>& u) {
  Word<E, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float v = static_cast<float>(g.x[j]);
    const float a = static_cast<float>(static_cast<E>(v * sigmoid_of(v)));
    out.x[j] = static_cast<E>(a * static_cast<float>(u.x[j]));
  }
  return out;
}

// gate, up [n] (E) -> z [n] (E), V elements a thread at a time.
template <typename E, int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const E* __restrict__ gate, const E* __restrict__ up, E* __restrict__ z, int64_t words) {
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * kThreads)
    reinterpret_cast<Word<E, V>*>(z)[w] = swiglu_word<E, V>(load_word<E, V>(gate, w), load_word<E, V>(up, w));
}

// gate, up, dz [n] (E) -> dgate, dup [n] (E).
template <typename E, int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const E* __restrict__ gate, const E* __restrict__ up, const E* __restrict__ dz,
                           E* __restrict__ dgate, E* __restrict__ dup, int64_t words) {
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * kThreads) {
    const Word<E, V> g = load_word<E, V>(gate, w), u = load_word<E, V>(up, w), d = load_word<E, V>(dz, w);
    Word<E, V> dg, du;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = static_cast<float>(g.x[j]), s = sigmoid_of(v), dzj = static_cast<float>(d.x[j]);
      const float a = static_cast<float>(static_cast<E>(v * s));
      du.x[j] = static_cast<E>(dzj * a);
      const float da = static_cast<float>(static_cast<E>(dzj * static_cast<float>(u.x[j])));
      dg.x[j] = static_cast<E>(da * silu_slope(v, s));
    }
    reinterpret_cast<Word<E, V>*>(dgate)[w] = dg;
    reinterpret_cast<Word<E, V>*>(dup)[w] = du;
  }
}

// gate, up: rows of I elements, row r at r * gate_row (up_row) -> z [rows, I] contiguous, V elements a thread at a
// time (a packed product's halves: the MLP's gate and up side by side in each row).
template <typename E, int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_rows_forward_kernel(const E* __restrict__ gate, const E* __restrict__ up, E* __restrict__ z,
                               int64_t gate_row, int64_t up_row, int64_t row_words, int64_t words) {
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = w / row_words, c = w % row_words;
    reinterpret_cast<Word<E, V>*>(z)[w] =
        swiglu_word<E, V>(load_word<E, V>(gate + r * gate_row, c), load_word<E, V>(up + r * up_row, c));
  }
}

unsigned blocks_for(int64_t words) {
  return static_cast<unsigned>(std::clamp<int64_t>((words + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

void check_same(const torch::Tensor& ref, const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.sizes() == ref.sizes() && t.scalar_type() == ref.scalar_type() && t.is_contiguous() &&
                  t.device() == ref.device(),
              "swiglu: expects ", name, " ", ref.sizes(), " ", ref.scalar_type(), " contiguous on ", ref.device(),
              "; got ", t.sizes(), " ", t.scalar_type(), " on ", t.device());
}

void check_gate(const torch::Tensor& gate) {
  TORCH_CHECK(gate.is_contiguous() && swiglu_supported(gate.scalar_type()),
              "swiglu: expects the gate contiguous, fp32, bf16 or fp16; got ", gate.sizes(), " ", gate.scalar_type());
}

}  // namespace

bool swiglu_supported(torch::ScalarType dtype) { return float_type(dtype); }

int64_t swiglu_row_stride(const torch::Tensor& t) {
  if (t.dim() < 1 || t.numel() == 0) return -1;
  const int64_t I = t.size(-1);
  if (I > 1 && t.stride(-1) != 1) return -1;
  // The leading dimensions fold into one of rows: each (of more than one entry) its next one's size times stride.
  int64_t row = -1, next = -1;  // next: the stride the next outer dimension must have
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (next >= 0 && t.stride(i) != next) return -1;
    if (row < 0) row = t.stride(i);
    next = t.stride(i) * t.size(i);
  }
  if (row < 0) row = I;  // a single row
  return row >= I ? row : -1;
}

torch::Tensor swiglu_rows_forward(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(swiglu_supported(gate.scalar_type()) && up.scalar_type() == gate.scalar_type() &&
                  up.sizes() == gate.sizes() && up.device() == gate.device(),
              "swiglu: expects gate and up of one shape and dtype (fp32, bf16 or fp16) on one device; got ",
              gate.sizes(), " ", gate.scalar_type(), " and ", up.sizes(), " ", up.scalar_type());
  const int64_t gate_row = swiglu_row_stride(gate), up_row = swiglu_row_stride(up);
  TORCH_CHECK(gate_row >= 0 && up_row >= 0, "swiglu: expects gate and up as rows of contiguous elements; got strides ",
              gate.strides(), " and ", up.strides());
  const c10::cuda::CUDAGuard guard(gate.device());
  auto z = torch::empty(gate.sizes(), gate.options());
  const int64_t n = gate.numel(), I = gate.size(-1);
  if (n == 0) return z;
  // 16 bytes at a time where every row starts on a 16-byte boundary: the pointers, the row strides and I.
  const int64_t per_word = 16 / static_cast<int64_t>(c10::elementSize(gate.scalar_type()));
  const bool wide = wide_words(I, gate.scalar_type(), {&gate, &up, &z}) && gate_row % per_word == 0 &&
                    up_row % per_word == 0;
  dispatch_words(gate.scalar_type(), wide, [&](auto e, auto v) {
    using E = decltype(e);
    constexpr int V = decltype(v)::value;
    launch(swiglu_rows_forward_kernel<E, V>, blocks_for(n / V), kThreads, 0, data_as<E>(gate), data_as<E>(up),
           data_as<E>(z), gate_row, up_row, I / V, n / V);
  });
  return z;
}

torch::Tensor swiglu_forward(const torch::Tensor& gate, const torch::Tensor& up) {
  check_gate(gate);
  check_same(gate, up, "up");
  const c10::cuda::CUDAGuard guard(gate.device());
  auto z = torch::empty_like(gate);
  const int64_t n = gate.numel();
  if (n == 0) return z;
  dispatch_words(gate.scalar_type(), wide_words(n, gate.scalar_type(), {&gate, &up, &z}), [&](auto e, auto v) {
    using E = decltype(e);
    constexpr int V = decltype(v)::value;
    launch(swiglu_forward_kernel<E, V>, blocks_for(n / V), kThreads, 0, data_as<E>(gate), data_as<E>(up),
           data_as<E>(z), n / V);
  });
  return z;
}

SwigluGrads swiglu_backward(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& dz) {
  check_gate(gate);
  check_same(gate, up, "up");
  check_same(gate, dz, "dz");
  const c10::cuda::CUDAGuard guard(gate.device());
  SwigluGrads out{torch::empty_like(gate), torch::empty_like(up)};
  const int64_t n = gate.numel();
  if (n == 0) return out;
  const bool wide = wide_words(n, gate.scalar_type(), {&gate, &up, &dz, &out.dgate, &out.dup});
  dispatch_words(gate.scalar_type(), wide, [&](auto e, auto v) {
    using E = decltype(e);
    constexpr int V = decltype(v)::value;
    launch(swiglu_backward_kernel<E, V>, blocks_for(n / V), kThreads, 0, data_as<E>(gate), data_as<E>(up),
           data_as<E>(dz), data_as<E>(out.dgate), data_as<E>(out.dup), n / V);
  });
  return out;
}

}  // namespace linearize::ops::cuda_kernels
