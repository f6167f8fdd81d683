// Family B with no decay or a scalar decay per step (DeltaNet, Gated DeltaNet): the chunk-to-chunk walk
// of the chunked form and everything that reads the state, fused. One thread block per (batch, head)
// walks the chunks of 64 with the state in shared memory, every product on tensor cores (the building
// blocks of chunk_tiles.cuh). The chunk-parallel part, the UT transform that gives W and U, is
// ut_transform.cu; these kernels take over from W and U on.
//
// Per chunk, with G the chunk-local cumulative log decay (fp32), Gl = G[C-1] and S the state entering:
//   V'  = U - W S                                   (the chunk's corrected values; W carries e^G)
//   A   = scale (q k^T) ⊙ exp(G_i - G_j) for j <= i, 0 above
//   o   = (scale e^G ⊙ q) S + A V'
//   S'  = e^Gl S + (e^{Gl - G} ⊙ k)^T V'
// The forward also writes S for every chunk (16-bit, as the products read it). The backward walks the
// chunks in reverse with dS' (the gradient of the state leaving the chunk) and recomputes V' from the
// stored S:
//   dA  = (do V'^T) ⊙ scale exp(G_i - G_j) (masked)
//   dq  = (scale e^G ⊙ do) S^T + dA k
//   dk  = dA^T q + (e^{Gl - G} ⊙ V') dS'^T
//   dV' = A^T do + (e^{Gl - G} ⊙ k) dS';    du = dV',   dw = -dV' S^T
//   dS  = e^Gl dS' + (scale e^G ⊙ q)^T do - W^T dV'
// The state stays in fp32 (its master copy) and is read by the products through a 16-bit copy. The
// decay's gradient is left to the caller (ops/delta_rule_ops/fused_chunk.cpp), from the row sums q·dq,
// k·dk and w·dw the backward takes in fp32. Head size 64 only (SmolLM2's heads): at 128 the backward's
// shared memory would not fit.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kHead = 64;  // K = V

// Shared memory. 16-bit rows are padded by 8 elements and fp32 rows by 4 (as in chunk_scalar_decay.cu).
// The staging areas hold fp32 [C, D] results or raw [C, C] scores (C = D = 64: one row stride ld32).
struct Pads : Pads64 {
  static constexpr int ldc = ld;                                        // 16-bit [C, C] scores
  static constexpr size_t state32 = mat32, scores16 = rows16, stage32 = mat32;
  static constexpr size_t gates = 3 * kC * 4;                          // G, e^G, e^{Gl - G}
};

// Forward: q, k, w, u rows; the state (fp32 and its 16-bit copy); A; two staging areas (w S and the
// raw scores, then o); gates. About 106 KiB: two blocks per SM.
struct ForwardLayout : Pads {
  static constexpr size_t q = 0, k = q + rows16, w = k + rows16, u = w + rows16;
  static constexpr size_t state = u + rows16, state16 = state + state32, scores = state16 + rows16;
  static constexpr size_t stage = scores + scores16, raw = stage + stage32, gate = raw + stage32;
  static constexpr size_t bytes = gate + gates;
};

// Backward: q, k, w, u (then V', then -dV'), do (scaled for dq, then read again); the stored state S;
// dS' (fp32 and 16-bit); dA then A (one at a time); one staging area; gates. About 107 KiB: two blocks
// per SM.
struct BackwardLayout : Pads {
  static constexpr size_t q = 0, k = q + rows16, w = k + rows16, u = w + rows16, dout = u + rows16;
  static constexpr size_t state16 = dout + rows16, dstate = state16 + rows16, dstate16 = dstate + state32;
  static constexpr size_t scores = dstate16 + rows16, stage = scores + scores16, gate = stage + stage32;
  static constexpr size_t bytes = gate + gates;
};

struct Shape {
  int B, T, H, N;  // N chunks: the rows of w and u per head are N * C (zero past T)
  float scale;
};

