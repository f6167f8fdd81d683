// The delta rule with no decay or a scalar decay per step (DeltaNet, Gated DeltaNet): the chunk-to-chunk walk
// of the chunked form and everything that reads the state. The chunk-parallel UT transform that gives W
// and U is ut_transform.cu; these kernels take over from W and U on. Every product runs on tensor cores
// (the building blocks of chunk_tiles.cuh).
//
// Per chunk, with G the chunk-local cumulative log decay (fp32), Gl = G[C-1] and S the state entering:
//   V'  = U - W S                                   (the chunk's corrected values; W carries e^G)
//   A   = scale (q k^T) ⊙ exp(G_i - G_j) for j <= i, 0 above
//   o   = (scale e^G ⊙ q) S + A V'
//   S'  = e^Gl S + (e^{Gl - G} ⊙ k)^T V'
// (where a row factor e^G or e^{Gl - G} scales the rows of a product, the kernels apply it to the fp32
// accumulator, not to the 16-bit operand). Only V' and S' depend on the state before, so each direction is
// split in two kernels:
//   - a walk, one thread block per (batch, head) stepping through the chunks, that carries the state and
//     does only the products on that sequential path: W S and the update going forward (it stores S for
//     every chunk and V'), and going back
//       dV' = A^T do + (e^{Gl - G} ⊙ k) dS'
//       dS  = e^Gl dS' + (scale e^G ⊙ q)^T do - W^T dV'
//     (it stores dS', the gradient of the state leaving each chunk, and du = dV');
//   - a kernel with one block per (chunk, batch*head) for the rest, given the stored states:
//       A, o as above (it stores A for the backward walk)                                 (forward)
//       dw  = -dV' S^T,  dA = (do V'^T) ⊙ scale exp(G_i - G_j) (masked),
//       dk  = dA^T q + (e^{Gl - G} ⊙ V') dS'^T,   dq = (scale e^G ⊙ do) S^T + dA k      (backward)
// So the forward leaves S, V' and A of every chunk to the backward, which computes none of them again.
// The walks keep the state in fp32 registers (its master copy, RegisterState); products read it through a
// 16-bit copy in shared memory, which is also what the walks store. The decay's gradient is left to the caller
// (ops/delta_rule/fused_chunk.cpp), from the row sums q·dq, k·dk and w·dw the backward takes in fp32.
// Head size 64 only (SmolLM2's heads).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/chunk_delta_rule.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kHead = 64;  // K = V

// Shared memory, in the strides of Pads64: 16-bit [64, ld] rows (a chunk's rows, a 16-bit state or
// scores), fp32 [64, ld32] states and staging areas (fp32 results or raw scores).
struct Pads : Pads64 {
  static constexpr size_t gates = 3 * kC * 4;  // G, e^G, e^{Gl - G}
};

// Forward walk: k, w, u (then V'); the state's 16-bit copy; gates. About 37 KiB.
struct WalkForwardLayout : Pads {
  static constexpr size_t k = 0, w = k + rows16, u = w + rows16, state16 = u + rows16;
  static constexpr size_t gate = state16 + rows16, bytes = gate + gates;
};

// Output: q, k, V', the state entering (16-bit), A; one staging area (o); gates.
// About 63 KiB.
struct OutputLayout : Pads {
  static constexpr size_t q = 0, k = q + rows16, v = k + rows16, state16 = v + rows16, scores = state16 + rows16;
  static constexpr size_t stage = scores + rows16, gate = stage + mat32, bytes = gate + gates;
};

// Backward walk: q, k, w, do, -dV'; dS''s 16-bit copy; A (the forward's); gates. About 64 KiB.
struct WalkBackwardLayout : Pads {
  static constexpr size_t q = 0, k = q + rows16, w = k + rows16, dout = w + rows16, dv = dout + rows16;
  static constexpr size_t dstate16 = dv + rows16, scores = dstate16 + rows16;
  static constexpr size_t gate = scores + rows16, bytes = gate + gates;
};

