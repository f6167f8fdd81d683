// A decay per key channel, K = 64 m key channels: the intra-chunk scores of the chunked form and their
// backward, chunks of 64 rows, the channels taken in parts of 64 (a score is the sum of its parts'): the
// forward one thread block per (chunk, batch*head) walking the parts, the backward one per (chunk,
// batch*head, part). GLA's scores, q against k:
//   A[i, j] = scale Σ_d q[i, d] k[j, d] exp(G[i, d] - G[j, d])   for j <= i, 0 above
// and for Kimi Delta Attention also, in the same kernels, the keys against themselves (Pair):
//   Akk[i, j] = Σ_d k[i, d] k[j, d] exp(G[i, d] - G[j, d])        for j <= i, 0 above
// with G the chunk-local cumulative log decay (fp32), summed here from the raw per-step log decay g. The
// chunk splits into four sub-chunks of 16 rows.
// A block below the diagonal (sub-chunks I > J) is a tensor-core product through the reference row
// m = 16 I, where both factors stay <= 1:
//   X_m[r, d] = k[r, d] exp(G[m, d] - G[r, d])  for r < m,   q[r, d] exp(G[r, d] - G[m, d])  for r >= m
//   A_IJ = scale X_m(rows of I) X_m(rows of J)^T,   m = 16 I
// (Akk the same with k in place of q from row m on). The four diagonal blocks are fp32 sums; both ways
// take their factors exp(G[i, d] - G[j, d]) as products of the per-step decays exp(G[r, d] - G[r-1, d])
// <= 1 over rows j+1 .. i.
// Backward, given dA (16-bit):
//   dq_I = scale (exp(G_I - G_m) ⊙ dA_{I,<I} X_m(rows < m)) + the diagonal part,     m = 16 I
//   dk_J = scale (exp(G_m - G_J) ⊙ dA_{>J,J}^T X_m(rows >= m)) + the diagonal part,  m = 16 (J + 1)
//   dG   = q ⊙ dq - k ⊙ dk   (every term of A carries exp(G_i - G_j); the diagonal's i = j cancels)
// and given dAkk, the keys take both sides: dk gains dAkk's row side (as dq above, with k) and its column
// side (as dk above, with k from row m on), and dG = k ⊙ (row side - column side) for that part.
// The same kernels give the walk's row factors (chunk_vector_decay.cu), with Gl = G[63]:
//   qd = scale e^G ⊙ q,   kd = e^{Gl - G} ⊙ k,   a = e^{Gl}   (and with Akk the UT's ek = e^G ⊙ k)
// and take their gradients back: dq += scale e^G ⊙ dqd, dk += e^{Gl - G} ⊙ dkd (+ e^G ⊙ dek, a row-side
// term), then dG with the sums whole, plus Σ_r kd ⊙ dkd + a ⊙ da at row 63 (Gl); the gate's gradient is
// dG's reverse sum within the chunk, dg[r] = Σ_{s >= r} dG[s] (rows past T included: row 63 carries Gl).
// q, k, g and their gradients are the caller's rows [B, T, H, K] (q, k 16-bit, g fp32; zeros past T
// on the way in, nothing written past T on the way out). What goes to the walk is heads first and
// padded to whole chunks: qd, kd and their gradients [B*H, N*64, K] (16-bit); ek and its gradient by
// part, [B*H*m, N*64, 64] (the UT transform takes them a part at a time); A, Akk, dA, dAkk
// [B*H, N, 64, 64] (16-bit, zeros above the diagonal); a, da [B*H, N, K] fp32.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/chunk_vector_decay.h"
#include "ops/cuda/vector_decay_scores.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kD = 64;     // channels a part
constexpr int kSub = 16;   // rows per sub-chunk
constexpr int kRefs = 3;   // reference rows 16, 32, 48
constexpr size_t kDiagBytes = kRowTiles * kSub * kSub * 2;  // the four diagonal blocks, 16-bit [4, 16, 16]

using Pads = Pads64;

// Forward: q, k, X_16, X_32, X_48 (and with the key-key scores Y, below) 16-bit, G fp32 and the scores'
// diagonal blocks (and the key-key scores') 16-bit [4, 16, 16]; the blocks below the diagonal go from the
// accumulators to global memory. About 64 KiB (75 with the key-key scores): three blocks per SM.
template <bool Pair>
struct ForwardSmem : Pads {
  static constexpr size_t q = 0, k = q + rows16, X = k + rows16, Y = X + kRefs * rows16;
  static constexpr size_t G = Y + (Pair ? rows16 : 0), diag = G + mat32, diag_kk = diag + kDiagBytes;
  static constexpr size_t bytes = diag_kk + (Pair ? kDiagBytes : 0);
  static_assert(3 * (bytes + 1024) <= 228 * 1024, "three blocks per SM");
  static_assert(kDiagBytes >= kRowTiles * kD * 4, "load_chunk's totals fit in the diagonal blocks' place");
};

