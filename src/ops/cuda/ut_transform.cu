// The delta rule's UT transform per chunk of 64 (no decay or a scalar decay per step), forward and
// backward, one thread block per (chunk, batch*head), head size 64:
//   Kb = diag(beta) k,  Kg = diag(beta e^G) k,  Vb = diag(beta) v              (16-bit, as the products read them)
//   L[i,j] = beta_i (k_i · k_j) exp(G_i - G_j) for j < i, 0 on and above the diagonal
//                                     (fp32, from the accumulators of k k^T; the forward needs no Kb)
//   T = (I + L)^{-1}                  (fp32, by 16x16 blocks)
//   W = T Kg,  U = T Vb               (tensor cores, T read through a 16-bit copy)
// Backward, given dW and dU:
//   dKg = T^T dW,  dVb = T^T dU,  dT = dW Kg^T + dU Vb^T
//   dL = -T^T dT T^T (strictly lower; three TF32 tensor-core products, close to fp32: a difference of close terms)
//   R = dL ⊙ exp(G_i - G_j):  dKb = R k,  dk = R^T Kb + beta dKb + beta e^G dKg,  dv = beta dVb
//   dbeta = k·dKb + e^G k·dKg + v·dVb,   dG = beta e^G k·dKg + rowsum(dL ⊙ L) - colsum(dL ⊙ L)
//   dg = the reverse cumulative sum of dG within the chunk.
// The forward keeps T (fp32, on and below its diagonal) for the backward. G is the chunk-local cumulative
// log decay (zero without a gate); rows past T are zeros.
//
// With a decay per key channel (Kimi Delta Attention: Given = true) the decayed scores come from
// vector_decay_scores.cu instead, A[i,j] = Σ_d k_id k_jd exp(G_id - G_jd), and so do the rows e^G ⊙ k
// (called k below, with no gate of its own: G = 0 here). Then
//   L = strictly lower diag(beta) A,  Kg = diag(beta) k,  W = T Kg,  U = T Vb
// and the backward gives dA = diag(beta) dL (strictly lower), dk = beta dKg, dv = beta dVb and
// dbeta = rowsum(dL ⊙ A) + k·dKg + v·dVb.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/chunk_delta_rule.h"
#include "ops/cuda/ut_transform.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kD = 64;  // head size (K = V)

struct Sizes : Pads64 {
  static constexpr int ldc = ld;  // 16-bit [C, C] scores
};

// Forward: k, v, Kg, Vb (16-bit), L then T16, T (fp32), gates and beta. About 71 KiB: three blocks per SM.
struct ForwardSmem : Sizes {
  static constexpr size_t k = 0, v = k + rows16, kg = v + rows16, vb = kg + rows16;
  static constexpr size_t L = vb + rows16, T16 = L, T = L + mat32, gate = T + mat32;
  static constexpr size_t beta = gate + 3 * vec, bytes = beta + vec;
  static_assert(3 * (bytes + 1024) <= 228 * 1024, "three blocks per SM");
};

// Backward: k, v then R16, Kb, Kg and Vb then the fp32 staging Bm (X first), dW, dU, T16 (16-bit), T and A
// (fp32: dT, then staging; given the scores dL in between), gates, beta, the per-row sums and the per-tile
// parts of dG. About 100 KiB: two blocks per SM. v is read again from global memory at the end.
struct BackwardSmem : Sizes {
  static constexpr size_t k = 0, v = k + rows16, R16 = v, kb = v + rows16, kg = kb + rows16, vb = kg + rows16;
  static constexpr size_t b = kg, dw = vb + rows16, du = dw + rows16, T16 = du + rows16, T = T16 + rows16;
  static constexpr size_t a = T + mat32, gate = a + mat32, beta = gate + 3 * vec, dbeta = beta + vec;
  static constexpr size_t dG = dbeta + vec, row_parts = dG + vec, col_parts = row_parts + kRowTiles * vec;
  static constexpr size_t bytes = col_parts + kRowTiles * vec;
  static_assert(2 * rows16 >= mat32, "Bm fits where Kg and Vb were");
  static_assert(2 * (bytes + 1024) <= 228 * 1024, "two blocks per SM");
};

// H heads of 64 key and value channels. Given the scores, the heads may be the 64-channel parts of wider key
// heads: `parts` a key head (head b H + h is part (b H + h) % parts of key head (b H + h) / parts), whose
// scores they share (read in place). Then W goes to the walk's rows of the key head, [B*H/parts, N*64, 64
// w_parts], from part j < w_parts (the others' W is not stored, and has no gradient), and U to value part j <
// u_parts of [B*H/parts*u_parts, N*64, 64]. Without the scores all three are 1: W and U [B*H, N*64, 64].
struct UtShape {
  int B, T, H, N;
  int parts = 1, w_parts = 1, u_parts = 1;
};