// Gradients of the rows: q, k, w, V', do; S and dS' (16-bit); dV', then dA where it was; two staging
// areas (dw, then dk and dq side by side); gates. About 108 KiB: two blocks an SM.
struct RowGradsLayout : Pads {
  static constexpr size_t q = 0, k = q + rows16, w = k + rows16, v = w + rows16, dout = v + rows16;
  static constexpr size_t state16 = dout + rows16, dstate16 = state16 + rows16, scores = dstate16 + rows16;
  static constexpr size_t stage = scores + rows16, stage2 = stage + mat32, gate = stage2 + mat32;
  static constexpr size_t bytes = gate + gates;
};

struct Shape {
  int B, T, H, N;  // N chunks: the rows of w and u per head are N * C (zero past T)
  float scale;
};

// Where the rows of head bh = b H + h lie: q, k, o, do, dq, dk in [B, T, H, 64] (row stride H * 64); w,
// u, V', dw, du in [B*H, N*C, 64]; states, dS' and A in [B*H, N, 64, 64]; gates and row sums in [B*H, T]
// (w·dw: [B*H, N*C]).
struct Rows {
  size_t head, row, chunked, state, steps;
  int bh, Tp;
  __device__ Rows(const Shape& p, int bh_) {
    bh = bh_;
    const int b = bh / p.H, h = bh % p.H;
    row = static_cast<size_t>(p.H) * kHead;
    head = (static_cast<size_t>(b) * p.T * p.H + h) * kHead;
    Tp = p.N * kC;
    chunked = static_cast<size_t>(bh) * Tp * kHead;
    state = static_cast<size_t>(bh) * kHead * kHead;
    steps = static_cast<size_t>(bh) * p.T;
  }
  __device__ size_t stored_state(int n, int N) const { return (static_cast<size_t>(bh) * N + n) * kHead * kHead; }
};

// The forward walk, one block per (batch, head): for every chunk it stores the state entering (16-bit)
// and V' = U - W S, then updates S.
template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    delta_walk_forward_kernel(const E* __restrict__ k, const E* __restrict__ w, const E* __restrict__ u,
                              const float* __restrict__ g, const float* __restrict__ h0, E* __restrict__ values,
                              float* __restrict__ final_state, E* __restrict__ states, Shape p) {
  using L = WalkForwardLayout;
  constexpr int D = kHead;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sk = view<E>(smem, L::k), *sw = view<E>(smem, L::w), *su = view<E>(smem, L::u);
  E* S16 = view<E>(smem, L::state16);
  float *G = view<float>(smem, L::gate), *eG = G + kC, *eEnd = G + 2 * kC;
  const Rows rows(p, blockIdx.x);
  const float* gh = g != nullptr ? g + rows.steps : nullptr;

  RegisterState<D, D> S;
  S.load(h0 != nullptr ? h0 + rows.state : nullptr);
  S.copy16(S16, L::ld);
  RowPrefetch<D, E> nk, nw, nu;
  auto fetch = [&](int t0) {
    nk.fetch(k + rows.head, rows.row, t0, p.T);
    nw.fetch(w + rows.chunked, D, t0, rows.Tp), nu.fetch(u + rows.chunked, D, t0, rows.Tp);
    return fetch_gates(gh, t0, p.T);
  };
  float2 ng = fetch(0);
  for (int n = 0; n < p.N; ++n) {
    const int t0 = n * kC;
    nk.put(sk, L::ld), nw.put(sw, L::ld), nu.put(su, L::ld);
    chunk_gates(G, ng);
    if (n + 1 < p.N) ng = fetch(t0 + kC);  // in flight while this chunk is computed
    __syncthreads();
    store_state16<D, D>(states + rows.stored_state(n, p.N), S16, L::ld);
    scale_rows<D>(sk, L::ld, eEnd, 1.f);  // for the update; the product below reads no k
    each_tile<D>([&](int R, int Cc) {     // su = V' = u - w S, tile by tile in place
      Acc acc;
      zero(acc);
      product_tile<false, false>(acc, sw, L::ld, S16, L::ld, R, Cc, 0, D / 16);
      subtract_tile16(su + R * 16 * L::ld + Cc * 16, acc, L::ld);
    });
    __syncthreads();
    store_state16<kC, D>(values + rows.chunked + static_cast<size_t>(t0) * D, su, L::ld);
    S.update(eG[kC - 1], [&](Acc& acc, int R, int Cc) {  // S' = e^Gl S + (e^{Gl-G} k)^T V'
      product_tile<true, false>(acc, sk, L::ld, su, L::ld, R, Cc, 0, kC / 16);
    });
    S.copy16(S16, L::ld);  // every read of S16 this chunk lies before the last barrier
    __syncthreads();        // the next chunk's rows replace k and V'
  }
  S.store(final_state + rows.state);
}

