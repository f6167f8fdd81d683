// A decay per key channel: the walk over the chunks of 64, fused, for GLA (the GLA family) and
// for Kimi Delta Attention (the delta rule, the delta rule: Delta = true). The chunk-parallel parts come from
// elsewhere: the intra-chunk scores A and the row factors qd, kd and a from vector_decay_scores.cu (see
// ops/gla/fused_vector_chunk.cpp), and for the delta rule the UT transform's W and U
// (ops/delta_rule/fused_vector_chunk.cpp). With G the chunk-local cumulative log decay [C, K]
// (every exponent below is <= 0):
//   qd = scale e^G ⊙ q,   kd = e^{Gl - G} ⊙ k,   a = e^{Gl} (one factor per key channel)
// and S the state entering the chunk (fp32 [K, V], read by the products through a 16-bit copy):
//   o  = qd S + A v
//   S' = Diag(a) S + kd^T v
// The forward also stores S for every chunk (16-bit). The backward walks the chunks in reverse with dS'
// (the gradient of S'):
//   dA  = do v^T on and below the diagonal (zeros above)
//   dv  = A^T do + kd dS'
//   dqd = do S^T,   dkd = v dS'^T,   da = Σ_v dS' ⊙ S  (per key channel, fp32)
//   dS  = Diag(a) dS' + qd^T do
// With the delta rule the values are the chunk's corrected writes v = V' = U - W S (recomputed from the
// stored S on the way back), and the gradient that reaches v goes on to U and W:
//   du = dV',   dw = -dV' S^T,   dS gains -W^T dV'
// One thread block per (batch, head), 256 threads, every product on tensor cores (chunk_tiles.cuh), its
// results stored from the accumulators (no fp32 staging area).
// K = 64 or 128 key channels, V = 64 value columns a block: with more value columns each part of 64 is a
// head of its own (the columns of the state never mix), `parts` of them to a head of the keys. Such a block
// reads its key head's qd, kd, w, A and a, and writes its own partial dqd, dkd, dw, dA and da (sums over the
// value columns), which the host adds up. At K = 128 a block takes about 122 KiB (forward) or 149 KiB
// (backward) of shared memory, one block an SM.
// v, o and their gradients are the caller's rows [B, T, H, 64] (zeros past T on the way in, nothing
// written past T on the way out). What comes from the scores kernels is heads first and padded to whole
// chunks, by key head (B*Hk heads, Hk = H / parts): qd, kd [B*Hk, N*64, K]; A [B*Hk, N, 64, 64]; a [B*Hk,
// N, K]. By head of values (B*H): the stored states [B*H, N, K, 64]; h0 and the final state [B*H, K, 64] fp32;
// the partial gradients dqd, dkd [B*H, N*64, K], dA [B*H, N, 64, 64] and da [B*H, N, K]. W is heads first by
// key head as well, [B*Hk, N*64, K] (its partial gradient by head of values), U and dU [B*H, N*64, 64].
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/chunk_vector_decay.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kV = 64;  // value columns a block

// Strides and sizes in shared memory with K key channels: Pads64's for the [64, 64] operands (values, scores),
// and rows of K channels (qd, kd, w) and states of K rows. At K = 64 these are Pads64's own.
template <int K>
struct Pads : Pads64 {
  static_assert(K == 64 || K == 128, "64 or 128 key channels");
  static constexpr int ldk = K + 8;                                   // 16-bit rows of K channels
  static constexpr size_t rowsk = round32(size_t{kC} * ldk * 2);      // [64, ldk] 16-bit
  static constexpr size_t state16 = round32(size_t{K} * ld * 2);      // [K, ld] 16-bit
  static constexpr size_t state32 = round32(size_t{K} * ld32 * 4);    // [K, ld32] fp32
  static constexpr size_t channels = round32(size_t{K} * 4);          // [K] fp32
};