// Where one block's data lie: rows of k, v (and dk, dv) in [B, T, H, 64]; given the scores, rows of k and
// dk in [B*H, N*64, 64]; rows of w and u (and their gradients) where UtShape says, with row strides w_ld and
// kD (has_w, has_u: whether this head's are stored); beta, g, dbeta, dg in [B*H, T]; T and d_scores in
// [B*H, N, 64, 64], the given scores in [B*H/parts, N, 64, 64].
struct ChunkAt {
  int n, bh, t0, w_ld;
  bool has_w, has_u;
  size_t head, row, chunked, steps, inverse, scores, w, u;
  __device__ explicit ChunkAt(const UtShape& p) {
    n = blockIdx.x, bh = blockIdx.y, t0 = n * kC;
    const int b = bh / p.H, h = bh % p.H, key_head = bh / p.parts, part = bh % p.parts;
    row = static_cast<size_t>(p.H) * kD;
    head = (static_cast<size_t>(b) * p.T * p.H + h) * kD;
    chunked = static_cast<size_t>(bh) * p.N * kC * kD;
    steps = static_cast<size_t>(bh) * p.T;
    inverse = (static_cast<size_t>(bh) * p.N + n) * kC * kC;
    scores = (static_cast<size_t>(key_head) * p.N + n) * kC * kC;
    has_w = part < p.w_parts, has_u = part < p.u_parts, w_ld = kD * p.w_parts;
    w = static_cast<size_t>(key_head) * p.N * kC * w_ld + part * kD;
    u = (static_cast<size_t>(key_head) * p.u_parts + part) * p.N * kC * kD;
  }
};

// beta of the chunk's rows (zeros past T) and the gates (chunk_gates: G, e^G, e^{Gl-G}).
__device__ void load_beta_and_gates(float* beta, float* G, const float* __restrict__ b, const float* __restrict__ g,
                                    const ChunkAt& at, int T) {
  if (threadIdx.x < kC) {
    const int t = at.t0 + threadIdx.x;
    beta[threadIdx.x] = t < T ? b[at.steps + t] : 0.f;
  }
  chunk_gates(G, fetch_gates(g != nullptr ? g + at.steps : nullptr, at.t0, T));
}

// Kb = beta k (unless Kb is null), Kg = beta e^G k, Vb = beta v (16-bit [C, ld]).
template <typename E>
__device__ void scaled_rows(E* Kb, E* Kg, E* Vb, const E* k, const E* v, const float* beta, const float* eG, int ld) {
  for (int i = threadIdx.x; i < kC * kD / 8; i += kThreads) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    float kr[8], vr[8], a[8], b[8], d[8];
    unpack8<E>(*reinterpret_cast<const uint4*>(k + r * ld + c), kr);
    unpack8<E>(*reinterpret_cast<const uint4*>(v + r * ld + c), vr);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = kr[j] * beta[r], b[j] = a[j] * eG[r], d[j] = vr[j] * beta[r];
    if (Kb != nullptr) *reinterpret_cast<uint4*>(Kb + r * ld + c) = pack8<E>(a);
    *reinterpret_cast<uint4*>(Kg + r * ld + c) = pack8<E>(b);
    *reinterpret_cast<uint4*>(Vb + r * ld + c) = pack8<E>(d);
  }
}

// L = strictly lower part of diag(beta) A, fp32 [C, ld32], from the given scores A [C, C] (16-bit, global).
template <typename E>
__device__ void given_scores(float* L, const E* __restrict__ A, const float* beta) {
#pragma unroll
  for (int i = threadIdx.x; i < kC * kC / 8; i += kThreads) {
    const int r = i / (kC / 8), c = (i % (kC / 8)) * 8;
    float x[8] = {};
    if (c < r) {  // a word from the diagonal on is masked whole
      unpack8<E>(reinterpret_cast<const uint4*>(A)[i], x);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = c + j < r ? beta[r] * x[j] : 0.f;
    }
    store8(L + r * Sizes::ld32 + c, x);
  }
}

// L = strictly lower part of diag(beta) (k k^T) ⊙ exp(G_i - G_j), fp32 [C, ld32], tiles on and below the
// diagonal only (nothing reads above).
template <typename E>
__device__ void decayed_scores(float* L, const E* k, const float* beta, const float* G) {
  lower_tiles_into_stage(L, Sizes::ld32, [&](Acc& acc, int R, int Cc) {
    product_tile<false, true>(acc, k, Sizes::ld, k, Sizes::ld, R, Cc, 0, kD / 16);
    decay_tile<true>(acc, G, R, Cc, 1.f, beta);
  });
}

// d += a b for one 16x8 half of an Acc on TF32 operands (mma.sync.m16n8k8: a 16x8 row-major, b 8x8
// column-major, in the register layout of the PTX ISA's "Matrix fragments for mma.m16n8k8").
__device__ __forceinline__ void mma_16x8x8_tf32(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef LINEARIZE_CUDA_EMULATION
  linearize::simt::mma_m16n8k8_tf32(d, a, b0, b1);
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// x rounded to TF32 (to nearest, ties away), as operand bits.
__device__ __forceinline__ uint32_t to_tf32(float x) {
#ifdef LINEARIZE_CUDA_EMULATION
  return linearize::simt::to_tf32(x);
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#endif
}

// x = hi + lo with hi and lo TF32 values, as operand bits.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x), lo = to_tf32(x - __uint_as_float(hi));
}