// The output of chunk blockIdx.x of head blockIdx.y from the state entering it and its V'; it also stores
// the chunk's A. Three blocks fit on an SM.
template <typename E>
__global__ void __launch_bounds__(kThreads, 3)
    delta_output_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ values,
                        const float* __restrict__ g, const E* __restrict__ states, E* __restrict__ o,
                        E* __restrict__ scores, Shape p) {
  using L = OutputLayout;
  constexpr int D = kHead;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sv = view<E>(smem, L::v);
  E *S16 = view<E>(smem, L::state16), *A16 = view<E>(smem, L::scores);
  float *stage = view<float>(smem, L::stage), *G = view<float>(smem, L::gate), *eG = G + kC;
  const int n = blockIdx.x, t0 = n * kC;
  const Rows rows(p, blockIdx.y);
  {
    RowPrefetch<D, E> rq, rk, rv, rS;
    rq.fetch(q + rows.head, rows.row, t0, p.T), rk.fetch(k + rows.head, rows.row, t0, p.T);
    rv.fetch(values + rows.chunked, D, t0, rows.Tp), rS.fetch(states + rows.stored_state(n, p.N), D, 0, D);
    chunk_gates(G, fetch_gates(g != nullptr ? g + rows.steps : nullptr, t0, p.T));
    rq.put(sq, L::ld), rk.put(sk, L::ld), rv.put(sv, L::ld), rS.put(S16, L::ld);
  }
  __syncthreads();
  decayed_scores16<D>(A16, L::ld, sq, sk, L::ld, G, p.scale);
  __syncthreads();
  store_lower(scores + rows.stored_state(n, p.N), A16, L::ld);  // the backward walk reads these words only
  tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {  // o = scale e^G (q S) + A V'
    product_tile<false, false>(acc, sq, L::ld, S16, L::ld, R, Cc, 0, D / 16);
    scale_tile_rows(acc, eG, R, p.scale);
    product_tile<false, false>(acc, A16, L::ld, sv, L::ld, R, Cc, 0, R + 1);
  });
  __syncthreads();
  store_rows<D>(o + rows.head, rows.row, t0, p.T, stage, L::ld32);
}