// The causal [64, 64] scores (row stride 64, global): zeros in the blocks above the diagonal, and the four
// diagonal blocks from their 16-bit staging diag [4, 16, 16] with zeros above the diagonal. The blocks below
// the diagonal are stored elsewhere.
template <typename E>
__device__ void store_diagonal_and_zeros(E* __restrict__ out, const E* diag) {
  constexpr int kHalves = kC * kC / 8;  // 16-byte words of the square
  for (int i = threadIdx.x; i < kHalves; i += kThreads) {
    const int r = i / (kC / 8), c = (i % (kC / 8)) * 8, I = r / kSub, J = c / kSub;
    if (J < I) continue;  // below the diagonal
    float f[8] = {};
    if (J == I) {
      unpack8<E>(*reinterpret_cast<const uint4*>(diag + (I * kSub + r % kSub) * kSub + c % kSub), f);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = c + j <= r ? f[j] : 0.f;
    }
    reinterpret_cast<uint4*>(out)[i] = pack8<E>(f);
  }
}

// Backward: q, k, X_16, X_32, X_48 (after the products dqd and dkd, then dek), dA (16-bit), G, the
// products of the row side (dq's; then dk's from dAkk) and of the column side (dk's) in fp32, and with the
// key-key scores the four diagonal blocks of dAkk (16-bit [4, 16, 16]). About 105 KiB (107 with the key-key
// scores): two blocks per SM.
template <bool Pair>
struct BackwardSmem : Pads {
  static constexpr size_t q = 0, k = q + rows16, X = k + rows16, dA = X + kRefs * rows16, G = dA + rows16;
  static constexpr size_t rows_side = G + mat32, cols_side = rows_side + mat32, diag_kk = cols_side + mat32;
  static constexpr size_t bytes = diag_kk + (Pair ? kDiagBytes : 0);
};

// Where a block (chunk n, head bh = b H + h, 64-channel part p of the K = 64 m key channels) reads and
// writes: the caller's rows t0 .. t0 + 63 of head (b, h) in [B, T, H, K] (row stride H K) from channel 64 p
// on; the walk's rows [B*H, N*64, K] (row stride K) from channel 64 p on; ek's rows by part,
// [B*H*m, N*64, 64]; squares [B*H, N, 64, 64]; the chunk's factors [B*H, N, K].
struct Chunk {
  size_t head;  // row 0, channel 64 p of head (b, h) in [B, T, H, K]
  int stride, t0, T, N, bh, parts, part;
  __device__ Chunk(int N_, int T_, int H, int parts_, int bh_) {
    bh = bh_, parts = parts_, N = N_, T = T_;
    stride = H * kD * parts, t0 = blockIdx.x * kC;
    head = (static_cast<size_t>(bh / H) * T_ * H + bh % H) * kD * parts;
    part = 0;
  }
  __device__ void to_part(int p) { head += static_cast<size_t>(p - part) * kD, part = p; }
  __device__ bool live(int r) const { return t0 + r < T; }
  __device__ size_t row(int r) const { return head + static_cast<size_t>(t0 + r) * stride; }  // caller's layout
  __device__ int K() const { return kD * parts; }
  __device__ size_t index() const { return static_cast<size_t>(bh) * N + blockIdx.x; }  // (bh, n)
  __device__ size_t rows() const { return index() * kC * K() + part * kD; }            // walk's rows, stride K
  __device__ size_t part_rows() const {                                                 // ek's rows, stride 64
    return ((static_cast<size_t>(bh) * parts + part) * N + blockIdx.x) * kC * kD;
  }
  __device__ size_t square() const { return index() * kC * kC; }
  __device__ size_t channels() const { return index() * K() + part * kD; }  // [B*H, N, K]
};