// Forward: qd, kd, v (u, then V'), A, the state (fp32 and 16-bit), a, and with the delta rule w. At K = 64
// about 62 KiB (71 with w), and the registers allow two blocks per SM.
template <bool Delta, int K>
struct ForwardLayout : Pads<K> {
  using P = Pads<K>;
  static constexpr size_t q = 0, k = q + P::rowsk, v = k + P::rowsk, A = v + P::rows16, state = A + P::rows16;
  static constexpr size_t state16 = state + P::state32, decay = state16 + P::state16;
  static constexpr size_t w = decay + P::channels, bytes = w + (Delta ? P::rowsk : 0);
};

// Backward: qd, kd, v (u, then V', then -dV'), do, A, the stored state S (16-bit), dS' (fp32 and
// 16-bit), a, and with the delta rule w. At K = 64 about 80 KiB (89 with w): two blocks per SM.
template <bool Delta, int K>
struct BackwardLayout : Pads<K> {
  using P = Pads<K>;
  static constexpr size_t q = 0, k = q + P::rowsk, v = k + P::rowsk, dout = v + P::rows16, A = dout + P::rows16;
  static constexpr size_t state16 = A + P::rows16, dstate = state16 + P::state16, dstate16 = dstate + P::state32;
  static constexpr size_t decay = dstate16 + P::state16, w = decay + P::channels;
  static constexpr size_t bytes = w + (Delta ? P::rowsk : 0);
};

// Where the data of block bh = b H + h lie (H heads of values, `parts` of them to a head of the keys), with K
// key channels: what it reads of the keys (qd, kd, w, A, a) is key head kh = bh / parts's, what it writes is
// its own.
template <int K>
struct Walk {
  int bh, kh, N, Tp, T;
  size_t keys, key_grads, values;  // row 0 of key head kh and of head bh in [., N*64, K]; of bh in [., N*64, 64]
  size_t head, stride;             // row 0 of head (b, h) in the caller's [B, T, H, 64]; its row stride
  __device__ Walk(int n_chunks, int T_, int H, int parts) {
    bh = blockIdx.x, kh = bh / parts, N = n_chunks, Tp = n_chunks * kC, T = T_;
    keys = static_cast<size_t>(kh) * Tp * K;
    key_grads = static_cast<size_t>(bh) * Tp * K;
    values = static_cast<size_t>(bh) * Tp * kV;
    stride = static_cast<size_t>(H) * kV;
    head = static_cast<size_t>(bh / H) * T * stride + static_cast<size_t>(bh % H) * kV;
  }
  // [.., 64, 64] squares (A read, dA written), [.., K, 64] states, [.., K] decays (a read, da written).
  __device__ size_t square(int n) const { return (static_cast<size_t>(kh) * N + n) * kC * kC; }
  __device__ size_t square_grad(int n) const { return (static_cast<size_t>(bh) * N + n) * kC * kC; }
  __device__ size_t state(int n) const { return (static_cast<size_t>(bh) * N + n) * K * kV; }
  __device__ size_t channels(int n) const { return (static_cast<size_t>(kh) * N + n) * K; }
  __device__ size_t channel_grads(int n) const { return (static_cast<size_t>(bh) * N + n) * K; }
};

// The rows of the values in chunk n: the caller's v [B, T, H, 64], or with the delta rule U heads first
// [B*H, N*64, 64]. The same places take dv (du).
template <bool Delta, int K, typename E>
__device__ __forceinline__ void fetch_values(RowPrefetch<kV, E>& next, const E* v, const Walk<K>& at, int n) {
  if constexpr (Delta) next.fetch(v + at.values, kV, n * kC, at.Tp);
  else next.fetch(v + at.head, at.stride, n * kC, at.T);
}
// Tile (R, Cc) of dv (du) in chunk n, from its accumulator (nothing past T in the caller's rows).
template <bool Delta, int K, typename E>
__device__ __forceinline__ void store_value_tile(E* dv, const Walk<K>& at, int n, int R, int Cc, const Acc& acc) {
  if constexpr (Delta) store_tile16(dv + at.values + static_cast<size_t>(n * kC + 16 * R) * kV + 16 * Cc, acc, kV);
  else store_tile16_rows(dv + at.head + 16 * Cc, at.stride, n * kC + 16 * R, at.T, acc);
}