// The backward walk, one block per (batch, head), chunks in reverse: for every chunk it stores dS' (the
// gradient of the state leaving it, 16-bit) and du = dV', then takes dS' back to dS.
template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    delta_walk_backward_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ w,
                               const E* __restrict__ scores, const float* __restrict__ g, const E* __restrict__ dout,
                               const float* __restrict__ d_final, E* __restrict__ du, E* __restrict__ dstates,
                               float* __restrict__ d_initial, Shape p) {
  using L = WalkBackwardLayout;
  constexpr int D = kHead;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sw = view<E>(smem, L::w), *sdo = view<E>(smem, L::dout);
  E *sdv = view<E>(smem, L::dv), *dS16 = view<E>(smem, L::dstate16), *A16 = view<E>(smem, L::scores);
  float *G = view<float>(smem, L::gate), *eG = G + kC, *eEnd = G + 2 * kC;
  const Rows rows(p, blockIdx.x);
  const float* gh = g != nullptr ? g + rows.steps : nullptr;

  RegisterState<D, D> dS;
  dS.load(d_final != nullptr ? d_final + rows.state : nullptr);
  dS.copy16(dS16, L::ld);
  RowPrefetch<D, E> nq, nk, nw, ndo;
  RowPrefetch<kC, E> nA;
  auto fetch = [&](int n) {
    const int t0 = n * kC;
    nq.fetch(q + rows.head, rows.row, t0, p.T), nk.fetch(k + rows.head, rows.row, t0, p.T);
    nw.fetch(w + rows.chunked, D, t0, rows.Tp), ndo.fetch(dout + rows.head, rows.row, t0, p.T);
    nA.fetch_lower(scores + rows.stored_state(n, p.N));
    return fetch_gates(gh, t0, p.T);
  };
  float2 ng = fetch(p.N - 1);
  for (int n = p.N - 1; n >= 0; --n) {
    const int t0 = n * kC;
    nq.put(sq, L::ld), nk.put(sk, L::ld), nw.put(sw, L::ld), ndo.put(sdo, L::ld), nA.put(A16, L::ld);
    chunk_gates(G, ng);
    if (n > 0) ng = fetch(n - 1);  // in flight while this chunk is computed
    __syncthreads();
    store_state16<D, D>(dstates + rows.stored_state(n, p.N), dS16, L::ld);
    scale_rows<D>(sq, L::ld, eG, p.scale);                               // for dS; the next product reads no q
    each_tile<D>([&](int R, int Cc) {  // dV' = A^T do + e^{Gl-G} (k dS'): du = dV' out, -dV' kept
      Acc acc;
      zero(acc);
      product_tile<false, false>(acc, sk, L::ld, dS16, L::ld, R, Cc, 0, D / 16);
      scale_tile_rows(acc, eEnd, R, 1.f);
      product_tile<true, false>(acc, A16, L::ld, sdo, L::ld, R, Cc, R, kRowTiles);
      store_tile16(du + rows.chunked + static_cast<size_t>(t0 + 16 * R) * D + 16 * Cc, acc, D);
      negate(acc);
      store_tile16(sdv + R * 16 * L::ld + Cc * 16, acc, L::ld);
    });
    __syncthreads();
    // dS = e^Gl dS' + (scale e^G q)^T do + W^T (-dV').
    dS.update(eG[kC - 1], [&](Acc& acc, int R, int Cc) {
      product_tile<true, false>(acc, sq, L::ld, sdo, L::ld, R, Cc, 0, kRowTiles);
      product_tile<true, false>(acc, sw, L::ld, sdv, L::ld, R, Cc, 0, kRowTiles);
    });
    dS.copy16(dS16, L::ld);  // every read of dS16 this chunk lies before the last barrier
    __syncthreads();          // the next chunk's rows replace q, w and do
  }
  if (d_initial != nullptr) dS.store(d_initial + rows.state);
}