// The chunk's q, k rows (16-bit) and G (fp32) into shared memory, zeros past T: G is the inclusive
// cumulative sum of g within the chunk, thread (sub-chunk I, channel d) summing its 16 rows after the
// totals of the sub-chunks before it (`totals`: 4 x 64 floats of scratch).
template <typename E>
__device__ void load_chunk(E* sq, E* sk, float* sG, float* totals, const E* __restrict__ q,
                           const E* __restrict__ k, const float* __restrict__ g, const Chunk& at) {
  // Every global load of the chunk is issued before the first store to shared memory waits on one.
  constexpr int kGWords = kC * kD / 4 / kThreads;  // g's 16-byte words a thread
  static_assert(kGWords * kThreads * 4 == kC * kD, "g's words split evenly over the threads");
  RowPrefetch<kD, E> rq, rk;
  rq.fetch(q + at.head, at.stride, at.t0, at.T), rk.fetch(k + at.head, at.stride, at.t0, at.T);
  float4 gw[kGWords];
#pragma unroll
  for (int j = 0; j < kGWords; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / (kD / 4), c = (i % (kD / 4)) * 4;
    gw[j] = at.live(r) ? *reinterpret_cast<const float4*>(g + at.row(r) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  rq.put(sq, Pads::ld), rk.put(sk, Pads::ld);
#pragma unroll
  for (int j = 0; j < kGWords; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / (kD / 4), c = (i % (kD / 4)) * 4;
    *reinterpret_cast<float4*>(sG + r * Pads::ld32 + c) = gw[j];
  }
  __syncthreads();
  const int I = threadIdx.x / kD, d = threadIdx.x % kD, r0 = I * kSub;
  float run = 0.f;
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    run += sG[(r0 + i) * Pads::ld32 + d];
    sG[(r0 + i) * Pads::ld32 + d] = run;
  }
  totals[I * kD + d] = run;
  __syncthreads();
  float before = 0.f;
  for (int J = 0; J < I; ++J) before += totals[J * kD + d];
#pragma unroll
  for (int i = 0; i < kSub; ++i) sG[(r0 + i) * Pads::ld32 + d] += before;
}

// X_m (m = 16, 32, 48) within X, the three side by side.
template <typename E>
__device__ __forceinline__ E* ref(E* X, int m) {
  return X + (m / kSub - 1) * kC * Pads::ld;
}

// Which rows of the reference rows to form: rows from[i] .. to[i] - 1 of X_m, m = 16 (i + 1).
struct RefSpans {
  int from[kRefs], to[kRefs];
};

// The reference rows X_16, X_32, X_48 over their spans (at the same row numbers): the keys before row m
// decayed up to it, k[r] exp(G[m] - G[r]), and from row m on `rows` (q or k) decayed from it,
// rows[r] exp(G[r] - G[m]). With Y (the forward's key-key scores) also, for the rows r >= 16, the keys
// decayed from the first row m of their own sub-chunk, k[r] exp(G[r] - G[m]): the factor X_m's row r
// takes, so X_m's span must hold the rows of sub-chunk m / 16. Thread by 16-byte word (row r, channels
// c .. c+7): it reads k[r], rows[r] and G[r] once and forms every X_m that takes row r.
template <typename E>
__device__ void reference_rows(E* X, const E* rows, const E* sk, const float* sG, const RefSpans& span,
                               E* Y = nullptr) {
  int lo = kC, hi = 0;
#pragma unroll
  for (int i = 0; i < kRefs; ++i) {
    lo = span.from[i] < lo ? span.from[i] : lo;
    hi = span.to[i] > hi ? span.to[i] : hi;
  }
  for (int w = lo * (kD / 8) + threadIdx.x; w < hi * (kD / 8); w += kThreads) {
    const int r = w / (kD / 8), c = (w % (kD / 8)) * 8;
    const uint4 kw = *reinterpret_cast<const uint4*>(sk + r * Pads::ld + c);
    const uint4 rw = *reinterpret_cast<const uint4*>(rows + r * Pads::ld + c);
    float gr[8];
    load8(sG + r * Pads::ld32 + c, gr);
#pragma unroll
    for (int i = 0; i < kRefs; ++i) {
      const int m = kSub * (i + 1);
      if (r < span.from[i] || r >= span.to[i]) continue;
      const bool key = r < m, own = Y != nullptr && !key && r < m + kSub;  // own: Y's row too
      float gm[8], v[8], y[8];
      load8(sG + m * Pads::ld32 + c, gm);
      unpack8<E>(kw, y);
      if (key) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = y[j];
      } else {
        unpack8<E>(rw, v);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = __expf(key ? gm[j] - gr[j] : gr[j] - gm[j]);
        v[j] *= f, y[j] *= f;
      }
      *reinterpret_cast<uint4*>(ref(X, m) + r * Pads::ld + c) = pack8<E>(v);
      if (own) *reinterpret_cast<uint4*>(Y + r * Pads::ld + c) = pack8<E>(y);
    }
  }
}

// G (fp32 [64, ld32]) -> the per-step factors e^{G[r] - G[r-1]} in place, from each sub-chunk's second row
// on (its first row keeps G), by thread (sub-chunk, channel).
__device__ void to_steps(float* sG) {
  const int I = threadIdx.x / kD, d = threadIdx.x % kD, r0 = I * kSub;
  float before = sG[r0 * Pads::ld32 + d];
#pragma unroll
  for (int i = 1; i < kSub; ++i) {
    const float here = sG[(r0 + i) * Pads::ld32 + d];
    sG[(r0 + i) * Pads::ld32 + d] = __expf(here - before);
    before = here;
  }
}

// The sum of x over the 8 consecutive lanes that share it.
__device__ __forceinline__ float sum8(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x + __shfl_xor_sync(0xffffffffu, x, 4);
}

// Eight sums at once over the 8 consecutive lanes that share them: lane l of the eight returns the sum of
// v[l]. Each round halves what a lane holds, keeping its half and adding the partner's copy of it (a
// reduce-scatter: 7 shuffles for the eight sums, where sum8 takes 3 for one).
__device__ __forceinline__ float scatter_sums8(const float (&v)[8]) {
  const int l = threadIdx.x % 8;
  float w[4], u[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // lanes with bit 2 keep sums 4 .. 7
    const bool hi = l & 4;
    w[k] = (hi ? v[k + 4] : v[k]) + __shfl_xor_sync(0xffffffffu, hi ? v[k] : v[k + 4], 4);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // then bit 1: the upper two of those four
    const bool hi = l & 2;
    u[k] = (hi ? w[k + 2] : w[k]) + __shfl_xor_sync(0xffffffffu, hi ? w[k] : w[k + 2], 2);
  }
  const bool hi = l & 1;
  return (hi ? u[1] : u[0]) + __shfl_xor_sync(0xffffffffu, hi ? u[0] : u[1], 1);
}