// A [64, K] result tile (R, Cc) from its accumulator into the block's rows of K channels of chunk n (its
// partial qd, kd or w gradient).
template <int K, typename E>
__device__ __forceinline__ void store_key_tile(E* x, const Walk<K>& at, int n, int R, int Cc, const Acc& acc) {
  store_tile16(x + at.key_grads + static_cast<size_t>(n * kC + 16 * R) * K + 16 * Cc, acc, K);
}

// v (u with the delta rule) [64, ld] -= w S16 tile by tile in place: the chunk's corrected writes V'
// (w [64, ldk], S16 [K, ld]).
template <int K, typename E>
__device__ void correct_writes(E* sv, const E* sw, const E* S16) {
  using P = Pads<K>;
  each_tile<kV>([&](int R, int Cc) {
    Acc acc;
    zero(acc);
    product_tile<false, false>(acc, sw, P::ldk, S16, P::ld, R, Cc, 0, K / 16);
    subtract_tile16(sv + R * 16 * P::ld + Cc * 16, acc, P::ld);
  });
}

// v is the caller's values (GLA) or U (the delta rule, with w = W; w is unused otherwise).
template <typename E, bool Delta, int K>
__global__ void __launch_bounds__(kThreads, K == 64 ? 2 : 1)
    vector_walk_forward_kernel(const E* __restrict__ qd, const E* __restrict__ kd, const E* __restrict__ v,
                               const E* __restrict__ w, const E* __restrict__ A, const float* __restrict__ a,
                               const float* __restrict__ h0, E* __restrict__ o, float* __restrict__ final_state,
                               E* __restrict__ states, int N, int T, int H, int parts) {
  using L = ForwardLayout<Delta, K>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sv = view<E>(smem, L::v), *sA = view<E>(smem, L::A);
  E *S16 = view<E>(smem, L::state16), *sw = view<E>(smem, L::w);
  float *S = view<float>(smem, L::state), *decay = view<float>(smem, L::decay);
  const Walk<K> at(N, T, H, parts);
  const size_t state_at = static_cast<size_t>(at.bh) * K * kV;

  load_state<K, kV>(S, L::ld32, h0 != nullptr ? h0 + state_at : nullptr);
  __syncthreads();
  copy_state<K, kV>(S16, L::ld, S, L::ld32);
  RowPrefetch<K, E> nq, nk, nw;
  RowPrefetch<kV, E> nv, nA;
  float na = 0.f;
  auto fetch = [&](int n) {
    const int t0 = n * kC;
    nq.fetch(qd + at.keys, K, t0, at.Tp), nk.fetch(kd + at.keys, K, t0, at.Tp);
    fetch_values<Delta>(nv, v, at, n), nA.fetch_lower(A + at.square(n));
    if constexpr (Delta) nw.fetch(w + at.keys, K, t0, at.Tp);
    if (threadIdx.x < K) na = a[at.channels(n) + threadIdx.x];
  };
  fetch(0);
  for (int n = 0; n < N; ++n) {
    nq.put(sq, L::ldk), nk.put(sk, L::ldk), nv.put(sv, L::ld), nA.put(sA, L::ld);
    if constexpr (Delta) nw.put(sw, L::ldk);
    if (threadIdx.x < K) decay[threadIdx.x] = na;
    if (n + 1 < N) fetch(n + 1);  // in flight while this chunk is computed
    __syncthreads();
    store_state16<K, kV>(states + at.state(n), S16, L::ld);
    if constexpr (Delta) {
      correct_writes<K>(sv, sw, S16);
      __syncthreads();
    }
    // o = qd S + A v straight to the caller's rows; S = Diag(a) S + kd^T v (fp32 master only). Every
    // read of S16 this chunk lies before the barrier that precedes its copy.
    each_tile<kV>([&](int R, int Cc) {
      Acc acc;
      zero(acc);
      product_tile<false, false>(acc, sq, L::ldk, S16, L::ld, R, Cc, 0, K / 16);
      product_tile<false, false>(acc, sA, L::ld, sv, L::ld, R, Cc, 0, R + 1);
      store_tile16_rows(o + at.head + 16 * Cc, at.stride, n * kC + 16 * R, at.T, acc);
    });
    accumulate_state<K, kV>(
        S, L::ld32, 1.f,
        [&](Acc& acc, int R, int Cc) { product_tile<true, false>(acc, sk, L::ldk, sv, L::ld, R, Cc, 0, kC / 16); },
        decay);
    __syncthreads();
    copy_state<K, kV>(S16, L::ld, S, L::ld32);
  }
  store_state<K, kV>(final_state + state_at, S, L::ld32);
}