// dq, dk and dw of chunk blockIdx.x of head blockIdx.y from the stored S, V', dS' and dV'; with a gate also
// the row sums q·dq, k·dk [B*H, T] and w·dw [B*H, N*C] (fp32, taken before the gradients are rounded).
// dw passes through one staging area, then dk and dq through two side by side. The row factors e^G and
// e^{Gl - G} scale the products' accumulators, not the 16-bit rows.
template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    delta_row_grads_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ w,
                           const E* __restrict__ values, const float* __restrict__ g, const E* __restrict__ states,
                           const E* __restrict__ dstates, const E* __restrict__ dout, const E* __restrict__ du,
                           E* __restrict__ dq, E* __restrict__ dk, E* __restrict__ dw, float* __restrict__ dot_q,
                           float* __restrict__ dot_k, float* __restrict__ dot_w, Shape p) {
  using L = RowGradsLayout;
  constexpr int D = kHead;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sw = view<E>(smem, L::w), *sv = view<E>(smem, L::v);
  E *sdo = view<E>(smem, L::dout), *sS = view<E>(smem, L::state16), *dS16 = view<E>(smem, L::dstate16);
  E* A16 = view<E>(smem, L::scores);  // dV' first, then dA
  float *stage = view<float>(smem, L::stage), *stage2 = view<float>(smem, L::stage2);
  float *G = view<float>(smem, L::gate), *eG = G + kC, *eEnd = G + 2 * kC;
  const int n = blockIdx.x, t0 = n * kC;
  const Rows rows(p, blockIdx.y);
  const bool dots = dot_q != nullptr;  // all three or none
  {
    RowPrefetch<D, E> rq, rk, rw, rv, rdo, rS, rdS, rdv;
    rq.fetch(q + rows.head, rows.row, t0, p.T), rk.fetch(k + rows.head, rows.row, t0, p.T);
    rw.fetch(w + rows.chunked, D, t0, rows.Tp), rv.fetch(values + rows.chunked, D, t0, rows.Tp);
    rdo.fetch(dout + rows.head, rows.row, t0, p.T), rdv.fetch(du + rows.chunked, D, t0, rows.Tp);
    rS.fetch(states + rows.stored_state(n, p.N), D, 0, D), rdS.fetch(dstates + rows.stored_state(n, p.N), D, 0, D);
    chunk_gates(G, fetch_gates(g != nullptr ? g + rows.steps : nullptr, t0, p.T));
    rq.put(sq, L::ld), rk.put(sk, L::ld), rw.put(sw, L::ld), rv.put(sv, L::ld), rdo.put(sdo, L::ld);
    rS.put(sS, L::ld), rdS.put(dS16, L::ld), rdv.put(A16, L::ld);
  }
  __syncthreads();
  tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {  // dw = -dV' S^T
    product_tile<false, true>(acc, A16, L::ld, sS, L::ld, R, Cc, 0, D / 16);
    negate(acc);
  });
  __syncthreads();
  store_rows<D>(dw + rows.chunked, D, t0, rows.Tp, stage, L::ld32, sw, L::ld,
                dots ? dot_w + static_cast<size_t>(rows.bh) * rows.Tp : nullptr);
  decayed_scores16<D>(A16, L::ld, sdo, sv, L::ld, G, p.scale);  // dA (dV' was last read before the barrier)
  __syncthreads();
  // dk = dA^T q + e^{Gl-G} (V' dS'^T) and dq = scale e^G (do S^T) + dA k side by side.
  two_tiles_into_stage<D>(
      stage, stage2, L::ld32,
      [&](Acc& acc, int R, int Cc) {
        product_tile<false, true>(acc, sv, L::ld, dS16, L::ld, R, Cc, 0, D / 16);
        scale_tile_rows(acc, eEnd, R, 1.f);
        product_tile<true, false>(acc, A16, L::ld, sq, L::ld, R, Cc, R, kRowTiles);
      },
      [&](Acc& acc, int R, int Cc) {
        product_tile<false, true>(acc, sdo, L::ld, sS, L::ld, R, Cc, 0, D / 16);
        scale_tile_rows(acc, eG, R, p.scale);
        product_tile<false, false>(acc, A16, L::ld, sk, L::ld, R, Cc, 0, R + 1);
      });
  __syncthreads();
  store_rows<D>(dk + rows.head, rows.row, t0, p.T, stage, L::ld32, sk, L::ld, dots ? dot_k + rows.steps : nullptr);
  store_rows<D>(dq + rows.head, rows.row, t0, p.T, stage2, L::ld32, sq, L::ld, dots ? dot_q + rows.steps : nullptr);
}

// Checks the shapes the kernels assume; returns the launch shape.
Shape shape_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w, const torch::Tensor& u,
               double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), N = (T + kC - 1) / kC;
  TORCH_CHECK(delta_walk_supported(q.size(3), u.size(3), q.scalar_type()),
              "fused delta-rule walk: expects head size 64 and bf16 or fp16; got K=", q.size(3), " V=", u.size(3),
              " ", q.scalar_type());
  TORCH_CHECK(k.sizes() == q.sizes() && w.sizes() == torch::IntArrayRef({B, H, N * kC, kHead}) &&
                  u.sizes() == w.sizes(),
              "fused delta-rule walk: expects q, k [B,T,H,64] and w, u [B,H,", N * kC, ",64]; got q ", q.sizes(),
              " k ", k.sizes(), " w ", w.sizes(), " u ", u.sizes());
  for (const auto* t : {&k, &w, &u})
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "fused delta-rule walk: q, k, w, u must share one dtype");
  return Shape{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<int>(N),
               static_cast<float>(scale)};
}

// One block per (chunk, batch*head).
dim3 chunk_grid(const Shape& p) { return dim3(static_cast<unsigned>(p.N), static_cast<unsigned>(p.B * p.H)); }

}  // namespace

bool delta_walk_supported(int64_t K, int64_t V, torch::ScalarType dt) {
  return K == kHead && V == kHead && (dt == torch::kBFloat16 || dt == torch::kHalf);
}