// The scores of chunk blockIdx.x of head blockIdx.y and the walk's row factors; with Pair also the
// key-key scores and ek. The K = 64 parts key channels are taken 64 at a time, the scores' sums over
// channels carried from part to part in fp32 (the tiles below the diagonal in the warps' accumulators, the
// diagonal blocks' sums in the threads that take them) and rounded once at the end. OnePart: K = 64, where
// the compiler sees the loop run once and keeps the registers of one part (with Pair and more parts, ptxas
// spills a few bytes).
template <typename E, bool Pair, bool OnePart>
__global__ void __launch_bounds__(kThreads, 3)
    vector_scores_forward_kernel(const E* __restrict__ q, const E* __restrict__ k, const float* __restrict__ g,
                                 E* __restrict__ A, E* __restrict__ qd, E* __restrict__ kd, float* __restrict__ a,
                                 E* __restrict__ Akk, E* __restrict__ ek, int N, int T, int H, int parts,
                                 float scale) {
  using S = ForwardSmem<Pair>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, S::q), *sk = view<E>(smem, S::k), *X = view<E>(smem, S::X), *Y = view<E>(smem, S::Y);
  E *diag = view<E>(smem, S::diag), *diag_kk = view<E>(smem, S::diag_kk);  // 16-bit [4, 16, 16]
  float* sG = view<float>(smem, S::G);
  if constexpr (OnePart) parts = 1;
  Chunk at(N, T, H, parts, blockIdx.y);
  const int K = at.K();
  // Blocks below the diagonal, (1,0) (2,0) (2,1) (3,0) (3,1) (3,2), one warp each (and the key-key
  // scores' six on warps 6, 7, 0 .. 3): tile t is the warp's accumulator t / kWarps.
  constexpr int kTiles = Pair ? 12 : 6, kSlots = (kTiles + kWarps - 1) / kWarps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc acc[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) zero(acc[slot]);
  auto each_tile = [&](auto&& fn) {  // fn(accumulator, keys, I, J) for each of the warp's tiles
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int t = warp + slot * kWarps, b = t % 6, I = b < 1 ? 1 : b < 3 ? 2 : 3;
      if (t < kTiles) fn(acc[slot], t >= 6, I, b - (I * (I - 1)) / 2);
    }
  };
  // The diagonal blocks, in fp32 from the per-step factors e^{G[r] - G[r-1]} (<= 1; sG holds them from each
  // sub-chunk's second row on): exp(G[i] - G[j]) is their product over rows j+1 .. i, which the thread
  // multiplies into the column's key k[j] step by step (one product a channel and step, shared by both
  // scores, then one fused multiply-add each). Thread (I, p, e): sub-chunk I, columns p and 15 - p (16 - p
  // and p + 1 rows: 17 together), channels 8e .. 8e + 7, the sum over channels across the 8 lanes of (I, p).
  // The 17 steps are unrolled so that one row's loads and sums overlap the next one's; their sums over the
  // lanes are taken eight steps at a time (steps 0-7 and 8-15 by scatter_sums8, lane e keeping step 8b + e's;
  // step 16 by sum8) into `kept` (and `kept_kk`), which add up the parts.
  const int dI = warp / 2, dp = (warp % 2) * 4 + lane / 8, de = lane % 8, dr0 = dI * kSub;
  auto step = [&](int t, int& i, int& j) {  // step t's element (i, j) of the scores
    const bool second = t >= kSub - dp;       // column 15 - p, from its diagonal down
    j = second ? dr0 + kSub - 1 - dp : dr0 + dp, i = second ? j + t - (kSub - dp) : j + t;
  };
  float kept[3] = {}, kept_kk[3] = {};
  for (int part = 0; part < parts; ++part) {
    at.to_part(part);
    if (part > 0) __syncthreads();  // the last part's rows are read
    load_chunk(sq, sk, sG, view<float>(smem, S::diag), q, k, g, at);  // free until the diagonal blocks
    __syncthreads();
    // Only the rows the products read: X_m up to sub-chunk m / 16, and for the key-key scores Y, whose
    // sub-chunk I >= 1 holds its own keys decayed from its first row (the row side of Akk's blocks).
    reference_rows(X, sq, sk, sG, RefSpans{{0, 0, 0}, {32, 48, 64}}, Pair ? Y : nullptr);
    // The walk's row factors.
    const float* Gl = sG + (kC - 1) * S::ld32;
    for (int i = threadIdx.x; i < kC * kD / 8; i += kThreads) {
      const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
      float qr[8], kr[8], er[8], gr[8];
      unpack8<E>(*reinterpret_cast<const uint4*>(sq + r * S::ld + c), qr);
      unpack8<E>(*reinterpret_cast<const uint4*>(sk + r * S::ld + c), kr);
      load8(sG + r * S::ld32 + c, gr);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float eg = __expf(gr[j]);
        qr[j] *= scale * eg, er[j] = kr[j] * eg, kr[j] *= __expf(Gl[c + j] - gr[j]);
      }
      *reinterpret_cast<uint4*>(qd + at.rows() + static_cast<size_t>(r) * K + c) = pack8<E>(qr);
      *reinterpret_cast<uint4*>(kd + at.rows() + static_cast<size_t>(r) * K + c) = pack8<E>(kr);
      if (Pair) reinterpret_cast<uint4*>(ek + at.part_rows())[i] = pack8<E>(er);
    }
    if (threadIdx.x < kD) a[at.channels() + threadIdx.x] = __expf(Gl[threadIdx.x]);
    __syncthreads();
    to_steps(sG);
    __syncthreads();
    each_tile([&](Acc& acc, bool keys, int I, int J) {
      const E* Xm = ref(X, kSub * I);
      product_tile<false, true>(acc, keys ? Y : Xm, S::ld, Xm, S::ld, I, J, 0, kD / 16);
    });
    float kf[8], sums[8], sums_kk[8];  // kf: the column's key k[j] times exp(G[i] - G[j]), step by step