// acc += Σ_{s = s0}^{s1-1} X(R, s) Y(s, Cc) over fp32 tiles of 16x8 and 8x16 ([., ld] row-major, or read
// transposed when TransX / TransY), on tensor cores as three TF32 products of the split x = hi + lo
// (lo·hi + hi·lo + hi·hi): close to fp32, which the difference of close terms in dL needs. Lane l (g = l / 4,
// t = l % 4) reads its fragment elements itself: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4) of the X tile
// and (t, g), (t + 4, g) of each 8x8 half of the Y tile.
template <bool TransX, bool TransY>
__device__ __forceinline__ void product_tile_3xtf32(Acc& acc, const float* X, const float* Y, int ld, int R, int Cc,
                                                    int s0, int s1) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto x_at = [&](int s, int m, int k) {  // X(R, s)[m][k]
    return TransX ? X[(8 * s + k) * ld + 16 * R + m] : X[(16 * R + m) * ld + 8 * s + k];
  };
  auto y_at = [&](int s, int k, int n) {  // Y(s, Cc)[k][n]
    return TransY ? Y[(16 * Cc + n) * ld + 8 * s + k] : Y[(8 * s + k) * ld + 16 * Cc + n];
  };
  for (int s = s0; s < s1; ++s) {
    uint32_t a_hi[4], a_lo[4], b_hi[4], b_lo[4];  // b: b0, b1 of half 0, then of half 1
    split_tf32(x_at(s, g, t), a_hi[0], a_lo[0]);
    split_tf32(x_at(s, g + 8, t), a_hi[1], a_lo[1]);
    split_tf32(x_at(s, g, t + 4), a_hi[2], a_lo[2]);
    split_tf32(x_at(s, g + 8, t + 4), a_hi[3], a_lo[3]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      split_tf32(y_at(s, t, 8 * h + g), b_hi[2 * h], b_lo[2 * h]);
      split_tf32(y_at(s, t + 4, 8 * h + g), b_hi[2 * h + 1], b_lo[2 * h + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* d = acc.x + 4 * h;
      mma_16x8x8_tf32(d, a_lo, b_hi[2 * h], b_hi[2 * h + 1]);
      mma_16x8x8_tf32(d, a_hi, b_lo[2 * h], b_lo[2 * h + 1]);
      mma_16x8x8_tf32(d, a_hi, b_hi[2 * h], b_hi[2 * h + 1]);
    }
  }
}

// X = dT T^T takes 2 (Cc + 1) steps a tile: column 0's four tiles go to warps 0 and 1.
constexpr int kXCodes[kLowerTiles] = {0, 4, 5, 9, 10, 13, 14, 15, 8, 12};
constexpr uint64_t kXOrder = tile_order(kXCodes);
// dL = -T^T X takes 8 - 2 R steps a tile: row 3's four tiles go to warps 0 and 1.
constexpr int kLCodes[kLowerTiles] = {12, 13, 0, 4, 5, 8, 9, 10, 14, 15};
constexpr uint64_t kLOrder = tile_order(kLCodes);

// T = (I + L)^{-1} by 16x16 blocks, in fp32 (L is zero on and above the diagonal). With D_i = I + L_ii,
//   T_ii = D_i^{-1}                                  (forward substitution: one thread per column, held in registers)
//   T_ij = -T_ii Σ_{k=j}^{i-1} L_ik T_kj   for j < i (block row by block row: warp j, two 3xTF32 products)
// The blocks above the diagonal are zeros.
__device__ void unit_lower_inverse_blocks(float* T, const float* L) {
  constexpr int ld = Sizes::ld32, kB = 16, kBlocks = kC / kB;
  const int tid = threadIdx.x;
  if (tid < kC) {  // column c of diagonal block b; x[r] = T[base + r][base + c], zero for r < c
    const int base = tid / kB * kB, c = tid % kB;
    float x[kB];
#pragma unroll
    for (int r = 0; r < kB; ++r) {
      const float* row = L + (base + r) * ld + base;
      float y = r == c ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < r; ++j) y -= row[j] * x[j];
      x[r] = y;
    }
#pragma unroll
    for (int r = 0; r < kB; ++r) T[(base + r) * ld + base + c] = x[r];
  } else {  // the blocks above the diagonal, four columns an item
    for (int e = tid - kC; e < kC * kC / 4; e += kThreads - kC) {
      const int r = e / (kC / 4), c = (e % (kC / 4)) * 4;
      if (r / kB < c / kB) *reinterpret_cast<float4*>(T + r * ld + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __syncthreads();
  static_assert(kWarps >= kBlocks - 1, "one warp per block of a block row");
  const int j = tid / 32;
  for (int i = 1; i < kBlocks; ++i) {
    if (j < i) {
      // P_ij = Σ_k L_ik T_kj into T's block (i, j): still unwritten, and read by this warp only.
      float* Tij = T + i * kB * ld + j * kB;
      Acc acc;
      zero(acc);
      product_tile_3xtf32<false, false>(acc, L, T, ld, i, j, 2 * j, 2 * i);
      store_tile(Tij, acc, ld);
      __syncwarp();
      // T_ij = -T_ii P_ij, in place (the warp holds P_ij's fragments before it stores).
      zero(acc);
      product_tile_3xtf32<false, false>(acc, T, T, ld, i, j, 2 * i, 2 * i + 2);
      negate(acc);
      __syncwarp();
      store_tile(Tij, acc, ld);
    }
    __syncthreads();
  }
}

// Given: k is e^G ⊙ k heads first, `scores` the decayed scores and g unused; otherwise scores is unused.
template <typename E, bool Given>
__global__ void __launch_bounds__(kThreads, 3)
    ut_forward_kernel(const E* __restrict__ k, const E* __restrict__ v, const float* __restrict__ beta,
                      const float* __restrict__ g, const E* __restrict__ scores, E* __restrict__ w, E* __restrict__ u,
                      float* __restrict__ inverse, UtShape p) {
  using S = ForwardSmem;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sk = view<E>(smem, S::k), *sv = view<E>(smem, S::v), *Kg = view<E>(smem, S::kg);
  E *Vb = view<E>(smem, S::vb), *T16 = view<E>(smem, S::T16);
  float *L = view<float>(smem, S::L), *T = view<float>(smem, S::T), *G = view<float>(smem, S::gate);
  float* sb = view<float>(smem, S::beta);
  const ChunkAt at(p);
  const int Tp = p.N * kC;
  {
    RowPrefetch<kD, E> rk, rv;
    if constexpr (Given) rk.fetch(k + at.chunked, kD, at.t0, Tp);
    else rk.fetch(k + at.head, at.row, at.t0, p.T);
    rv.fetch(v + at.head, at.row, at.t0, p.T);
    rk.put(sk, S::ld), rv.put(sv, S::ld);
  }
  load_beta_and_gates(sb, G, beta, Given ? nullptr : g, at, p.T);
  __syncthreads();
  scaled_rows<E>(nullptr, Kg, Vb, sk, sv, sb, G + kC, S::ld);
  if constexpr (Given) given_scores(L, scores + at.scores, sb);
  else decayed_scores(L, sk, sb, G);
  __syncthreads();
  unit_lower_inverse_blocks(T, L);  // ends on a barrier
  copy_state<kC, kD>(T16, Sizes::ld, T, Sizes::ld32);  // T16: the 16-bit copy of T
  store_lower(inverse + at.inverse, T, S::ld32);  // T is lower triangular
  __syncthreads();
  // W = T Kg and U = T Vb (T lower: tiles s <= R only), each tile from its accumulator straight to global
  // memory (every row of the chunked layout is stored, zeros past T).
  for (int t = threadIdx.x / 32; t < 2 * kRowTiles * (kD / 16); t += kWarps) {
    const bool second = t >= kRowTiles * (kD / 16);
    const int R = (t / (kD / 16)) % kRowTiles, Cc = t % (kD / 16);
    if (!(second ? at.has_u : at.has_w)) continue;  // warp-uniform
    Acc acc;
    zero(acc);
    product_tile<false, false>(acc, T16, S::ld, second ? Vb : Kg, S::ld, R, Cc, 0, R + 1);
    const int ld = second ? kD : at.w_ld;
    store_tile16((second ? u + at.u : w + at.w) + static_cast<size_t>(at.t0 + 16 * R) * ld + 16 * Cc, acc, ld);
  }
}

// Sum of `part` over the D / 8 consecutive threads that hold one row (store_rows' layout).
__device__ __forceinline__ float row_sum(float part) {
#pragma unroll
  for (int off = kD / 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
  return part;
}

// Row sums over one tile (row tile R, column tile Cc) of a [C, C] result, given in m in Acc's layout:
// rows[Cc * C + i] for the tile's rows i.
__device__ __forceinline__ void row_sums_of(const float (&m)[Acc::num_elements], int R, int Cc, float* rows) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Acc's layout: rows g (elements 0, 1, 4, 5) and g + 8 (2, 3, 6, 7); columns 2t, 2t + 1, 8 + 2t, 9 + 2t.
  float top = (m[0] + m[1]) + (m[4] + m[5]), bottom = (m[2] + m[3]) + (m[6] + m[7]);
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    top += __shfl_xor_sync(0xffffffffu, top, off);
    bottom += __shfl_xor_sync(0xffffffffu, bottom, off);
  }
  if (t == 0) rows[Cc * kC + 16 * R + g] = top, rows[Cc * kC + 16 * R + g + 8] = bottom;
}

// Row sums of x ⊙ y over one tile into rows, as row_sums_of.
__device__ __forceinline__ void tile_row_sums(const Acc& x, const Acc& y, int R, int Cc, float* rows) {
  float m[Acc::num_elements];
#pragma unroll
  for (int e = 0; e < Acc::num_elements; ++e) m[e] = x.x[e] * y.x[e];
  row_sums_of(m, R, Cc, rows);
}

// Row and column sums of x ⊙ y over one tile: the rows as row_sums_of, and cols[R * C + j] for its
// columns j.
__device__ __forceinline__ void tile_sums(const Acc& x, const Acc& y, int R, int Cc, float* rows, float* cols) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float m[Acc::num_elements];
#pragma unroll
  for (int e = 0; e < Acc::num_elements; ++e) m[e] = x.x[e] * y.x[e];
  row_sums_of(m, R, Cc, rows);
  float c[4] = {m[0] + m[2], m[1] + m[3], m[4] + m[6], m[5] + m[7]};
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] += __shfl_xor_sync(0xffffffffu, c[i], off);
  }
  if (g == 0) {
    float* at = cols + R * kC + 16 * Cc + 2 * t;
    at[0] = c[0], at[1] = c[1], at[8] = c[2], at[9] = c[3];
  }
}