DeltaWalkForward delta_walk_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                    const torch::Tensor& u, const torch::Tensor& g, const torch::Tensor& h0,
                                    double scale) {
  const Shape p = shape_of(q, k, w, u, scale);
  const c10::cuda::CUDAGuard guard(q.device());
  DeltaWalkForward out;
  out.o = torch::empty_like(q);
  out.final_state = torch::empty({p.B, p.H, kHead, kHead}, q.options().dtype(torch::kFloat));
  out.states = torch::empty({p.B, p.H, p.N, kHead, kHead}, q.options());
  out.values = torch::empty_like(w);
  out.scores = torch::empty_like(out.states);
  if (p.T == 0) {
    out.final_state.copy_(h0.defined() ? h0 : torch::zeros_like(out.final_state));
    return out;
  }
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    launch(delta_walk_forward_kernel<E>, static_cast<unsigned>(p.B * p.H), kThreads, WalkForwardLayout::bytes,
        data_as<E>(k), data_as<E>(w), data_as<E>(u), ptr_or_null(g), ptr_or_null(h0), data_as<E>(out.values),
        out.final_state.data_ptr<float>(), data_as<E>(out.states), p);
    launch(delta_output_kernel<E>, chunk_grid(p), kThreads, OutputLayout::bytes,
        data_as<E>(q), data_as<E>(k), data_as<E>(out.values), ptr_or_null(g), data_as<E>(out.states), data_as<E>(out.o),
        data_as<E>(out.scores), p);
  });
  return out;
}

DeltaWalkGrads delta_walk_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                   const torch::Tensor& g, const DeltaWalkForward& forward, const torch::Tensor& d_out,
                                   const torch::Tensor& d_final, double scale, bool want_d_initial,
                                   bool want_row_dots) {
  const Shape p = shape_of(q, k, w, forward.values, scale);
  const std::vector<int64_t> squares = {p.B, p.H, p.N, kHead, kHead};
  for (const auto* t : {&forward.states, &forward.scores})
    TORCH_CHECK(t->sizes() == squares && t->scalar_type() == q.scalar_type() && t->is_contiguous(),
                "fused delta-rule walk: the forward's states and scores must be ", squares, " in q's dtype");
  TORCH_CHECK(d_out.sizes() == q.sizes() && d_out.scalar_type() == q.scalar_type(),
              "fused delta-rule walk: d_out must be [B,T,H,64] in q's dtype");
  const c10::cuda::CUDAGuard guard(q.device());
  DeltaWalkGrads out;
  out.dq = torch::empty_like(q);
  out.dk = torch::empty_like(k);
  out.dw = torch::empty_like(w);
  out.du = torch::empty_like(w);
  auto f32 = q.options().dtype(torch::kFloat);
  if (want_d_initial) out.d_initial = torch::empty({p.B, p.H, kHead, kHead}, f32);
  if (want_row_dots) {
    out.dot_q = torch::empty({p.B, p.H, p.T}, f32);
    out.dot_k = torch::empty({p.B, p.H, p.T}, f32);
    out.dot_w = torch::empty({p.B, p.H, p.N * kC}, f32);
  }
  if (p.T == 0) {
    if (want_d_initial) out.d_initial.copy_(d_final.defined() ? d_final : torch::zeros_like(out.d_initial));
    return out;
  }
  auto dstates = torch::empty_like(forward.states);  // dS' per chunk, from the walk to the row gradients
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    launch(delta_walk_backward_kernel<E>, static_cast<unsigned>(p.B * p.H), kThreads, WalkBackwardLayout::bytes,
        data_as<E>(q), data_as<E>(k), data_as<E>(w), data_as<E>(forward.scores), ptr_or_null(g), data_as<E>(d_out),
        ptr_or_null(d_final), data_as<E>(out.du), data_as<E>(dstates), out_or_null(out.d_initial), p);
    launch(delta_row_grads_kernel<E>, chunk_grid(p), kThreads, RowGradsLayout::bytes,
        data_as<E>(q), data_as<E>(k), data_as<E>(w), data_as<E>(forward.values), ptr_or_null(g),
        data_as<E>(forward.states), data_as<E>(dstates), data_as<E>(d_out), data_as<E>(out.du), data_as<E>(out.dq),
        data_as<E>(out.dk), data_as<E>(out.dw), out_or_null(out.dot_q), out_or_null(out.dot_k), out_or_null(out.dot_w),
        p);
  });
  return out;
}

}  // namespace linearize::ops::cuda_kernels