#pragma unroll
    for (int t = 0; t <= kSub; ++t) {
      int i, j;
      step(t, i, j);
      const int c = de * 8;
      if (i == j) {
        unpack8<E>(*reinterpret_cast<const uint4*>(sk + j * S::ld + c), kf);
      } else {
        float st[8];
        load8(sG + i * S::ld32 + c, st);
#pragma unroll
        for (int d = 0; d < 8; ++d) kf[d] *= st[d];
      }
      float x[8], sum = 0.f, sum_kk = 0.f;
      unpack8<E>(*reinterpret_cast<const uint4*>(sq + i * S::ld + c), x);
#pragma unroll
      for (int d = 0; d < 8; ++d) sum += x[d] * kf[d];
      if constexpr (Pair) {
        unpack8<E>(*reinterpret_cast<const uint4*>(sk + i * S::ld + c), x);
#pragma unroll
        for (int d = 0; d < 8; ++d) sum_kk += x[d] * kf[d];
      }
      if (t == kSub) {  // the last step alone
        kept[2] += sum8(sum);
        if constexpr (Pair) kept_kk[2] += sum8(sum_kk);
      } else {
        sums[t % 8] = sum, sums_kk[t % 8] = sum_kk;
        if (t % 8 == 7) {  // steps t - 7 .. t: lane e keeps step t - 7 + e's
          kept[t / 8] += scatter_sums8(sums);
          if constexpr (Pair) kept_kk[t / 8] += scatter_sums8(sums_kk);
        }
      }
    }
  }
  each_tile([&](Acc& acc, bool keys, int I, int J) {
    if (!keys) scale_tile(acc, scale);
    store_tile16((keys ? Akk : A) + at.square() + I * kSub * kC + J * kSub, acc, kC);
  });
  auto put = [&](E* out, int i, int j, float x) { out[(dr0 + i % kSub) * kSub + j % kSub] = from_float<E>(x); };
#pragma unroll
  for (int b = 0; b < 3; ++b) {  // steps 8b + e (b = 0, 1) and 16 (lane 0)
    if (b == 2 && de != 0) continue;
    int i, j;
    step(b < 2 ? 8 * b + de : kSub, i, j);
    put(diag, i, j, kept[b] * scale);
    if constexpr (Pair) put(diag_kk, i, j, kept_kk[b]);
  }
  __syncthreads();
  store_diagonal_and_zeros(A + at.square(), diag);
  if constexpr (Pair) store_diagonal_and_zeros(Akk + at.square(), diag_kk);
}

// dA's blocks below the diagonal through the reference rows, times `factor`, 24 tiles over the warps:
//   row side    (rows of sub-chunks 1..3)  dA_{I,<I} X_m(rows < m),           m = 16 I
//   column side (rows of sub-chunks 0..2)  dA_{>J,J}^T X_m(rows >= m),        m = 16 (J + 1)
// into fp32 [64, ld32] each (the rows no block reaches are not written); with add_cols the column side is
// added to what cols_side holds (each tile goes to the same warp in every call).
template <typename E>
__device__ void side_products(const E* sdA, const E* X, float* rows_side, float* cols_side, float factor,
                              bool add_cols = false) {
  for (int t = threadIdx.x / 32; t < 24; t += kWarps) {
    const bool row = t < 12;
    const int R = (t % 12) / (kD / 16), Cc = (t % 12) % (kD / 16);
    const int I = row ? R + 1 : R;  // the sub-chunk whose rows the tile is
    Acc acc;
    zero(acc);
    if (row) product_tile<false, false>(acc, sdA, Pads::ld, ref(X, kSub * I), Pads::ld, I, Cc, 0, I);
    else product_tile<true, false>(acc, sdA, Pads::ld, ref(X, kSub * (I + 1)), Pads::ld, I, Cc, I + 1, kRowTiles);
    scale_tile(acc, factor);
    float* out = (row ? rows_side : cols_side) + I * kSub * Pads::ld32 + Cc * kSub;
    if (!row && add_cols) {
      Acc before;
      load_tile(before, out, Pads::ld32);
#pragma unroll
      for (int e = 0; e < Acc::num_elements; ++e) acc.x[e] += before.x[e];
    }
    store_tile(out, acc, Pads::ld32);
  }
}