// v and dv are the caller's values and their gradient (GLA), or U and dU (the delta rule, which also
// reads w = W and writes dw = dW; both unused otherwise).
template <typename E, bool Delta, int K>
__global__ void __launch_bounds__(kThreads, K == 64 ? 2 : 1)
    vector_walk_backward_kernel(const E* __restrict__ qd, const E* __restrict__ kd, const E* __restrict__ v,
                                const E* __restrict__ w, const E* __restrict__ A, const float* __restrict__ a,
                                const E* __restrict__ states, const E* __restrict__ dout,
                                const float* __restrict__ d_final, E* __restrict__ dqd, E* __restrict__ dkd,
                                E* __restrict__ dv, E* __restrict__ dw, E* __restrict__ dA, float* __restrict__ da,
                                float* __restrict__ d_initial, int N, int T, int H, int parts) {
  using L = BackwardLayout<Delta, K>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  E *sq = view<E>(smem, L::q), *sk = view<E>(smem, L::k), *sv = view<E>(smem, L::v), *sdo = view<E>(smem, L::dout);
  E *sA = view<E>(smem, L::A), *sS = view<E>(smem, L::state16), *dS16 = view<E>(smem, L::dstate16);
  E* sw = view<E>(smem, L::w);
  float *dS = view<float>(smem, L::dstate), *decay = view<float>(smem, L::decay);
  const Walk<K> at(N, T, H, parts);
  const size_t state_at = static_cast<size_t>(at.bh) * K * kV;

  load_state<K, kV>(dS, L::ld32, d_final != nullptr ? d_final + state_at : nullptr);
  __syncthreads();
  copy_state<K, kV>(dS16, L::ld, dS, L::ld32);
  RowPrefetch<K, E> nq, nk, nw;
  RowPrefetch<kV, E> nv, ndo, nA;
  RowPrefetch<kV, E, kThreads, K> nS;  // the stored state, K rows
  float na = 0.f;
  auto fetch = [&](int n) {
    const int t0 = n * kC;
    nq.fetch(qd + at.keys, K, t0, at.Tp), nk.fetch(kd + at.keys, K, t0, at.Tp);
    fetch_values<Delta>(nv, v, at, n), ndo.fetch(dout + at.head, at.stride, t0, at.T);
    // A's words above the diagonal are zeros and need no read; the delta rule's walk reads them all the same, as
    // the test costs it registers it has not got (ptxas spills).
    if constexpr (Delta) nA.fetch(A + at.square(n), kC, 0, kC);
    else nA.fetch_lower(A + at.square(n));
    nS.fetch(states + at.state(n), kV, 0, K);
    if constexpr (Delta) nw.fetch(w + at.keys, K, t0, at.Tp);
    if (threadIdx.x < K) na = a[at.channels(n) + threadIdx.x];
  };
  fetch(N - 1);
  for (int n = N - 1; n >= 0; --n) {
    nq.put(sq, L::ldk), nk.put(sk, L::ldk), nv.put(sv, L::ld), ndo.put(sdo, L::ld), nA.put(sA, L::ld);
    nS.put(sS, L::ld);
    if constexpr (Delta) nw.put(sw, L::ldk);
    if (threadIdx.x < K) decay[threadIdx.x] = na;
    if (n > 0) fetch(n - 1);  // in flight while this chunk is computed
    __syncthreads();
    if constexpr (Delta) {
      correct_writes<K>(sv, sw, sS);  // V', as the forward computed it
      __syncthreads();
    }
    // dA = do v^T on and below the diagonal (zeros above), dqd = do S^T and dkd = v dS'^T (from the 16-bit
    // copy), each tile from its accumulator to global memory; da = Σ_v dS' ⊙ S (four threads a row).
    // Each warp takes the same share of all three.
    E* dA_n = dA + at.square_grad(n);
    square_tiles(
        0,
        [&](int R, int Cc) {
          Acc acc;
          zero(acc);
          product_tile<false, true>(acc, sdo, L::ld, sv, L::ld, R, Cc, 0, kV / 16);
          store_tile16(dA_n + R * 16 * kC + Cc * 16, acc, kC);
        },
        [&](int R, int Cc) { store_zero_tile16(dA_n + R * 16 * kC + Cc * 16, kC); });
#pragma unroll
    for (int dk_tile = 0; dk_tile < 2; ++dk_tile)
      each_tile<K>([&](int R, int Cc) {
        Acc acc;
        zero(acc);
        product_tile<false, true>(acc, dk_tile ? sv : sdo, L::ld, dk_tile ? dS16 : sS, L::ld, R, Cc, 0, kV / 16);
        store_key_tile(dk_tile ? dkd : dqd, at, n, R, Cc, acc);
      });
#pragma unroll
    for (int r0 = 0; r0 < K; r0 += kThreads / 4) {
      const int r = r0 + threadIdx.x / 4, c0 = (threadIdx.x % 4) * (kV / 4);
      float part = 0.f, s[8];
#pragma unroll
      for (int c = c0; c < c0 + kV / 4; c += 8) {
        unpack8<E>(*reinterpret_cast<const uint4*>(sS + r * L::ld + c), s);
#pragma unroll
        for (int j = 0; j < 8; ++j) part += dS[r * L::ld32 + c + j] * s[j];
      }
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      if (threadIdx.x % 4 == 0) da[at.channel_grads(n) + r] = part;
    }
    __syncthreads();  // da has read dS', which takes its update next (and with the delta rule V' takes -dV')
    // dv = A^T do + kd dS' to global memory (with the delta rule: du = dV', and -dV' where V' was).
    each_tile<kV>([&](int R, int Cc) {
      Acc acc;
      zero(acc);
      product_tile<true, false>(acc, sA, L::ld, sdo, L::ld, R, Cc, R, kRowTiles);
      product_tile<false, false>(acc, sk, L::ldk, dS16, L::ld, R, Cc, 0, K / 16);
      store_value_tile<Delta>(dv, at, n, R, Cc, acc);
      if constexpr (Delta) {
        negate(acc);
        store_tile16(sv + R * 16 * L::ld + Cc * 16, acc, L::ld);
      }
    });
    if constexpr (Delta) {
      __syncthreads();
      each_tile<K>([&](int R, int Cc) {  // dw = -dV' S^T
        Acc acc;
        zero(acc);
        product_tile<false, true>(acc, sv, L::ld, sS, L::ld, R, Cc, 0, kV / 16);
        store_key_tile(dw, at, n, R, Cc, acc);
      });
    }
    // dS = Diag(a) dS' + qd^T do (- W^T dV' with the delta rule). Without the delta rule this runs beside dv's
    // products, which read dS' only through its 16-bit copy.
    accumulate_state<K, kV>(
        dS, L::ld32, 1.f,
        [&](Acc& acc, int R, int Cc) {
          product_tile<true, false>(acc, sq, L::ldk, sdo, L::ld, R, Cc, 0, kRowTiles);
          if constexpr (Delta) product_tile<true, false>(acc, sw, L::ldk, sv, L::ld, R, Cc, 0, kRowTiles);
        },
        decay);
    __syncthreads();
    copy_state<K, kV>(dS16, L::ld, dS, L::ld32);  // read only after the next chunk's first barrier
  }
  if (d_initial != nullptr) store_state<K, kV>(d_initial + state_at, dS, L::ld32);
}