// Where one block's rows lie: q, k, o, do, dq, dk in [B, T, H, 64] (row stride H * 64); w, u, dw, du in
// [B*H, N*C, 64]; states in [B*H, N, 64, 64]; gates and row sums in [B*H, T] (w·dw: [B*H, N*C]).
struct Rows {
  size_t head, row, chunked, state, steps;
  int bh, Tp;
  __device__ explicit Rows(const Shape& p) {
    bh = blockIdx.x;
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

template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    delta_forward_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ w,
                         const E* __restrict__ u, const float* __restrict__ g, const float* __restrict__ h0,
                         E* __restrict__ o, float* __restrict__ final_state, E* __restrict__ states, Shape p) {
  using L = ForwardLayout;
  constexpr int D = kHead;
  extern __shared__ __align__(128) unsigned char smem[];
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sw = view<E>(smem, L::w), *su = view<E>(smem, L::u);
  E *S16 = view<E>(smem, L::state16), *A16 = view<E>(smem, L::scores);
  float *S = view<float>(smem, L::state), *stage = view<float>(smem, L::stage), *raw = view<float>(smem, L::raw);
  float *G = view<float>(smem, L::gate), *eG = G + kC, *eEnd = G + 2 * kC;
  const Rows rows(p);
  const int warp = threadIdx.x / 32;
  const float* gh = g != nullptr ? g + rows.steps : nullptr;

  load_state<D, D>(S, L::ld32, h0 != nullptr ? h0 + rows.state : nullptr);
  __syncthreads();
  copy_state<D, D>(S16, L::ld, S, L::ld32);
  RowPrefetch<D, E> nq, nk, nw, nu;
  auto fetch = [&](int t0) {
    nq.fetch(q + rows.head, rows.row, t0, p.T), nk.fetch(k + rows.head, rows.row, t0, p.T);
    nw.fetch(w + rows.chunked, D, t0, rows.Tp), nu.fetch(u + rows.chunked, D, t0, rows.Tp);
    return fetch_gates(gh, t0, p.T);
  };
  float2 ng = fetch(0);
  for (int n = 0; n < p.N; ++n) {
    const int t0 = n * kC;
    nq.put(sq, L::ld), nk.put(sk, L::ld), nw.put(sw, L::ld), nu.put(su, L::ld);
    chunk_gates(G, ng);
    if (n + 1 < p.N) ng = fetch(t0 + kC);  // in flight while this chunk is computed
    __syncthreads();
    store_state16<D, D>(states + rows.stored_state(n, p.N), S16, L::ld);
    // w S (the state's share of every row's write) and the raw scores q k^T, side by side.
    constexpr int kWS = kRowTiles * (D / 16);
    for (int t = warp; t < kWS + kLowerTiles; t += kWarps) {
      if (t >= kWS) {
        score_tile<D>(raw, L::ld32, sq, sk, L::ld, t - kWS);
        continue;
      }
      const int R = t / (D / 16), Cc = t % (D / 16);
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
      product_tile<false, false>(acc, sw, L::ld, S16, L::ld, R, Cc, 0, D / 16);
      wmma::store_matrix_sync(stage + R * 16 * L::ld32 + Cc * 16, acc, L::ld32, wmma::mem_row_major);
    }
    __syncthreads();
    subtract_rows<D, true>(su, L::ld, stage, L::ld32);  // su = V' = u - w S
    decay_mask(A16, L::ldc, raw, L::ld32, G, p.scale);
    scale_rows<D>(sq, L::ld, eG, p.scale);
    scale_rows<D>(sk, L::ld, eEnd, 1.f);
    __syncthreads();
    // o = (scale e^G q) S + A V', then the state update (fp32 master only).
    tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<false, false>(acc, sq, L::ld, S16, L::ld, R, Cc, 0, D / 16);
      product_tile<false, false>(acc, A16, L::ldc, su, L::ld, R, Cc, 0, R + 1);
    });
    update_state<D, D>(S, L::ld32, eG[kC - 1], sk, L::ld, su, L::ld);
    __syncthreads();
    store_rows<D>(o + rows.head, rows.row, t0, p.T, stage, L::ld32);
    copy_state<D, D>(S16, L::ld, S, L::ld32);
  }
  store_state<D, D>(final_state + rows.state, S, L::ld32);
}

