// Family A with a decay per key channel (GLA), head size 64: the intra-chunk scores of the chunked
// form and their backward, one thread block per (chunk, batch*head), chunks of 64 rows:
//   A[i, j] = scale Σ_d q[i, d] k[j, d] exp(G[i, d] - G[j, d])   for j <= i, 0 above
// with G the chunk-local cumulative log decay (fp32), summed here from the raw per-step log decay g. The
// chunk splits into four sub-chunks of 16 rows.
// A block below the diagonal (sub-chunks I > J) is a tensor-core product through the reference row
// m = 16 I, where both factors stay <= 1:
//   X_m[r, d] = k[r, d] exp(G[m, d] - G[r, d])  for r < m,   q[r, d] exp(G[r, d] - G[m, d])  for r >= m
//   A_IJ = scale X_m(rows of I) X_m(rows of J)^T,   m = 16 I
// The four diagonal blocks are fp32 sums; the forward takes their factors exp(G[i, d] - G[j, d]) as products
// of the per-step decays exp(G[r, d] - G[r-1, d]) <= 1 over rows j+1 .. i, the backward one by one.
// Backward, given dA (16-bit):
//   dq_I = scale (exp(G_I - G_m) ⊙ dA_{I,<I} X_m(rows < m)) + the diagonal part,     m = 16 I
//   dk_J = scale (exp(G_m - G_J) ⊙ dA_{>J,J}^T X_m(rows >= m)) + the diagonal part,  m = 16 (J + 1)
//   dG   = q ⊙ dq - k ⊙ dk   (every term of A carries exp(G_i - G_j); the diagonal's i = j cancels)
// The same kernels give the walk's row factors (chunk_vector_decay.cu), with Gl = G[63]:
//   qd = scale e^G ⊙ q,   kd = e^{Gl - G} ⊙ k,   a = e^{Gl}
// and take their gradients back: dq += scale e^G ⊙ dqd, dk += e^{Gl - G} ⊙ dkd, then dG = q ⊙ dq - k ⊙ dk
// with both sums whole, plus Σ_r kd ⊙ dkd + a ⊙ da at row 63 (Gl); the gate's gradient is dG's reverse
// sum within the chunk, dg[r] = Σ_{s >= r} dG[s] (rows past T included: row 63 carries Gl).
// q, k, g and their gradients are the caller's rows [B, T, H, 64] (q, k 16-bit, g fp32; zeros past T
// on the way in, nothing written past T on the way out). What goes to the walk is heads first and
// padded to whole chunks: qd, kd and their gradients [B*H, N*64, 64] (16-bit); A, dA [B*H, N, 64, 64]
// (16-bit, zeros above the diagonal); a, da [B*H, N, 64] fp32.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kD = 64;     // head size
constexpr int kSub = 16;   // rows per sub-chunk
constexpr int kRefs = 3;   // reference rows 16, 32, 48

using Pads = Pads64;

// Forward: q, k, X_16, X_32, X_48 (16-bit), G and the scores (fp32). About 79 KiB.
struct ForwardSmem : Pads {
  static constexpr size_t q = 0, k = q + rows16, X = k + rows16, G = X + kRefs * rows16, stage = G + mat32;
  static constexpr size_t bytes = stage + mat32;
};

// Backward: q, k, X_16, X_32, X_48, dA (16-bit), G, the products for dq and for dk (fp32). About 105 KiB.
struct BackwardSmem : Pads {
  static constexpr size_t q = 0, k = q + rows16, X = k + rows16, dA = X + kRefs * rows16, G = dA + rows16;
  static constexpr size_t dq = G + mat32, dk = dq + mat32, bytes = dk + mat32;
};