// H heads of values, `parts` of them to a head of the keys (H / parts key heads).
struct WalkShape {
  int64_t B, T, H, N, K, parts;
  int64_t BH() const { return B * H; }
  int64_t key_heads() const { return H / parts; }
};

// The number of value heads to a head of the keys: Hv / Hk, which must be whole.
int64_t value_parts(int64_t Hv, int64_t Hk) {
  TORCH_CHECK(Hk > 0 && Hv % Hk == 0, "fused vector-decay walk: ", Hv, " heads of values for ", Hk,
              " heads of keys; expected a multiple");
  return Hv / Hk;
}

// fn(std::integral_constant<int, K>) for the key channels the kernels are built for (walk_keys_supported).
template <typename Fn>
void dispatch_keys(int64_t K, Fn fn) {
  if (K == 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}

// qd, kd [B,Hk,N*64,K] in v's dtype, A [B,Hk,N,64,64] in v's dtype, a [B,Hk,N,K] fp32, all contiguous, with
// Hk the key heads.
void check_walk_inputs(const WalkShape& p, torch::ScalarType dt, const torch::Tensor& qd, const torch::Tensor& kd,
                       const torch::Tensor& A, const torch::Tensor& a) {
  const int64_t Hk = p.key_heads();
  const std::vector<int64_t> rows{p.B, Hk, p.N * kC, p.K};
  TORCH_CHECK(vector_walk_supported(p.K, dt), "fused vector-decay walk: 64 or 128 key channels in bf16 or fp16; got ",
              p.K, " in ", dt);
  TORCH_CHECK(qd.sizes() == torch::IntArrayRef(rows) && kd.sizes() == qd.sizes() && qd.scalar_type() == dt &&
                  kd.scalar_type() == dt && qd.is_contiguous() && kd.is_contiguous(),
              "fused vector-decay walk: qd and kd must be ", torch::IntArrayRef(rows), " in the values' dtype, "
              "contiguous; got ", qd.sizes(), " ", kd.sizes());
  TORCH_CHECK(A.sizes() == torch::IntArrayRef({p.B, Hk, p.N, kC, kC}) && A.scalar_type() == dt && A.is_contiguous(),
              "fused vector-decay walk: A must be [B,H,N,64,64] in the values' dtype; got ", A.sizes());
  TORCH_CHECK(a.sizes() == torch::IntArrayRef({p.B, Hk, p.N, p.K}) && a.scalar_type() == torch::kFloat &&
                  a.is_contiguous(),
              "fused vector-decay walk: a must be [B,H,N,", p.K, "] fp32; got ", a.sizes(), " ", a.scalar_type());
}

// GLA: v [B,T,H,64] bf16 or fp16; K and the key heads from qd.
WalkShape walk_shape(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& v, const torch::Tensor& A,
                     const torch::Tensor& a) {
  TORCH_CHECK(v.dim() == 4 && v.size(3) == kV && qd.dim() == 4 && v.is_contiguous(),
              "fused vector-decay walk: expects v [B,T,H,64], contiguous, and qd [B,Hk,N*64,K]; got ", v.sizes(), " ",
              qd.sizes());
  const WalkShape p{v.size(0), v.size(1), v.size(2), (v.size(1) + kC - 1) / kC, qd.size(3),
                    value_parts(v.size(2), qd.size(1))};
  check_walk_inputs(p, v.scalar_type(), qd, kd, A, a);
  return p;
}

// The delta rule: w [B,Hk,N*64,K] and u [B,H,N*64,64] bf16 or fp16 with N = ceil(T / 64).
WalkShape delta_walk_shape(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& w,
                           const torch::Tensor& u, const torch::Tensor& A, const torch::Tensor& a, int64_t T) {
  TORCH_CHECK(u.dim() == 4 && u.size(3) == kV && T >= 0 && u.size(2) == (T + kC - 1) / kC * kC && u.is_contiguous() &&
                  w.dim() == 4 && w.size(0) == u.size(0) && w.size(2) == u.size(2) &&
                  w.scalar_type() == u.scalar_type() && w.is_contiguous(),
              "fused vector-decay delta walk: expects w [B,Hk,N*64,K] and u [B,H,N*64,64] of one dtype with N = "
              "ceil(T/64) = ", (T + kC - 1) / kC, ", contiguous; got ", w.sizes(), " ", u.sizes(), " ",
              u.scalar_type());
  const WalkShape p{u.size(0), T, u.size(1), u.size(2) / kC, w.size(3), value_parts(u.size(1), w.size(1))};
  check_walk_inputs(p, u.scalar_type(), qd, kd, A, a);
  return p;
}

template <bool Delta>
VectorWalkForward walk_forward(const WalkShape& p, const torch::Tensor& qd, const torch::Tensor& kd,
                               const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& A,
                               const torch::Tensor& a, const torch::Tensor& h0) {
  TORCH_CHECK(!h0.defined() || (h0.sizes() == torch::IntArrayRef({p.B, p.H, p.K, kV}) && h0.is_contiguous()),
              "fused vector-decay walk: h0 must be [B,H,K,64] fp32, contiguous; got ", h0.sizes());
  const c10::cuda::CUDAGuard guard(qd.device());
  VectorWalkForward out;
  out.o = torch::empty({p.B, p.T, p.H, kV}, v.options());
  out.final_state = torch::empty({p.B, p.H, p.K, kV}, v.options().dtype(torch::kFloat));
  out.states = torch::empty({p.B, p.H, p.N, p.K, kV}, v.options());
  if (p.N == 0 || p.BH() == 0) {
    out.final_state.copy_(h0.defined() ? h0 : torch::zeros_like(out.final_state));
    return out;
  }
  dispatch_16bit(qd.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    dispatch_keys(p.K, [&](auto keys) {
      constexpr int K = decltype(keys)::value;
      launch(vector_walk_forward_kernel<E, Delta, K>, static_cast<unsigned>(p.BH()), kThreads,
             ForwardLayout<Delta, K>::bytes, data_as<E>(qd), data_as<E>(kd), data_as<E>(v),
             Delta ? data_as<E>(w) : nullptr, data_as<E>(A), a.data_ptr<float>(), ptr_or_null(h0), data_as<E>(out.o),
             out.final_state.data_ptr<float>(), data_as<E>(out.states), static_cast<int>(p.N), static_cast<int>(p.T),
             static_cast<int>(p.H), static_cast<int>(p.parts));
    });
  });
  return out;
}