// The gradients of q, k and g of chunk blockIdx.x in part blockIdx.y % parts of head blockIdx.y / parts;
// with Pair also through the key-key scores and ek. The parts share the scores' gradients dA and dAkk.
template <typename E, bool Pair>
__global__ void __launch_bounds__(kThreads, 2)
    vector_scores_backward_kernel(const E* __restrict__ q, const E* __restrict__ k, const float* __restrict__ g,
                                  const E* __restrict__ dA, const E* __restrict__ dqd, const E* __restrict__ dkd,
                                  const float* __restrict__ da, const E* __restrict__ dAkk, const E* __restrict__ dek,
                                  E* __restrict__ dq, E* __restrict__ dk, float* __restrict__ dg, int N, int T, int H,
                                  int parts, float scale) {
  using S = BackwardSmem<Pair>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, S::q), *sk = view<E>(smem, S::k), *X = view<E>(smem, S::X), *sdA = view<E>(smem, S::dA);
  E* dkk = view<E>(smem, S::diag_kk);  // [4, 16, 16]: dAkk's diagonal blocks
  float *sG = view<float>(smem, S::G), *P1 = view<float>(smem, S::rows_side), *P2 = view<float>(smem, S::cols_side);
  Chunk at(N, T, H, parts, blockIdx.y / parts);
  at.to_part(blockIdx.y % parts);
  // Global loads are issued well before their data is needed: dA while the chunk's rows come in, the walk's
  // gradients dqd and dkd while the reference rows and the products are computed (they then take X's place).
  RowPrefetch<kC, E> rA;
  rA.fetch_lower(dA + at.square());
  load_chunk(sq, sk, sG, P2, q, k, g, at);  // the products come later
  rA.put(sdA, S::ld);
  RowPrefetch<kD, E> rdq, rdk;
  rdq.fetch(dqd + at.rows(), at.K(), 0, kC), rdk.fetch(dkd + at.rows(), at.K(), 0, kC);
  E *sdqd = X, *sdkd = ref(X, 32);
  if (Pair && threadIdx.x < kRowTiles * kSub * 2) {  // two 16-byte words per row of a diagonal block
    const int I = threadIdx.x / (2 * kSub), i = (threadIdx.x / 2) % kSub, h = threadIdx.x % 2;
    *reinterpret_cast<uint4*>(dkk + (I * kSub + i) * kSub + 8 * h) =
        *reinterpret_cast<const uint4*>(dAkk + at.square() + (I * kSub + i) * kC + I * kSub + 8 * h);
  }
  __syncthreads();
  reference_rows(X, sq, sk, sG, RefSpans{{0, 0, 0}, {64, 64, 64}});
  __syncthreads();
  side_products(sdA, X, P1, P2, scale);
  __syncthreads();
  rdq.put(sdqd, S::ld), rdk.put(sdkd, S::ld);
  // Thread (I, d): the diagonal block of sub-chunk I in channel d, then its rows' results. x: the row side
  // of q's gradient, xk of k's (dAkk's), y the column side of k's (both). The factors exp(G[i] - G[j]) are
  // products of the per-step factors e^{G[r] - G[r-1]} over rows j+1 .. i, as in the forward (column by
  // column; each sum still takes its terms in the order of increasing i and j).
  const int I = threadIdx.x / kD, d = threadIdx.x % kD, r0 = I * kSub;
  float qc[kSub], kc[kSub], gc[kSub], x[kSub], xk[kSub], y[kSub], step[kSub];
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    qc[i] = to_float(sq[(r0 + i) * S::ld + d]), kc[i] = to_float(sk[(r0 + i) * S::ld + d]);
    gc[i] = sG[(r0 + i) * S::ld32 + d];
    x[i] = 0.f, xk[i] = 0.f, y[i] = 0.f;
    step[i] = i > 0 ? __expf(gc[i] - gc[i - 1]) : 1.f;
  }