// Given: as in the forward, and d_scores receives dA; otherwise scores and d_scores are unused.
template <typename E, bool Given>
__global__ void __launch_bounds__(kThreads, 2)
    ut_backward_kernel(const E* __restrict__ k, const E* __restrict__ v, const float* __restrict__ beta,
                       const float* __restrict__ g, const E* __restrict__ scores, const float* __restrict__ inverse,
                       const E* __restrict__ dw, const E* __restrict__ du, E* __restrict__ dk, E* __restrict__ dv,
                       E* __restrict__ d_scores, float* __restrict__ dbeta, float* __restrict__ dg, UtShape p) {
  using S = BackwardSmem;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sk = view<E>(smem, S::k), *sv = view<E>(smem, S::v), *Kb = view<E>(smem, S::kb), *Kg = view<E>(smem, S::kg);
  E *Vb = view<E>(smem, S::vb), *sdw = view<E>(smem, S::dw), *sdu = view<E>(smem, S::du);
  E *T16 = view<E>(smem, S::T16), *R16 = view<E>(smem, S::R16);
  float *T = view<float>(smem, S::T), *A = view<float>(smem, S::a);
  float *Bm = view<float>(smem, S::b), *G = view<float>(smem, S::gate), *eG = G + kC, *sb = view<float>(smem, S::beta);
  float *sdbeta = view<float>(smem, S::dbeta), *sdG = view<float>(smem, S::dG);
  float *row_parts = view<float>(smem, S::row_parts), *col_parts = view<float>(smem, S::col_parts);
  const ChunkAt at(p);
  const int Tp = p.N * kC;
  {
    RowPrefetch<kD, E> rk, rv, rw, ru;
    if constexpr (Given) rk.fetch(k + at.chunked, kD, at.t0, Tp);
    else rk.fetch(k + at.head, at.row, at.t0, p.T);
    rv.fetch(v + at.head, at.row, at.t0, p.T);
    // No W or U stored: no gradient (a start before row 0 fetches zeros).
    rw.fetch(dw + (at.has_w ? at.w : 0), at.w_ld, at.has_w ? at.t0 : -1, Tp);
    ru.fetch(du + (at.has_u ? at.u : 0), kD, at.has_u ? at.t0 : -1, Tp);
    rk.put(sk, S::ld), rv.put(sv, S::ld), rw.put(sdw, S::ld), ru.put(sdu, S::ld);
  }
  load_beta_and_gates(sb, G, beta, Given ? nullptr : g, at, p.T);
  load_lower(T, S::ld32, inverse + at.inverse);
  __syncthreads();
  scaled_rows(Kb, Kg, Vb, sk, sv, sb, eG, S::ld);
  copy_state<kC, kD>(T16, Sizes::ld, T, Sizes::ld32);  // T16: the 16-bit copy of T
  __syncthreads();
  // dT = dW Kg^T + dU Vb^T on and below the diagonal (into A; nothing above is read).
  lower_tiles_into_stage(A, S::ld32, [&](Acc& acc, int R, int Cc) {
    product_tile<false, true>(acc, sdw, S::ld, Kg, S::ld, R, Cc, 0, kD / 16);
    product_tile<false, true>(acc, sdu, S::ld, Vb, S::ld, R, Cc, 0, kD / 16);
  });
  __syncthreads();
  // X = dT T^T into Bm (Kg and Vb are no longer needed), then dL = -T^T X (given the scores into A: dT is
  // no longer needed either), lower tiles only. Below the diagonal X[i][j] = Σ_{k <= j} dT[i][k] T[j][k] and
  // dL[i][j] = -Σ_{m >= i} T[m][i] X[m][j] read strictly lower dT and X only (T is zero above its diagonal);
  // what the diagonal tiles hold above it is never used.
  lower_tiles_into_stage(Bm, S::ld32, kXOrder, [&](Acc& acc, int R, int Cc) {
    product_tile_3xtf32<false, true>(acc, A, T, S::ld32, R, Cc, 0, 2 * (Cc + 1));
  });
  __syncthreads();
  if constexpr (Given) {
    // dL = -T^T X tile by tile, strictly lower, then in registers dA = diag(beta) dL to global memory (16-bit)
    // and the row sums of dL ⊙ A (the given scores) into per-tile parts; warps 2 .. 7, which take one
    // tile each, also write dA's six zero tiles above the diagonal.
    E* dA = d_scores + at.inverse;
    ordered_lower_tiles(kLOrder, [&](int R, int Cc) {
      Acc dl, a;
      zero(dl);
      product_tile_3xtf32<true, false>(dl, T, Bm, S::ld32, R, Cc, 2 * R, kC / 8);
      negate(dl);
      strictly_lower(dl, R, Cc);
      load_tile16(a, scores + at.scores + R * 16 * kC + Cc * 16, kC);
      tile_row_sums(dl, a, R, Cc, row_parts);
      scale_tile_rows(dl, sb, R, 1.f);
      store_tile16(dA + R * 16 * kC + Cc * 16, dl, kC);
    });
    static_assert(kWarps - 2 == kRowTiles * kRowTiles - kLowerTiles, "one zero tile for each of warps 2 .. 7");
    if (const int u = threadIdx.x / 32 - 2; u >= 0) {
      int R, Cc;
      upper_tile(u, R, Cc);
      store_zero_tile16(dA + R * 16 * kC + Cc * 16, kC);
    }
    __syncthreads();
    // dbeta = the row sums so far, added up in a fixed order; dKg = T^T dW into Bm.
    if (threadIdx.x < kC) {
      const int r = threadIdx.x;
      float sum = 0.f;
      for (int c = 0; c <= r / 16; ++c) sum += row_parts[c * kC + r];
      sdbeta[r] = sum;
    }
    tiles_into_stage<kD>(Bm, S::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<true, false>(acc, T16, S::ld, sdw, S::ld, R, Cc, R, kRowTiles);
    });
    __syncthreads();
  } else {
    // dL = -T^T X tile by tile, then in registers R = dL ⊙ exp(G_i - G_j) (strictly lower; dL's sign folded into
    // the scale), kept in 16-bit where v was (v is read again at the end), and dL ⊙ L = R ⊙ beta_i (k k^T),
    // summed over each tile's rows and columns into parts. Tiles above the diagonal are neither written nor read.
    ordered_lower_tiles(kLOrder, [&](int R, int Cc) {
      Acc r, kk;
      zero(r), zero(kk);
      product_tile_3xtf32<true, false>(r, T, Bm, S::ld32, R, Cc, 2 * R, kC / 8);
      decay_tile<true>(r, G, R, Cc, -1.f);
      store_tile16(R16 + R * 16 * S::ldc + Cc * 16, r, S::ldc);
      product_tile<false, true>(kk, sk, S::ld, sk, S::ld, R, Cc, 0, kD / 16);
      scale_tile_rows(kk, sb, R, 1.f);
      tile_sums(r, kk, R, Cc, row_parts, col_parts);
    });
    __syncthreads();
    // dG = row sums - column sums of dL ⊙ L, added up in a fixed order (tiles on and below the diagonal only);
    // dKb = R k into A, dKg = T^T dW into Bm.
    if (threadIdx.x < kC) {
      const int r = threadIdx.x, tr = r / 16;
      float row = 0.f, col = 0.f;
      for (int c = 0; c <= tr; ++c) row += row_parts[c * kC + r];
      for (int c = tr; c < kRowTiles; ++c) col += col_parts[c * kC + r];
      sdG[r] = row - col;
    }
    two_tiles_into_stage<kD>(
        A, Bm, S::ld32,
        [&](Acc& acc, int R, int Cc) { product_tile<false, false>(acc, R16, S::ldc, sk, S::ld, R, Cc, 0, R + 1); },
        [&](Acc& acc, int R, int Cc) { product_tile<true, false>(acc, T16, S::ld, sdw, S::ld, R, Cc, R, kRowTiles); });
    __syncthreads();
  }
  // Row pass: dk so far = beta dKb + beta e^G dKg (kept in registers); dbeta = k·dKb + e^G k·dKg;
  // dG += beta e^G k·dKg. Given: dk so far = beta dKg, dbeta += k·dKg (A holds no dKb, G = 0).
  constexpr int kItems = kC * kD / 8 / kThreads;  // 16-byte groups per thread
  float dk_acc[kItems][8];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    float kr[8], x[8], y[8], kx = 0.f, ky = 0.f;
    unpack8<E>(*reinterpret_cast<const uint4*>(sk + r * S::ld + c), kr);
    load8(Bm + r * S::ld32 + c, y);
    if constexpr (Given) {
#pragma unroll
      for (int j = 0; j < 8; ++j) dk_acc[it][j] = sb[r] * y[j], ky += kr[j] * y[j];
      ky = row_sum(ky);
      if (c == 0) sdbeta[r] += ky;
    } else {
      load8(A + r * S::ld32 + c, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dk_acc[it][j] = sb[r] * (x[j] + eG[r] * y[j]);
        kx += kr[j] * x[j], ky += kr[j] * y[j];
      }
      kx = row_sum(kx), ky = row_sum(ky);
      if (c == 0) sdbeta[r] = kx + eG[r] * ky, sdG[r] += sb[r] * eG[r] * ky;
    }
  }
  __syncthreads();
  // R^T Kb into A (not given the scores), dVb = T^T dU into Bm.
  if constexpr (Given) {
    tiles_into_stage<kD>(Bm, S::ld32, [&](Acc& acc, int R, int Cc) {
      product_tile<true, false>(acc, T16, S::ld, sdu, S::ld, R, Cc, R, kRowTiles);
    });
  } else {
    two_tiles_into_stage<kD>(
        A, Bm, S::ld32,
        [&](Acc& acc, int R, int Cc) { product_tile<true, false>(acc, R16, S::ldc, Kb, S::ld, R, Cc, R, kRowTiles); },
        [&](Acc& acc, int R, int Cc) { product_tile<true, false>(acc, T16, S::ld, sdu, S::ld, R, Cc, R, kRowTiles); });
  }
  __syncthreads();
  // dk = dk so far + R^T Kb (given the scores: heads first, every row); dv = beta dVb; dbeta += v·dVb.
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    const bool live = at.t0 + r < p.T;
    const size_t off = at.head + static_cast<size_t>(at.t0 + r) * at.row + c;
    float vr[8] = {}, x[8] = {}, y[8], vy = 0.f;
    if (live) unpack8<E>(*reinterpret_cast<const uint4*>(v + off), vr);
    if constexpr (!Given) load8(A + r * S::ld32 + c, x);
    load8(Bm + r * S::ld32 + c, y);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[j] += dk_acc[it][j];
      vy += vr[j] * y[j];
      y[j] *= sb[r];
    }
    vy = row_sum(vy);
    if constexpr (Given)
      *reinterpret_cast<uint4*>(dk + at.chunked + static_cast<size_t>(at.t0 + r) * kD + c) = pack8<E>(x);
    else if (live)
      *reinterpret_cast<uint4*>(dk + off) = pack8<E>(x);
    if (live) *reinterpret_cast<uint4*>(dv + off) = pack8<E>(y);
    if (c == 0) sdbeta[r] += vy;
  }
  __syncthreads();
  // dg = reverse cumulative sum of dG within the chunk (warp 0, two rows a lane); dbeta out.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, r0 = kC - 2 - 2 * lane;  // lane 0 takes the last two rows
    const float a = sdG[r0 + 1], b = sdG[r0];
    float incl = a + b;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const float after_b = incl, after_a = incl - b;  // Σ over rows >= r0, >= r0 + 1
    const int t = at.t0 + r0;
    if (g != nullptr) {
      if (t < p.T) dg[at.steps + t] = after_b;
      if (t + 1 < p.T) dg[at.steps + t + 1] = after_a;
    }
    if (t < p.T) dbeta[at.steps + t] = sdbeta[r0];
    if (t + 1 < p.T) dbeta[at.steps + t + 1] = sdbeta[r0 + 1];
  }
}