template <bool Delta>
VectorWalkGrads walk_backward(const WalkShape& p, const torch::Tensor& qd, const torch::Tensor& kd,
                              const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& A,
                              const torch::Tensor& a, const torch::Tensor& states, const torch::Tensor& d_out,
                              const torch::Tensor& d_final, bool want_d_initial) {
  TORCH_CHECK(d_out.sizes() == torch::IntArrayRef({p.B, p.T, p.H, kV}) && d_out.scalar_type() == qd.scalar_type() &&
                  d_out.is_contiguous(),
              "fused vector-decay walk: d_out must be [B,T,H,64] in the values' dtype, contiguous; got ", d_out.sizes(),
              " ", d_out.scalar_type());
  TORCH_CHECK(states.sizes() == torch::IntArrayRef({p.B, p.H, p.N, p.K, kV}) &&
                  states.scalar_type() == qd.scalar_type(),
              "fused vector-decay walk: the stored states must be [B,H,N,K,64]; got ", states.sizes());
  TORCH_CHECK(!d_final.defined() || (d_final.sizes() == torch::IntArrayRef({p.B, p.H, p.K, kV}) &&
                                     d_final.is_contiguous()),
              "fused vector-decay walk: d_final must be [B,H,K,64] fp32, contiguous; got ", d_final.sizes());
  const c10::cuda::CUDAGuard guard(qd.device());
  VectorWalkGrads out;
  // The keys' gradients per head of values: partial sums over each key head's value parts, added up below.
  auto per_value_head = [&](const torch::Tensor& x) {
    auto shape = x.sizes().vec();
    shape[1] = p.H;
    return torch::empty(shape, x.options());
  };
  out.dqd = per_value_head(qd);
  out.dkd = per_value_head(kd);
  out.dv = torch::empty_like(v);
  if (Delta) out.dw = per_value_head(w);
  out.dA = per_value_head(A);
  out.da = per_value_head(a);
  if (want_d_initial) out.d_initial = torch::empty({p.B, p.H, p.K, kV}, a.options());
  auto add_up_key_grads = [&] {
    for (auto* x : {&out.dqd, &out.dkd, &out.dA, &out.da, &out.dw})
      if (x->defined()) *x = add_up_parts(*x, p.parts);
  };
  if (p.N == 0 || p.BH() == 0) {
    if (want_d_initial) out.d_initial.copy_(d_final.defined() ? d_final : torch::zeros_like(out.d_initial));
    add_up_key_grads();
    return out;
  }
  dispatch_16bit(qd.scalar_type(), [&](auto elem) {
    using E = decltype(elem);
    dispatch_keys(p.K, [&](auto keys) {
      constexpr int K = decltype(keys)::value;
      launch(vector_walk_backward_kernel<E, Delta, K>, static_cast<unsigned>(p.BH()), kThreads,
             BackwardLayout<Delta, K>::bytes, data_as<E>(qd), data_as<E>(kd), data_as<E>(v),
             Delta ? data_as<E>(w) : nullptr, data_as<E>(A), a.data_ptr<float>(), data_as<E>(states),
             data_as<E>(d_out), ptr_or_null(d_final), data_as<E>(out.dqd), data_as<E>(out.dkd), data_as<E>(out.dv),
             Delta ? data_as<E>(out.dw) : nullptr, data_as<E>(out.dA), out.da.data_ptr<float>(),
             out_or_null(out.d_initial), static_cast<int>(p.N), static_cast<int>(p.T), static_cast<int>(p.H),
             static_cast<int>(p.parts));
    });
  });
  add_up_key_grads();
  return out;
}

}  // namespace