#pragma unroll
  for (int j = 0; j < kSub; ++j) {
    float e = 1.f;
#pragma unroll
    for (int i = j; i < kSub; ++i) {
      if (i > j) e *= step[i];
      const float w = scale * to_float(sdA[(r0 + i) * S::ld + r0 + j]) * e;
      x[i] += w * kc[j];
      y[j] += w * qc[i];
      if constexpr (Pair) {
        const float wk = to_float(dkk[(I * kSub + i) * kSub + j]) * e;
        xk[i] += wk * kc[j];
        y[j] += wk * kc[i];
      }
    }
  }
  __syncthreads();  // dqd and dkd are in place
  // With the key-key scores, the rows' q, k and gates are read again from shared memory after the barrier
  // instead of being held in registers through the second pass (which spilled).
  auto q_of = [&](int i) { return Pair ? to_float(sq[(r0 + i) * S::ld + d]) : qc[i]; };
  auto k_of = [&](int i) { return Pair ? to_float(sk[(r0 + i) * S::ld + d]) : kc[i]; };
  auto g_of = [&](int i) { return Pair ? sG[(r0 + i) * S::ld32 + d] : gc[i]; };
  const float g_after = I < kRowTiles - 1 ? sG[(r0 + kSub) * S::ld32 + d] : 0.f;  // reference of the column side
  const float g_start = sG[r0 * S::ld32 + d];                                      // reference of the row side
  const float g_last = sG[(kC - 1) * S::ld32 + d];
  // The products back to each row by the reference's factor: the row side into `rows`, and with `cols` the
  // column side into y (with the key-key scores the second pass adds both passes' column sides at once).
  auto add_sides = [&](float(&rows)[kSub], bool cols) {
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int r = r0 + i;
      if (I > 0) rows[i] += P1[r * S::ld32 + d] * __expf(g_of(i) - g_start);
      if (cols && I < kRowTiles - 1) y[i] += P2[r * S::ld32 + d] * __expf(g_after - g_of(i));
    }
  };
  add_sides(x, !Pair);
  float kd_dkd = 0.f;  // Σ over this thread's rows of kd ⊙ dkd
  float dG[kSub];
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    const int r = r0 + i;
    const float ekd = __expf(g_last - g_of(i)), dkd_r = to_float(sdkd[r * S::ld + d]);
    x[i] += scale * __expf(g_of(i)) * to_float(sdqd[r * S::ld + d]);
    y[i] += ekd * dkd_r;
    kd_dkd += kc[i] * ekd * dkd_r;
    if (at.live(r)) dq[at.row(r) + d] = from_float<E>(x[i]);
    dG[i] = q_of(i) * x[i];
  }
  if constexpr (Pair) {  // the same products again for dAkk, with the keys from row m on
    RowPrefetch<kD, E> rdek;
    rA.fetch_lower(dAkk + at.square()), rdek.fetch(dek + at.part_rows(), kD, 0, kC);
    __syncthreads();  // the products, dA, dqd and dkd are read
    // X_16 and X_32 whole again (dqd and dkd took their place), X_48 from row 48 on.
    reference_rows(X, sk, sk, sG, RefSpans{{0, 0, 48}, {64, 64, 64}});
    rA.put(sdA, S::ld);
    __syncthreads();
    side_products(sdA, X, P1, P2, 1.f, /*add_cols=*/true);
    __syncthreads();
    rdek.put(sdqd, S::ld);
    __syncthreads();
    add_sides(xk, true);
#pragma unroll
    for (int i = 0; i < kSub; ++i) xk[i] += __expf(g_of(i)) * to_float(sdqd[(r0 + i) * S::ld + d]);
  }
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    if (at.live(r0 + i)) dk[at.row(r0 + i) + d] = from_float<E>(xk[i] + y[i]);
    dG[i] += k_of(i) * (xk[i] - y[i]);
  }
  // Row 63 also carries Gl: Σ_r kd ⊙ dkd over the whole chunk and a ⊙ da.
  float *sums = P1, *totals = P2;  // the products are read
  __syncthreads();
  sums[I * kD + d] = kd_dkd;
  __syncthreads();
  if (I == kRowTiles - 1) {
    dG[kSub - 1] += __expf(g_last) * da[at.channels() + d];
#pragma unroll
    for (int j = 0; j < kRowTiles; ++j) dG[kSub - 1] += sums[j * kD + d];
  }
  // dg = the reverse sum of dG within the chunk: this thread's rows after the sub-chunks behind it.
  float own = 0.f;
#pragma unroll
  for (int i = 0; i < kSub; ++i) own += dG[i];
  totals[I * kD + d] = own;
  __syncthreads();
  float run = 0.f;
  for (int J = I + 1; J < kRowTiles; ++J) run += totals[J * kD + d];
#pragma unroll
  for (int i = kSub - 1; i >= 0; --i) {
    run += dG[i];
    if (at.live(r0 + i)) dg[at.row(r0 + i) + d] = run;
  }
}

// x must have these sizes and dtype and be contiguous.
void check_rows(const torch::Tensor& x, torch::IntArrayRef sizes, torch::ScalarType dt, const char* name) {
  TORCH_CHECK(x.sizes() == sizes && x.scalar_type() == dt && x.is_contiguous(), "fused vector-decay scores: ", name,
              " must be ", sizes, " ", dt, " contiguous; got ", x.sizes(), " ", x.scalar_type());
}

// q, k [B,T,H,K] with K = 64 parts (one 16-bit dtype), g the same in fp32.
struct Shape {
  int64_t B, T, H, N, parts;
  int64_t BH() const { return B * H; }
  int64_t K() const { return kD * parts; }
  std::vector<int64_t> walk_rows() const { return {B, H, N * kC, K()}; }
  std::vector<int64_t> part_rows() const { return {B, H * parts, N * kC, kD}; }
};