UtShape ut_shape(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta) {
  const int64_t B = k.size(0), T = k.size(1), H = k.size(2);
  TORCH_CHECK(delta_walk_supported(k.size(3), v.size(3), k.scalar_type()) && v.scalar_type() == k.scalar_type(),
              "fused UT transform: expects k, v [B,T,H,64] in one of bf16, fp16; got k ", k.sizes(), " ",
              k.scalar_type(), ", v ", v.sizes(), " ", v.scalar_type());
  TORCH_CHECK(beta.sizes() == torch::IntArrayRef({B, H, T}) && beta.scalar_type() == torch::kFloat,
              "fused UT transform: expects beta [B,H,T] fp32; got ", beta.sizes(), " ", beta.scalar_type());
  TORCH_CHECK(B * H <= 65535, "fused UT transform: at most 65535 (batch, head) pairs (a grid dimension); got ", B * H);
  return UtShape{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<int>((T + kC - 1) / kC)};
}

// Given the scores: scores [B,H/parts,N,64,64] and k [B,H,N*64,64] in v's dtype, contiguous, with parts = H
// over the scores' heads; W from w_parts and U from u_parts of each key head's parts (see UtShape).
UtShape ut_shape_given(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& beta, int64_t w_parts, int64_t u_parts) {
  TORCH_CHECK(v.dim() == 4, "fused UT transform: expects v [B,T,H,64]; got ", v.sizes());
  UtShape p = ut_shape(v, v, beta);
  const int64_t key_heads = scores.dim() == 5 ? scores.size(1) : 0;
  TORCH_CHECK(key_heads > 0 && p.H % key_heads == 0, "fused UT transform: the scores' heads must divide v's ", p.H,
              "; got scores ", scores.sizes());
  p.parts = static_cast<int>(p.H / key_heads);
  TORCH_CHECK(w_parts >= 1 && w_parts <= p.parts && u_parts >= 1 && u_parts <= p.parts,
              "fused UT transform: W and U take 1 to ", p.parts, " parts of a key head; got ", w_parts, " and ",
              u_parts);
  p.w_parts = static_cast<int>(w_parts), p.u_parts = static_cast<int>(u_parts);
  TORCH_CHECK(scores.sizes() == torch::IntArrayRef({p.B, key_heads, p.N, kC, kC}) &&
                  scores.scalar_type() == v.scalar_type() && scores.is_contiguous(),
              "fused UT transform: the scores must be [B,H/parts,N,64,64] in v's dtype, contiguous; got ",
              scores.sizes(), " ", scores.scalar_type());
  TORCH_CHECK(k.sizes() == torch::IntArrayRef({p.B, p.H, p.N * kC, kD}) && k.scalar_type() == v.scalar_type() &&
                  k.is_contiguous(),
              "fused UT transform: the rows e^G ⊙ k must be [B,H,N*64,64] in v's dtype, contiguous; got ", k.sizes(),
              " ", k.scalar_type());
  return p;
}