// One reverse walk gives dq, dk, dw, du and dS0; with a gate also the row sums q·dq, k·dk [B*H, T] and
// w·dw [B*H, N*C] (fp32, taken before the gradients are rounded). The results go through one staging
// area one after another, and dA and A share their buffer, so that two blocks fit on an SM.
template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    delta_backward_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ w,
                          const E* __restrict__ u, const float* __restrict__ g, const E* __restrict__ states,
                          const E* __restrict__ dout, const float* __restrict__ d_final, E* __restrict__ dq,
                          E* __restrict__ dk, E* __restrict__ dw, E* __restrict__ du, float* __restrict__ d_initial,
                          float* __restrict__ dot_q, float* __restrict__ dot_k, float* __restrict__ dot_w, Shape p) {
  using L = BackwardLayout;
  constexpr int D = kHead;
  extern __shared__ __align__(128) unsigned char smem[];
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sw = view<E>(smem, L::w), *su = view<E>(smem, L::u);
  E *sdo = view<E>(smem, L::dout), *sS = view<E>(smem, L::state16), *dS16 = view<E>(smem, L::dstate16);
  E* A16 = view<E>(smem, L::scores);  // dA first, then A
  float *dS = view<float>(smem, L::dstate), *stage = view<float>(smem, L::stage);
  float *G = view<float>(smem, L::gate), *eG = G + kC, *eEnd = G + 2 * kC;
  const Rows rows(p);
  const float* gh = g != nullptr ? g + rows.steps : nullptr;
  float* dots_q = dot_q != nullptr ? dot_q + rows.steps : nullptr;
  float* dots_k = dot_k != nullptr ? dot_k + rows.steps : nullptr;
  float* dots_w = dot_w != nullptr ? dot_w + static_cast<size_t>(rows.bh) * rows.Tp : nullptr;

  load_state<D, D>(dS, L::ld32, d_final != nullptr ? d_final + rows.state : nullptr);
  __syncthreads();
  copy_state<D, D>(dS16, L::ld, dS, L::ld32);
  RowPrefetch<D, E> nq, nk, nw, nu, ndo, nS;
  auto fetch = [&](int n) {
    const int t0 = n * kC;
    nq.fetch(q + rows.head, rows.row, t0, p.T), nk.fetch(k + rows.head, rows.row, t0, p.T);
    nw.fetch(w + rows.chunked, D, t0, rows.Tp), nu.fetch(u + rows.chunked, D, t0, rows.Tp);
    ndo.fetch(dout + rows.head, rows.row, t0, p.T), nS.fetch(states + rows.stored_state(n, p.N), D, 0, D);
    return fetch_gates(gh, t0, p.T);
  };
  float2 ng = fetch(p.N - 1);
  for (int n = p.N - 1; n >= 0; --n) {
    const int t0 = n * kC;
    nq.put(sq, L::ld), nk.put(sk, L::ld), nw.put(sw, L::ld), nu.put(su, L::ld), ndo.put(sdo, L::ld);
    nS.put(sS, L::ld);
    chunk_gates(G, ng);
    if (n > 0) ng = fetch(n - 1);  // in flight while this chunk is computed
    __syncthreads();
    // V' = u - w S, as the forward computed it.
    tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<false, false>(acc, sw, L::ld, sS, L::ld, R, Cc, 0, D / 16);
    });
    __syncthreads();
    subtract_rows<D, true>(su, L::ld, stage, L::ld32);
    __syncthreads();
    scores_into_stage<D>(stage, L::ld32, sdo, su, L::ld);  // raw do V'^T
    __syncthreads();
    decay_mask(A16, L::ldc, stage, L::ld32, G, p.scale);  // dA
    scale_rows<D>(sdo, L::ld, eG, p.scale);               // scale e^G do, for dq only
    scale_rows<D>(su, L::ld, eEnd, 1.f);                  // e^{Gl - G} V'
    __syncthreads();
    // dk = dA^T q + (e^{Gl-G} V') dS'^T.
    tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<true, false>(acc, A16, L::ldc, sq, L::ld, R, Cc, R, kRowTiles);
      product_tile<false, true>(acc, su, L::ld, dS16, L::ld, R, Cc, 0, D / 16);
    });
    __syncthreads();
    store_rows<D>(dk + rows.head, rows.row, t0, p.T, stage, L::ld32, sk, L::ld, dots_k);
    __syncthreads();
    // dq = (scale e^G do) S^T + dA k.
    tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<false, true>(acc, sdo, L::ld, sS, L::ld, R, Cc, 0, D / 16);
      product_tile<false, false>(acc, A16, L::ldc, sk, L::ld, R, Cc, 0, R + 1);
    });
    __syncthreads();
    store_rows<D>(dq + rows.head, rows.row, t0, p.T, stage, L::ld32, sq, L::ld, dots_q);
    __syncthreads();
    scores_into_stage<D>(stage, L::ld32, sq, sk, L::ld);  // raw q k^T
    __syncthreads();
    RowPrefetch<D, E> raw_do;  // do again, unscaled: rows of this chunk
    raw_do.fetch(dout + rows.head, rows.row, t0, p.T);
    decay_mask(A16, L::ldc, stage, L::ld32, G, p.scale);  // A, where dA was
    raw_do.put(sdo, L::ld);
    scale_rows<D>(sk, L::ld, eEnd, 1.f);
    scale_rows<D>(sq, L::ld, eG, p.scale);
    __syncthreads();
    // dV' = A^T do + (e^{Gl-G} k) dS'; du = dV', and -dV' (16-bit) where V' was.
    tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<true, false>(acc, A16, L::ldc, sdo, L::ld, R, Cc, R, kRowTiles);
      product_tile<false, false>(acc, sk, L::ld, dS16, L::ld, R, Cc, 0, D / 16);
    });
    __syncthreads();
    store_rows<D>(du + rows.chunked, D, t0, rows.Tp, stage, L::ld32);
    subtract_rows<D, false>(su, L::ld, stage, L::ld32);
    __syncthreads();
    // dw = -dV' S^T into the staging area; dS = e^Gl dS' + (scale e^G q)^T do + W^T (-dV').
    tiles_into_stage<D>(stage, L::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<false, true>(acc, su, L::ld, sS, L::ld, R, Cc, 0, D / 16);
    });
    accumulate_state<D, D>(dS, L::ld32, eG[kC - 1], [&](Acc& acc, int R, int Cc) {
      product_tile<true, false>(acc, sq, L::ld, sdo, L::ld, R, Cc, 0, kRowTiles);
      product_tile<true, false>(acc, sw, L::ld, su, L::ld, R, Cc, 0, kRowTiles);
    });
    __syncthreads();
    store_rows<D>(dw + rows.chunked, D, t0, rows.Tp, stage, L::ld32, sw, L::ld, dots_w);
    copy_state<D, D>(dS16, L::ld, dS, L::ld32);
    __syncthreads();  // the next chunk's rows replace w
  }
  if (d_initial != nullptr) store_state<D, D>(d_initial + rows.state, dS, L::ld32);
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
  if (p.T == 0) {
    out.final_state.copy_(h0.defined() ? h0 : torch::zeros_like(out.final_state));
    return out;
  }
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    auto kernel = delta_forward_kernel<E>;
    constexpr size_t smem = ForwardLayout::bytes;
    launch(kernel, static_cast<unsigned>(p.B * p.H), kThreads, smem,
        data_as<E>(q), data_as<E>(k), data_as<E>(w), data_as<E>(u), ptr_or_null(g), ptr_or_null(h0), data_as<E>(out.o),
        out.final_state.data_ptr<float>(), data_as<E>(out.states), p);
  });
  return out;
}