Shape shape_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g) {
  TORCH_CHECK(q.dim() == 4 && q.size(3) > 0 && q.size(3) % kD == 0 &&
                  vector_decay_chunk_supported(kD, kD, q.scalar_type()) && q.is_contiguous(),
              "fused vector-decay scores: expects q [B,T,H,K] with K a multiple of 64, bf16 or fp16, contiguous; "
              "got ", q.sizes(), " ", q.scalar_type());
  const int64_t parts = q.size(3) / kD;
  TORCH_CHECK(q.size(0) * q.size(2) * parts <= 65535,
              "fused vector-decay scores: at most 65535 (batch, head, 64-channel part) triples");
  check_rows(k, q.sizes(), q.scalar_type(), "k");
  check_rows(g, q.sizes(), torch::kFloat, "g");
  const int64_t T = q.size(1);
  return Shape{q.size(0), T, q.size(2), (T + kC - 1) / kC, parts};
}

}  // namespace

VectorScoresForward vector_scores_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                          double scale, bool key_scores) {
  const Shape p = shape_of(q, k, g);
  const c10::cuda::CUDAGuard guard(q.device());
  VectorScoresForward out;
  out.A = torch::empty({p.B, p.H, p.N, kC, kC}, q.options());
  out.qd = torch::empty(p.walk_rows(), q.options());
  out.kd = torch::empty(p.walk_rows(), q.options());
  out.a = torch::empty({p.B, p.H, p.N, p.K()}, g.options());
  if (key_scores) {
    out.Akk = torch::empty_like(out.A);
    out.ek = torch::empty(p.part_rows(), q.options());
  }
  if (p.N == 0 || p.BH() == 0) return out;
  const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.BH()));
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    auto args = [&](auto kernel, size_t smem) {
      launch(kernel, grid, kThreads, smem, data_as<E>(q), data_as<E>(k), g.data_ptr<float>(), data_as<E>(out.A),
          data_as<E>(out.qd), data_as<E>(out.kd), out.a.data_ptr<float>(),
          key_scores ? data_as<E>(out.Akk) : nullptr, key_scores ? data_as<E>(out.ek) : nullptr,
          static_cast<int>(p.N), static_cast<int>(p.T), static_cast<int>(p.H), static_cast<int>(p.parts),
          static_cast<float>(scale));
    };
    const bool one = p.parts == 1;
    if (key_scores) {
      args(one ? vector_scores_forward_kernel<E, true, true> : vector_scores_forward_kernel<E, true, false>,
           ForwardSmem<true>::bytes);
    } else {
      args(one ? vector_scores_forward_kernel<E, false, true> : vector_scores_forward_kernel<E, false, false>,
           ForwardSmem<false>::bytes);
    }
  });
  return out;
}

VectorScoresGrads vector_scores_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                         const torch::Tensor& dA, const torch::Tensor& dqd, const torch::Tensor& dkd,
                                         const torch::Tensor& da, double scale, const torch::Tensor& dAkk,
                                         const torch::Tensor& dek) {
  const Shape p = shape_of(q, k, g);
  check_rows(dA, {p.B, p.H, p.N, kC, kC}, q.scalar_type(), "dA");
  check_rows(dqd, p.walk_rows(), q.scalar_type(), "dqd (the walk's rows)");
  check_rows(dkd, p.walk_rows(), q.scalar_type(), "dkd (the walk's rows)");
  check_rows(da, {p.B, p.H, p.N, p.K()}, torch::kFloat, "da");
  const bool key_scores = dAkk.defined();
  TORCH_CHECK(key_scores == dek.defined(), "fused vector-decay scores: dAkk and dek come together or not at all");
  if (key_scores) {
    check_rows(dAkk, {p.B, p.H, p.N, kC, kC}, q.scalar_type(), "dAkk");
    check_rows(dek, p.part_rows(), q.scalar_type(), "dek (by part)");
  }
  const c10::cuda::CUDAGuard guard(q.device());
  VectorScoresGrads out;
  out.dq = torch::empty_like(q);
  out.dk = torch::empty_like(k);
  out.dg = torch::empty_like(g);
  if (p.N == 0 || p.BH() == 0) return out;
  const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.BH() * p.parts));
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    auto args = [&](auto kernel, size_t smem) {
      launch(kernel, grid, kThreads, smem, data_as<E>(q), data_as<E>(k), g.data_ptr<float>(), data_as<E>(dA),
          data_as<E>(dqd), data_as<E>(dkd), da.data_ptr<float>(), key_scores ? data_as<E>(dAkk) : nullptr,
          key_scores ? data_as<E>(dek) : nullptr, data_as<E>(out.dq), data_as<E>(out.dk), out.dg.data_ptr<float>(),
          static_cast<int>(p.N), static_cast<int>(p.T), static_cast<int>(p.H), static_cast<int>(p.parts),
          static_cast<float>(scale));
    };
    if (key_scores) args(vector_scores_backward_kernel<E, true>, BackwardSmem<true>::bytes);
    else args(vector_scores_backward_kernel<E, false>, BackwardSmem<false>::bytes);
  });
  return out;
}

}  // namespace linearize::ops::cuda_kernels