// W's and U's shapes (see UtShape).
std::vector<int64_t> w_shape(const UtShape& p) { return {p.B, p.H / p.parts, p.N * kC, kD * p.w_parts}; }
std::vector<int64_t> u_shape(const UtShape& p) { return {p.B, p.H / p.parts * p.u_parts, p.N * kC, kD}; }

template <bool Given>
UtForward ut_forward(const UtShape& p, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                     const torch::Tensor& g, const torch::Tensor& scores) {
  const c10::cuda::CUDAGuard guard(v.device());
  UtForward out;
  out.w = torch::empty(w_shape(p), v.options());
  out.u = torch::empty(u_shape(p), v.options());
  out.inverse = torch::empty({p.B, p.H, p.N, kC, kC}, v.options().dtype(torch::kFloat));
  if (p.N == 0 || p.B * p.H == 0) return out;
  dispatch_16bit(v.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.B * p.H));
    launch(ut_forward_kernel<E, Given>, grid, kThreads, ForwardSmem::bytes, data_as<E>(k), data_as<E>(v),
           beta.data_ptr<float>(), ptr_or_null(g), Given ? data_as<E>(scores) : nullptr, data_as<E>(out.w),
           data_as<E>(out.u), out.inverse.data_ptr<float>(), p);
  });
  return out;
}