DeltaWalkGrads delta_walk_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                   const torch::Tensor& u, const torch::Tensor& g, const torch::Tensor& states,
                                   const torch::Tensor& d_out, const torch::Tensor& d_final, double scale,
                                   bool want_d_initial, bool want_row_dots) {
  const Shape p = shape_of(q, k, w, u, scale);
  TORCH_CHECK(d_out.sizes() == q.sizes() && d_out.scalar_type() == q.scalar_type(),
              "fused delta-rule walk: d_out must be [B,T,H,64] in q's dtype");
  const c10::cuda::CUDAGuard guard(q.device());
  DeltaWalkGrads out;
  out.dq = torch::empty_like(q);
  out.dk = torch::empty_like(k);
  out.dw = torch::empty_like(w);
  out.du = torch::empty_like(u);
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
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    auto kernel = delta_backward_kernel<E>;
    constexpr size_t smem = BackwardLayout::bytes;
    launch(kernel, static_cast<unsigned>(p.B * p.H), kThreads, smem,
        data_as<E>(q), data_as<E>(k), data_as<E>(w), data_as<E>(u), ptr_or_null(g), data_as<E>(states),
        data_as<E>(d_out), ptr_or_null(d_final), data_as<E>(out.dq), data_as<E>(out.dk), data_as<E>(out.dw),
        data_as<E>(out.du), out_or_null(out.d_initial), out_or_null(out.dot_q), out_or_null(out.dot_k),
        out_or_null(out.dot_w), p);
  });
  return out;
}

}  // namespace linearize::ops::cuda_kernels