// Where block (chunk n, head bh = b H + h) reads and writes: the caller's rows t0 .. t0 + 63 of head
// (b, h) in [B, T, H, 64] (row stride H*64), the walk's rows in [B*H, N*64, 64], squares in
// [B*H, N, 64, 64].
struct Chunk {
  size_t head;  // row 0 of head (b, h) in [B, T, H, 64]
  int stride, t0, T, N;
  __device__ Chunk(int N_, int T_, int H) {
    const int bh = blockIdx.y;
    stride = H * kD, t0 = blockIdx.x * kC, T = T_, N = N_;
    head = (static_cast<size_t>(bh / H) * T_ * H + bh % H) * kD;
  }
  __device__ bool live(int r) const { return t0 + r < T; }
  __device__ size_t row(int r) const { return head + static_cast<size_t>(t0 + r) * stride; }  // caller's layout
  __device__ size_t index() const { return static_cast<size_t>(blockIdx.y) * N + blockIdx.x; }  // (bh, n)
  __device__ size_t rows() const { return index() * kC * kD; }                                   // walk's rows
  __device__ size_t square() const { return index() * kC * kC; }
  __device__ size_t channels() const { return index() * kD; }                                    // [B*H, N, 64]
};

// The chunk's q, k rows (16-bit) and G (fp32) into shared memory, zeros past T: G is the inclusive
// cumulative sum of g within the chunk, thread (sub-chunk I, channel d) summing its 16 rows after the
// totals of the sub-chunks before it (`totals`: 4 x 64 floats of scratch).
template <typename E>
__device__ void load_chunk(E* sq, E* sk, float* sG, float* totals, const E* __restrict__ q,
                           const E* __restrict__ k, const float* __restrict__ g, const Chunk& at) {
  RowPrefetch<kD, E> rq, rk;
  rq.fetch(q + at.head, at.stride, at.t0, at.T), rk.fetch(k + at.head, at.stride, at.t0, at.T);
  rq.put(sq, Pads::ld), rk.put(sk, Pads::ld);
  for (int i = threadIdx.x; i < kC * kD / 4; i += kThreads) {
    const int r = i / (kD / 4), c = (i % (kD / 4)) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (at.live(r)) x = *reinterpret_cast<const float4*>(g + at.row(r) + c);
    *reinterpret_cast<float4*>(sG + r * Pads::ld32 + c) = x;
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

// X_m for m = 16, 32, 48 (X + (m/16 - 1) * C * ld): keys before row m decayed up to it, queries from row
// m on decayed from it.
template <typename E>
__device__ void reference_rows(E* X, const E* sq, const E* sk, const float* sG) {
  for (int i = threadIdx.x; i < kRefs * kC * kD / 8; i += kThreads) {
    const int which = i / (kC * kD / 8), e = i % (kC * kD / 8), r = e / (kD / 8), c = (e % (kD / 8)) * 8;
    const int m = (which + 1) * kSub;
    const bool key = r < m;
    float x[8], out[8];
    unpack8<E>(*reinterpret_cast<const uint4*>((key ? sk : sq) + r * Pads::ld + c), x);
    const float* gr = sG + r * Pads::ld32 + c;
    const float* gm = sG + m * Pads::ld32 + c;
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = x[j] * __expf(key ? gm[j] - gr[j] : gr[j] - gm[j]);
    *reinterpret_cast<uint4*>(X + which * kC * Pads::ld + r * Pads::ld + c) = pack8<E>(out);
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

template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    vector_scores_forward_kernel(const E* __restrict__ q, const E* __restrict__ k, const float* __restrict__ g,
                                 E* __restrict__ A, E* __restrict__ qd, E* __restrict__ kd, float* __restrict__ a,
                                 int N, int T, int H, float scale) {
  using S = ForwardSmem;
  extern __shared__ __align__(128) unsigned char smem[];
  E *sq = view<E>(smem, S::q), *sk = view<E>(smem, S::k), *X = view<E>(smem, S::X);
  float *sG = view<float>(smem, S::G), *stage = view<float>(smem, S::stage);
  const Chunk at(N, T, H);
  load_chunk(sq, sk, sG, stage, q, k, g, at);  // the staging area is free until the products
  __syncthreads();
  reference_rows(X, sq, sk, sG);
  // The walk's row factors.
  const float* Gl = sG + (kC - 1) * S::ld32;
  for (int i = threadIdx.x; i < kC * kD / 8; i += kThreads) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    float qr[8], kr[8], g[8];
    unpack8<E>(*reinterpret_cast<const uint4*>(sq + r * S::ld + c), qr);
    unpack8<E>(*reinterpret_cast<const uint4*>(sk + r * S::ld + c), kr);
    load8(sG + r * S::ld32 + c, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) qr[j] *= scale * __expf(g[j]), kr[j] *= __expf(Gl[c + j] - g[j]);
    reinterpret_cast<uint4*>(qd + at.rows())[i] = pack8<E>(qr);
    reinterpret_cast<uint4*>(kd + at.rows())[i] = pack8<E>(kr);
  }
  if (threadIdx.x < kD) a[at.channels() + threadIdx.x] = __expf(Gl[threadIdx.x]);
  __syncthreads();
  to_steps(sG);
  __syncthreads();
  // Blocks below the diagonal, one warp each: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
  const int warp = threadIdx.x / 32;
  if (warp < 6) {
    const int I = warp < 1 ? 1 : warp < 3 ? 2 : 3, J = warp - (I * (I - 1)) / 2;
    const E* Xm = X + (I - 1) * kC * S::ld;
    Acc acc;
    zero(acc);
    product_tile<false, true>(acc, Xm, S::ld, Xm, S::ld, I, J, 0, kD / 16);
    store_tile(stage + I * kSub * S::ld32 + J * kSub, acc, S::ld32);
  }
  // The diagonal blocks, in fp32 from the per-step factors e^{G[r] - G[r-1]} (<= 1; below, sG holds them from
  // each sub-chunk's second row on): exp(G[i] - G[j]) is their product over rows j+1 .. i. Thread (I, p, e):
  // sub-chunk I, columns p and 15 - p (16 - p and p + 1 rows: 17 together), channels 8e .. 8e + 7, the sum
  // over channels across the 8 lanes of (I, p).
  const int lane = threadIdx.x % 32;
  {
    const int I = warp / 2, p = (warp % 2) * 4 + lane / 8, c = (lane % 8) * 8, r0 = I * kSub;
    int j = r0 + p, i = j;
    float kj[8], f[8];
    unpack8<E>(*reinterpret_cast<const uint4*>(sk + j * S::ld + c), kj);
#pragma unroll
    for (int d = 0; d < 8; ++d) f[d] = 1.f;
    for (int t = 0; t <= kSub; ++t, ++i) {
      if (t == kSub - p) {  // column 15 - p, from its diagonal down
        j = r0 + kSub - 1 - p, i = j;
        unpack8<E>(*reinterpret_cast<const uint4*>(sk + j * S::ld + c), kj);
#pragma unroll
        for (int d = 0; d < 8; ++d) f[d] = 1.f;
      } else if (i > j) {
        float st[8];
        load8(sG + i * S::ld32 + c, st);
#pragma unroll
        for (int d = 0; d < 8; ++d) f[d] *= st[d];
      }
      float qi[8], sum = 0.f;
      unpack8<E>(*reinterpret_cast<const uint4*>(sq + i * S::ld + c), qi);
#pragma unroll
      for (int d = 0; d < 8; ++d) sum += qi[d] * kj[d] * f[d];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      if (lane % 8 == 0) stage[i * S::ld32 + j] = sum;
    }
  }
  __syncthreads();
  store_lower16(A + at.square(), stage, S::ld32, scale);
}

template <typename E>
__global__ void __launch_bounds__(kThreads, 2)
    vector_scores_backward_kernel(const E* __restrict__ q, const E* __restrict__ k, const float* __restrict__ g,
                                  const E* __restrict__ dA, const E* __restrict__ dqd, const E* __restrict__ dkd,
                                  const float* __restrict__ da, E* __restrict__ dq, E* __restrict__ dk,
                                  float* __restrict__ dg, int N, int T, int H, float scale) {
  using S = BackwardSmem;
  extern __shared__ __align__(128) unsigned char smem[];
  E *sq = view<E>(smem, S::q), *sk = view<E>(smem, S::k), *X = view<E>(smem, S::X), *sdA = view<E>(smem, S::dA);
  float *sG = view<float>(smem, S::G), *pq = view<float>(smem, S::dq), *pk = view<float>(smem, S::dk);
  const Chunk at(N, T, H);
  load_chunk(sq, sk, sG, pk, q, k, g, at);  // the dk products come later
  for (int i = threadIdx.x; i < kC * kC / 8; i += kThreads) {
    const int r = i / (kC / 8), c = (i % (kC / 8)) * 8;
    *reinterpret_cast<uint4*>(sdA + r * S::ld + c) = reinterpret_cast<const uint4*>(dA + at.square())[i];
  }
  __syncthreads();
  reference_rows(X, sq, sk, sG);
  __syncthreads();
  // Products below the diagonal: dq rows of sub-chunks 1..3 (12 tiles), dk rows of sub-chunks 0..2 (12).
  for (int t = threadIdx.x / 32; t < 24; t += kWarps) {
    const bool for_q = t < 12;
    const int R = (t % 12) / (kD / 16), Cc = (t % 12) % (kD / 16);
    Acc acc;
    zero(acc);
    if (for_q) {  // sub-chunk I = R + 1 against the keys before it, reference 16 I
      const int I = R + 1;
      product_tile<false, false>(acc, sdA, S::ld, X + (I - 1) * kC * S::ld, S::ld, I, Cc, 0, I);
      store_tile(pq + I * kSub * S::ld32 + Cc * kSub, acc, S::ld32);
    } else {  // sub-chunk J = R against the queries after it, reference 16 (J + 1)
      const int J = R;
      product_tile<true, false>(acc, sdA, S::ld, X + J * kC * S::ld, S::ld, J, Cc, J + 1, kRowTiles);
      store_tile(pk + J * kSub * S::ld32 + Cc * kSub, acc, S::ld32);
    }
  }
  __syncthreads();
  // Thread (I, d): the diagonal block of sub-chunk I in channel d, then its rows' results.
  const int I = threadIdx.x / kD, d = threadIdx.x % kD, r0 = I * kSub;
  float qc[kSub], kc[kSub], gc[kSub], dq_acc[kSub], dk_acc[kSub];
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    qc[i] = to_float(sq[(r0 + i) * S::ld + d]), kc[i] = to_float(sk[(r0 + i) * S::ld + d]);
    gc[i] = sG[(r0 + i) * S::ld32 + d];
    dq_acc[i] = 0.f, dk_acc[i] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
#pragma unroll
    for (int j = 0; j <= i; ++j) {
      const float w = to_float(sdA[(r0 + i) * S::ld + r0 + j]) * __expf(gc[i] - gc[j]);
      dq_acc[i] += w * kc[j];
      dk_acc[j] += w * qc[i];
    }
  }
  const float g_after = I < kRowTiles - 1 ? sG[(r0 + kSub) * S::ld32 + d] : 0.f;  // reference of the dk products
  const float g_start = sG[r0 * S::ld32 + d];                                      // reference of the dq products
  const float g_last = sG[(kC - 1) * S::ld32 + d];
  float kd_dkd = 0.f;  // Σ over this thread's rows of kd ⊙ dkd
  float dG[kSub];
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    const int r = r0 + i;
    const size_t walk_row = at.rows() + static_cast<size_t>(r) * kD + d;
    float x = dq_acc[i], y = dk_acc[i];
    if (I > 0) x += pq[r * S::ld32 + d] * __expf(gc[i] - g_start);
    if (I < kRowTiles - 1) y += pk[r * S::ld32 + d] * __expf(g_after - gc[i]);
    const float eq = scale * __expf(gc[i]), ek = __expf(g_last - gc[i]), dkd_r = to_float(dkd[walk_row]);
    x = x * scale + eq * to_float(dqd[walk_row]);
    y = y * scale + ek * dkd_r;
    kd_dkd += kc[i] * ek * dkd_r;
    if (at.live(r)) {
      dq[at.row(r) + d] = from_float<E>(x);
      dk[at.row(r) + d] = from_float<E>(y);
    }
    dG[i] = qc[i] * x - kc[i] * y;
  }
  // Row 63 also carries Gl: Σ_r kd ⊙ dkd over the whole chunk and a ⊙ da.
  float *sums = pq, *totals = pk;  // the products are read
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

// q, k [B,T,H,64] (one 16-bit dtype), g the same in fp32.
struct Shape {
  int64_t B, T, H, N;
  int64_t BH() const { return B * H; }
  std::vector<int64_t> walk_rows() const { return {B, H, N * kC, kD}; }
};

Shape shape_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g) {
  TORCH_CHECK(q.dim() == 4 && q.size(3) == kD && vector_decay_chunk_supported(kD, kD, q.scalar_type()) &&
                  q.is_contiguous(),
              "fused vector-decay scores: expects q [B,T,H,64] bf16 or fp16, contiguous; got ", q.sizes(), " ",
              q.scalar_type());
  TORCH_CHECK(q.size(0) * q.size(2) <= 65535, "fused vector-decay scores: at most 65535 (batch, head) pairs");
  check_rows(k, q.sizes(), q.scalar_type(), "k");
  check_rows(g, q.sizes(), torch::kFloat, "g");
  const int64_t T = q.size(1);
  return Shape{q.size(0), T, q.size(2), (T + kC - 1) / kC};
}

}  // namespace