template <bool Given>
UtGrads ut_backward(const UtShape& p, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                    const torch::Tensor& g, const torch::Tensor& scores, const torch::Tensor& inverse,
                    const torch::Tensor& dw, const torch::Tensor& du) {
  TORCH_CHECK(dw.sizes() == torch::IntArrayRef(w_shape(p)) && du.sizes() == torch::IntArrayRef(u_shape(p)) &&
                  dw.scalar_type() == v.scalar_type() && du.scalar_type() == v.scalar_type() && dw.is_contiguous() &&
                  du.is_contiguous(),
              "fused UT transform: dW, dU must be ", torch::IntArrayRef(w_shape(p)), ", ",
              torch::IntArrayRef(u_shape(p)), " in v's dtype, contiguous; got ", dw.sizes(), " ", du.sizes());
  TORCH_CHECK(inverse.sizes() == torch::IntArrayRef({p.B, p.H, p.N, kC, kC}) && inverse.scalar_type() == torch::kFloat,
              "fused UT transform: the stored inverses must be [B,H,N,64,64] fp32; got ", inverse.sizes());
  const c10::cuda::CUDAGuard guard(v.device());
  UtGrads out;
  out.dk = torch::empty_like(k);
  out.dv = torch::empty_like(v);
  out.dbeta = torch::empty_like(beta);
  if (g.defined() && !Given) out.dg = torch::empty_like(beta);
  if (Given) out.d_scores = torch::empty_like(inverse, v.options());  // each part's, [B,H,N,64,64]
  if (p.N > 0 && p.B * p.H > 0) {
    dispatch_16bit(v.scalar_type(), [&](auto elem) {
      using E = decltype(elem);
      const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.B * p.H));
      launch(ut_backward_kernel<E, Given>, grid, kThreads, BackwardSmem::bytes, data_as<E>(k), data_as<E>(v),
             beta.data_ptr<float>(), ptr_or_null(g), Given ? data_as<E>(scores) : nullptr, inverse.data_ptr<float>(),
             data_as<E>(dw), data_as<E>(du), data_as<E>(out.dk), data_as<E>(out.dv),
             Given ? data_as<E>(out.d_scores) : nullptr, out.dbeta.data_ptr<float>(), out_or_null(out.dg), p);
    });
  }
  if (Given) out.d_scores = add_up_parts(out.d_scores, p.parts);  // the parts' gradients of their shared scores
  return out;
}

}  // namespace