bool vector_decay_chunk_supported(int64_t K, int64_t V, torch::ScalarType dt) {
  return K == 64 && V == kV && (dt == torch::kBFloat16 || dt == torch::kHalf);
}

bool vector_walk_supported(int64_t K, torch::ScalarType dt) {
  return (K == 64 || K == 128) && (dt == torch::kBFloat16 || dt == torch::kHalf);
}

VectorWalkForward vector_walk_forward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& v,
                                      const torch::Tensor& A, const torch::Tensor& a, const torch::Tensor& h0) {
  return walk_forward<false>(walk_shape(qd, kd, v, A, a), qd, kd, v, torch::Tensor(), A, a, h0);
}

VectorWalkGrads vector_walk_backward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& v,
                                     const torch::Tensor& A, const torch::Tensor& a, const torch::Tensor& states,
                                     const torch::Tensor& d_out, const torch::Tensor& d_final, bool want_d_initial) {
  return walk_backward<false>(walk_shape(qd, kd, v, A, a), qd, kd, v, torch::Tensor(), A, a, states, d_out, d_final,
                              want_d_initial);
}

VectorWalkForward vector_delta_walk_forward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& w,
                                            const torch::Tensor& u, const torch::Tensor& A, const torch::Tensor& a,
                                            const torch::Tensor& h0, int64_t T) {
  return walk_forward<true>(delta_walk_shape(qd, kd, w, u, A, a, T), qd, kd, u, w, A, a, h0);
}

VectorWalkGrads vector_delta_walk_backward(const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& w,
                                           const torch::Tensor& u, const torch::Tensor& A, const torch::Tensor& a,
                                           const torch::Tensor& states, const torch::Tensor& d_out,
                                           const torch::Tensor& d_final, bool want_d_initial) {
  TORCH_CHECK(d_out.dim() == 4, "fused vector-decay delta walk: d_out must be [B,T,H,64]; got ", d_out.sizes());
  return walk_backward<true>(delta_walk_shape(qd, kd, w, u, A, a, d_out.size(1)), qd, kd, u, w, A, a, states, d_out,
                             d_final, want_d_initial);
}

}  // namespace linearize::ops::cuda_kernels