VectorScoresForward vector_scores_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                          double scale) {
  const Shape p = shape_of(q, k, g);
  const c10::cuda::CUDAGuard guard(q.device());
  VectorScoresForward out;
  out.A = torch::empty({p.B, p.H, p.N, kC, kC}, q.options());
  out.qd = torch::empty(p.walk_rows(), q.options());
  out.kd = torch::empty(p.walk_rows(), q.options());
  out.a = torch::empty({p.B, p.H, p.N, kD}, g.options());
  if (p.N == 0 || p.BH() == 0) return out;
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    auto kernel = vector_scores_forward_kernel<E>;
    constexpr size_t smem = ForwardSmem::bytes;
    const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.BH()));
    launch(kernel, grid, kThreads, smem,
        data_as<E>(q), data_as<E>(k), g.data_ptr<float>(), data_as<E>(out.A), data_as<E>(out.qd), data_as<E>(out.kd),
        out.a.data_ptr<float>(), static_cast<int>(p.N), static_cast<int>(p.T), static_cast<int>(p.H),
        static_cast<float>(scale));
  });
  return out;
}

VectorScoresGrads vector_scores_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& g,
                                         const torch::Tensor& dA, const torch::Tensor& dqd, const torch::Tensor& dkd,
                                         const torch::Tensor& da, double scale) {
  const Shape p = shape_of(q, k, g);
  check_rows(dA, {p.B, p.H, p.N, kC, kC}, q.scalar_type(), "dA");
  check_rows(dqd, p.walk_rows(), q.scalar_type(), "dqd (the walk's rows)");
  check_rows(dkd, p.walk_rows(), q.scalar_type(), "dkd (the walk's rows)");
  check_rows(da, {p.B, p.H, p.N, kD}, torch::kFloat, "da");
  const c10::cuda::CUDAGuard guard(q.device());
  VectorScoresGrads out;
  out.dq = torch::empty_like(q);
  out.dk = torch::empty_like(k);
  out.dg = torch::empty_like(g);
  if (p.N == 0 || p.BH() == 0) return out;
  dispatch_16bit(q.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    auto kernel = vector_scores_backward_kernel<E>;
    constexpr size_t smem = BackwardSmem::bytes;
    const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.BH()));
    launch(kernel, grid, kThreads, smem,
        data_as<E>(q), data_as<E>(k), g.data_ptr<float>(), data_as<E>(dA), data_as<E>(dqd), data_as<E>(dkd),
        da.data_ptr<float>(), data_as<E>(out.dq), data_as<E>(out.dk), out.dg.data_ptr<float>(), static_cast<int>(p.N),
        static_cast<int>(p.T), static_cast<int>(p.H), static_cast<float>(scale));
  });
  return out;
}

}  // namespace linearize::ops::cuda_kernels