UtForward ut_transform_forward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                               const torch::Tensor& g) {
  return ut_forward<false>(ut_shape(k, v, beta), k, v, beta, g, torch::Tensor());
}

UtGrads ut_transform_backward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                              const torch::Tensor& g, const torch::Tensor& inverse, const torch::Tensor& dw,
                              const torch::Tensor& du) {
  return ut_backward<false>(ut_shape(k, v, beta), k, v, beta, g, torch::Tensor(), inverse, dw, du);
}

UtForward ut_transform_given_forward(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& beta, int64_t w_parts, int64_t u_parts) {
  return ut_forward<true>(ut_shape_given(scores, k, v, beta, w_parts, u_parts), k, v, beta, torch::Tensor(), scores);
}

UtGrads ut_transform_given_backward(const torch::Tensor& scores, const torch::Tensor& k, const torch::Tensor& v,
                                    const torch::Tensor& beta, const torch::Tensor& inverse, const torch::Tensor& dw,
                                    const torch::Tensor& du, int64_t w_parts, int64_t u_parts) {
  return ut_backward<true>(ut_shape_given(scores, k, v, beta, w_parts, u_parts), k, v, beta, torch::Tensor(), scores,
                           inverse, dw, du);
}

}  // namespace linearize::ops::cuda_kernels
