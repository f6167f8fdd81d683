// The GLA family with no decay or a scalar decay per step (linear attention, RetNet, scalar-gated GLA),
// chunked and fused: one thread block per (batch, head) walks the chunks of 64 in order with the
// state in shared memory, and every product of a chunk runs on tensor cores (mma.sync 16x8x16, bf16 or
// fp16 operands, fp32 accumulation). Nothing per chunk goes through HBM: the forward reads q, k, v
// once and writes o and the final state; the backward recomputes the states on a forward walk (dq) and
// carries dS on a reverse walk (dk, dv, dS0), the two walks as the two rows of one grid. Each walk
// fetches the next chunk's rows into registers while it computes the current one.
//
// Per chunk, with G the chunk-local cumulative log decay (fp32) and Gl = G[C-1]:
//   A   = scale (q k^T) ⊙ exp(G_i - G_j) for j <= i, 0 above          (causal, every exponent <= 0)
//   o   = (scale e^G ⊙ q) S + A v
//   S'  = e^Gl S + (e^{Gl - G} ⊙ k)^T v
// backward, with dA = (do v^T) ⊙ scale exp(G_i - G_j) (masked) and dS' the gradient of S':
//   dq  = (scale e^G ⊙ do) S^T + dA k
//   dk  = dA^T q + (e^{Gl - G} ⊙ v) dS'^T
//   dv  = A^T do + (e^{Gl - G} ⊙ k) dS'
//   dS  = e^Gl dS' + (scale e^G ⊙ q)^T do
// Where a row factor (e^G, e^{Gl - G}) scales the rows of a product's result, it is applied to the fp32
// accumulator rather than to a 16-bit operand. The state is kept in fp32 (its master copy) and read by the
// products through a 16-bit copy made after each update. Rows past T are zeros. The gradient of the decay
// is left to the caller (ops/gla/fused_chunk.cpp), which has it from q·dq - k·dk.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <type_traits>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/chunk_scalar_decay.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

// Shared memory of one block (the same for the three kernels). 16-bit rows are padded by 8
// elements and fp32 rows by 4, so tile rows stay 16-byte aligned (as ldmatrix needs) and rows do not
// start on the same bank. With K = V = 64 it is about 98 KiB, so two blocks share an SM (kBlocksPerSm).
template <int K, int V>
struct Layout {
  static constexpr int ldk = K + 8, ldv = V + 8, ldc = kC + 8;    // 16-bit
  static constexpr int ldv32 = V + 4, ldc32 = kC + 4;            // fp32
  static constexpr int ldo32 = (K > V ? K : V) + 4;              // fp32 [C, K] or [C, V] staging
  static constexpr size_t q = 0;
  static constexpr size_t k = q + round32(size_t{kC} * ldk * 2);
  static constexpr size_t v = k + round32(size_t{kC} * ldk * 2);
  static constexpr size_t dout = v + round32(size_t{kC} * ldv * 2);
  static constexpr size_t state = dout + round32(size_t{kC} * ldv * 2);   // fp32 [K, V]
  static constexpr size_t state16 = state + round32(size_t{K} * ldv32 * 4);
  static constexpr size_t scores = state16 + round32(size_t{K} * ldv * 2);  // two 16-bit [C, C]
  static constexpr size_t stage = scores + 2 * round32(size_t{kC} * ldc * 2);
  static constexpr size_t stage_bytes = kC * ldc32 > kC * ldo32 ? kC * ldc32 * 4 : kC * ldo32 * 4;
  static constexpr size_t gates = stage + round32(stage_bytes);  // fp32 [3, C]: G, e^G, e^{Gl - G}
  static constexpr size_t bytes = gates + 3 * kC * 4;
  // Whether the rows e^{Gl - G} k [C, K] fit in a score buffer (K <= 64): the forward and the dq walk, which
  // use one score buffer each, keep them in the other and update the state in the same phase as their
  // output product.
  static constexpr bool keys_fit = ldk <= ldc;
};

// Blocks that fit on one SM: for head size 64 the layout and at most 128 registers a thread allow two.
template <int K>
constexpr int kBlocksPerSm = K == 64 ? 2 : 1;
// Threads a block: 256 at head size 64 (two blocks an SM), 512 at 128, where the layout (225 KiB) leaves one
// block an SM and 16 warps hide more of its latency than 8 (ptxas: 116-120 registers, of the 128 allowed;
// H200, B=8 H=32 T=1k..16k: the forward 9% and the backward 10% faster than with 256).
template <int K>
constexpr int kBlockThreads = K == 64 ? kThreads : 2 * kThreads;

struct Shape {
  int B, T, H;
  float scale;
};

// What one block (batch b, head h) works on: its views of shared memory (Layout) and where its rows,
// gates and state lie in global memory.
template <int K, int V, typename E>
struct BlockView {
  using L = Layout<K, V>;
  E *q, *k, *v, *dout, *S16, *A16, *dA16;  // shared 16-bit tiles (dA16: the second score buffer)
  float *S, *stage, *G, *eG, *eEnd;       // shared fp32: state, staging, gates and row factors
  size_t k_row, v_row;                    // row strides of [B,T,H,K] and [B,T,H,V]
  size_t head_k, head_v;                  // offsets of row 0 of this head
  size_t state_at, steps_at;              // offsets in [B*H, K, V] and [B*H, T]
  int bh;

  __device__ BlockView(unsigned char* smem, const Shape& p) {
    q = reinterpret_cast<E*>(smem + L::q), k = reinterpret_cast<E*>(smem + L::k);
    v = reinterpret_cast<E*>(smem + L::v), dout = reinterpret_cast<E*>(smem + L::dout);
    S16 = reinterpret_cast<E*>(smem + L::state16), A16 = reinterpret_cast<E*>(smem + L::scores);
    dA16 = A16 + kC * L::ldc;
    S = reinterpret_cast<float*>(smem + L::state), stage = reinterpret_cast<float*>(smem + L::stage);
    G = reinterpret_cast<float*>(smem + L::gates), eG = G + kC, eEnd = G + 2 * kC;
    bh = blockIdx.x;
    const int b = bh / p.H, h = bh % p.H;
    k_row = static_cast<size_t>(p.H) * K, v_row = static_cast<size_t>(p.H) * V;
    head_k = (static_cast<size_t>(b) * p.T * p.H + h) * K, head_v = (static_cast<size_t>(b) * p.T * p.H + h) * V;
    state_at = static_cast<size_t>(bh) * K * V, steps_at = static_cast<size_t>(bh) * p.T;
  }
};

template <int K, int V, typename E>
__global__ void __launch_bounds__(kBlockThreads<K>, kBlocksPerSm<K>)
    chunk_forward_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                         const float* __restrict__ g, const float* __restrict__ h0, E* __restrict__ o,
                         float* __restrict__ final_state, Shape p) {
  using L = Layout<K, V>;
  constexpr int kThreadsK = kBlockThreads<K>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  const BlockView<K, V, E> blk(smem, p);
  E *sq = blk.q, *sk = blk.k, *sv = blk.v, *S16 = blk.S16, *A16 = blk.A16, *ku = blk.dA16;
  float *S = blk.S, *stage = blk.stage, *G = blk.G, *eG = blk.eG, *eEnd = blk.eEnd;
  const size_t sk_row = blk.k_row, sv_row = blk.v_row, head_k = blk.head_k, head_v = blk.head_v;
  const float* gh = g != nullptr ? g + blk.steps_at : nullptr;

  load_state<K, V, kThreadsK>(S, L::ldv32, h0 != nullptr ? h0 + blk.state_at : nullptr);
  __syncthreads();
  copy_state<K, V, kThreadsK>(S16, L::ldv, S, L::ldv32);
  RowPrefetch<K, E, kThreadsK> nq, nk;
  RowPrefetch<V, E, kThreadsK> nv;
  nq.fetch(q + head_k, sk_row, 0, p.T), nk.fetch(k + head_k, sk_row, 0, p.T), nv.fetch(v + head_v, sv_row, 0, p.T);
  float2 ng = fetch_gates(gh, 0, p.T);
  for (int t0 = 0; t0 < p.T; t0 += kC) {
    nq.put(sq, L::ldk), nk.put(sk, L::ldk), nv.put(sv, L::ldv);
    chunk_gates(G, ng);
    const int next = t0 + kC;  // in flight while this chunk is computed
    if (next < p.T) {
      nq.fetch(q + head_k, sk_row, next, p.T), nk.fetch(k + head_k, sk_row, next, p.T);
      nv.fetch(v + head_v, sv_row, next, p.T), ng = fetch_gates(gh, next, p.T);
    }
    __syncthreads();
    decayed_scores16<K, kThreadsK>(A16, L::ldc, sq, sk, L::ldk, G, p.scale);
    if constexpr (L::keys_fit) scale_rows_to<K, kThreadsK>(ku, sk, L::ldk, eEnd, 1.f);
    __syncthreads();
    if constexpr (!L::keys_fit) scale_rows<K, kThreadsK>(sk, L::ldk, eEnd, 1.f);  // the o product reads no k
    // o = scale e^G (q S) + A v into the staging area (and, given the spare buffer, the state update).
    tiles_into_stage<V, kThreadsK>(stage, L::ldo32, [&](Acc& acc, int R, int Cc) {
      product_tile<false, false>(acc, sq, L::ldk, S16, L::ldv, R, Cc, 0, K / 16);
      scale_tile_rows(acc, eG, R, p.scale);
      product_tile<false, false>(acc, A16, L::ldc, sv, L::ldv, R, Cc, 0, R + 1);
    });
    if constexpr (L::keys_fit) update_state<K, V, kThreadsK>(S, L::ldv32, eG[kC - 1], ku, L::ldk, sv, L::ldv);
    __syncthreads();
    if constexpr (!L::keys_fit) {
      // The 16-bit copy as the state is updated: the o product, which reads it, lies behind the barrier.
      update_state<K, V, kThreadsK>(S, L::ldv32, eG[kC - 1], sk, L::ldk, sv, L::ldv, S16, L::ldv);
      store_rows<V, kThreadsK>(o + head_v, sv_row, t0, p.T, stage, L::ldo32);
      __syncthreads();
    } else {
      store_rows<V, kThreadsK>(o + head_v, sv_row, t0, p.T, stage, L::ldo32);
      copy_state<K, V, kThreadsK>(S16, L::ldv, S, L::ldv32);
    }
  }
  store_state<K, V, kThreadsK>(final_state + blk.state_at, S, L::ldv32);
}

// blockIdx.y == 0: forward walk for dq; blockIdx.y == 1: reverse walk for dk, dv and dS0. With a gate,
// also the row sums q_t·dq_t and k_t·dk_t (fp32, before dq and dk are rounded) into dot_q, dot_k [B*H, T].
template <int K, int V, typename E>
__global__ void __launch_bounds__(kBlockThreads<K>, kBlocksPerSm<K>)
    chunk_backward_kernel(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                          const float* __restrict__ g, const float* __restrict__ h0, const E* __restrict__ dout,
                          const float* __restrict__ d_final, E* __restrict__ dq, E* __restrict__ dk,
                          E* __restrict__ dv, float* __restrict__ d_initial, float* __restrict__ dot_q,
                          float* __restrict__ dot_k, Shape p) {
  using L = Layout<K, V>;
  constexpr int kThreadsK = kBlockThreads<K>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, smem);
  const BlockView<K, V, E> blk(smem, p);
  E *sq = blk.q, *sk = blk.k, *sv = blk.v, *sdo = blk.dout, *S16 = blk.S16, *A16 = blk.A16, *dA16 = blk.dA16;
  float *S = blk.S, *stage = blk.stage, *G = blk.G, *eG = blk.eG, *eEnd = blk.eEnd;
  const size_t sk_row = blk.k_row, sv_row = blk.v_row, head_k = blk.head_k, head_v = blk.head_v;
  const float* gh = g != nullptr ? g + blk.steps_at : nullptr;
  const size_t state_at = blk.state_at, dots_at = blk.steps_at;
  const int N = (p.T + kC - 1) / kC;

  if (blockIdx.y == 0) {
    // Forward walk: S^(n) again, dq = (scale e^G do) S^T + dA k.
    float* dots = dot_q != nullptr ? dot_q + dots_at : nullptr;
    E* ku = A16;  // the spare score buffer (keys_fit)
    load_state<K, V, kThreadsK>(S, L::ldv32, h0 != nullptr ? h0 + state_at : nullptr);
    __syncthreads();
    copy_state<K, V, kThreadsK>(S16, L::ldv, S, L::ldv32);
    RowPrefetch<K, E, kThreadsK> nq, nk;
    RowPrefetch<V, E, kThreadsK> nv, ndo;
    auto fetch = [&](int t0) {
      if (dots != nullptr) nq.fetch(q + head_k, sk_row, t0, p.T);
      nk.fetch(k + head_k, sk_row, t0, p.T), nv.fetch(v + head_v, sv_row, t0, p.T);
      ndo.fetch(dout + head_v, sv_row, t0, p.T);
      return fetch_gates(gh, t0, p.T);
    };
    float2 ng = fetch(0);
    for (int t0 = 0; t0 < p.T; t0 += kC) {
      if (dots != nullptr) nq.put(sq, L::ldk);
      nk.put(sk, L::ldk), nv.put(sv, L::ldv), ndo.put(sdo, L::ldv);
      chunk_gates(G, ng);
      if (t0 + kC < p.T) ng = fetch(t0 + kC);  // in flight while this chunk is computed
      __syncthreads();
      decayed_scores16<V, kThreadsK>(dA16, L::ldc, sdo, sv, L::ldv, G, p.scale);
      if constexpr (L::keys_fit) scale_rows_to<K, kThreadsK>(ku, sk, L::ldk, eEnd, 1.f);
      __syncthreads();
      // dq = scale e^G (do S^T) + dA k (and, given the spare buffer, the state update).
      tiles_into_stage<K, kThreadsK>(stage, L::ldo32, [&](Acc& acc, int R, int Cc) {
        product_tile<false, true>(acc, sdo, L::ldv, S16, L::ldv, R, Cc, 0, V / 16);
        scale_tile_rows(acc, eG, R, p.scale);
        product_tile<false, false>(acc, dA16, L::ldc, sk, L::ldk, R, Cc, 0, R + 1);
      });
      if constexpr (L::keys_fit) update_state<K, V, kThreadsK>(S, L::ldv32, eG[kC - 1], ku, L::ldk, sv, L::ldv);
      __syncthreads();
      store_rows<K, kThreadsK>(dq + head_k, sk_row, t0, p.T, stage, L::ldo32, sq, L::ldk, dots);
      if constexpr (!L::keys_fit) {
        scale_rows<K, kThreadsK>(sk, L::ldk, eEnd, 1.f);
        __syncthreads();
        // With the 16-bit copy: dq's product, its reader, lies behind the barrier above.
        update_state<K, V, kThreadsK>(S, L::ldv32, eG[kC - 1], sk, L::ldk, sv, L::ldv, S16, L::ldv);
      } else {
        copy_state<K, V, kThreadsK>(S16, L::ldv, S, L::ldv32);  // S16 is read only after the next barrier
      }
      __syncthreads();  // the next chunk's rows replace q, k, v, do
    }
    return;
  }

  // Reverse walk: S holds dS' (the gradient of the state leaving the chunk).
  float* dots = dot_k != nullptr ? dot_k + dots_at : nullptr;
  load_state<K, V, kThreadsK>(S, L::ldv32, d_final != nullptr ? d_final + state_at : nullptr);
  __syncthreads();
  copy_state<K, V, kThreadsK>(S16, L::ldv, S, L::ldv32);
  RowPrefetch<K, E, kThreadsK> nq, nk;
  RowPrefetch<V, E, kThreadsK> nv, ndo;
  auto fetch = [&](int t0) {
    nq.fetch(q + head_k, sk_row, t0, p.T), nk.fetch(k + head_k, sk_row, t0, p.T);
    nv.fetch(v + head_v, sv_row, t0, p.T), ndo.fetch(dout + head_v, sv_row, t0, p.T);
    return fetch_gates(gh, t0, p.T);
  };
  float2 ng = fetch((N - 1) * kC);
  for (int n = N - 1; n >= 0; --n) {
    const int t0 = n * kC;
    nq.put(sq, L::ldk), nk.put(sk, L::ldk), nv.put(sv, L::ldv), ndo.put(sdo, L::ldv);
    chunk_gates(G, ng);
    if (n > 0) ng = fetch(t0 - kC);  // in flight while this chunk is computed
    __syncthreads();
    decayed_scores16<K, kThreadsK>(A16, L::ldc, sq, sk, L::ldk, G, p.scale);
    decayed_scores16<V, kThreadsK>(dA16, L::ldc, sdo, sv, L::ldv, G, p.scale, 2);  // its extra tiles to other warps
    __syncthreads();
    // dk = dA^T q + e^{Gl-G} (v dS'^T) into the staging area (k itself stays unscaled for k·dk), and
    // dv = A^T do + e^{Gl-G} (k dS') straight to global memory, their tiles spread over the warps together.
    for (int t = threadIdx.x / 32; t < kRowTiles * (K / 16 + V / 16); t += kThreadsK / 32) {
      Acc acc;
      zero(acc);
      if (t < kRowTiles * (K / 16)) {
        const int R = t / (K / 16), Cc = t % (K / 16);
        product_tile<false, true>(acc, sv, L::ldv, S16, L::ldv, R, Cc, 0, V / 16);
        scale_tile_rows(acc, eEnd, R, 1.f);
        product_tile<true, false>(acc, dA16, L::ldc, sq, L::ldk, R, Cc, R, kRowTiles);
        store_tile(stage + R * 16 * L::ldo32 + Cc * 16, acc, L::ldo32);
      } else {
        const int u = t - kRowTiles * (K / 16), R = u / (V / 16), Cc = u % (V / 16);
        product_tile<false, false>(acc, sk, L::ldk, S16, L::ldv, R, Cc, 0, K / 16);
        scale_tile_rows(acc, eEnd, R, 1.f);
        product_tile<true, false>(acc, A16, L::ldc, sdo, L::ldv, R, Cc, R, kRowTiles);
        store_tile16_rows(dv + head_v + 16 * Cc, sv_row, t0 + 16 * R, p.T, acc);
      }
    }
    __syncthreads();
    store_rows<K, kThreadsK>(dk + head_k, sk_row, t0, p.T, stage, L::ldo32, sk, L::ldk, dots);
    scale_rows<K, kThreadsK>(sq, L::ldk, eG, p.scale);
    __syncthreads();
    // dS = e^Gl dS' + (scale e^G q)^T do, and its 16-bit copy (dk's and dv's products, which read it, lie
    // behind the barrier above)
    update_state<K, V, kThreadsK>(S, L::ldv32, eG[kC - 1], sq, L::ldk, sdo, L::ldv, S16, L::ldv);
    __syncthreads();
  }
  if (d_initial != nullptr) store_state<K, V, kThreadsK>(d_initial + state_at, S, L::ldv32);
}

// Calls fn(key size tag, value size tag, element tag) for the supported sizes (K = V = 64 or 128) and
// dtypes.
template <typename Fn>
void dispatch(int64_t K, int64_t V, torch::ScalarType dt, Fn fn) {
  TORCH_CHECK(scalar_decay_chunk_supported(K, V, dt), "fused scalar-decay chunk: expects K = V = 64 or 128 and bf16 ",
              "or fp16 q, k, v; got K=", K, " V=", V, " ", dt);
  auto by_size = [&](auto elem) {
    using I64 = std::integral_constant<int, 64>;
    using I128 = std::integral_constant<int, 128>;
    if (K == 64) fn(I64{}, I64{}, elem);
    else fn(I128{}, I128{}, elem);
  };
  dispatch_16bit(dt, by_size);
}

}  // namespace

bool scalar_decay_chunk_supported(int64_t K, int64_t V, torch::ScalarType dt) {
  return (K == 64 || K == 128) && V == K && (dt == torch::kBFloat16 || dt == torch::kHalf);
}

std::pair<torch::Tensor, torch::Tensor> scalar_decay_chunk_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                   const torch::Tensor& v, const torch::Tensor& g,
                                                                   const torch::Tensor& h0, double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = torch::empty_like(v);
  auto final_state = torch::empty({B, H, K, V}, v.options().dtype(torch::kFloat));
  if (T == 0) {
    final_state.copy_(h0.defined() ? h0 : torch::zeros_like(final_state));
    return {o, final_state};
  }
  const Shape p{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<float>(scale)};
  dispatch(K, V, q.scalar_type(), [&](auto key_size, auto value_size, auto elem) {
    constexpr int KK = decltype(key_size)::value, VV = decltype(value_size)::value;
    using E = decltype(elem);
    auto kernel = chunk_forward_kernel<KK, VV, E>;
    constexpr size_t smem = Layout<KK, VV>::bytes;
    launch(kernel, static_cast<unsigned>(B * H), kBlockThreads<KK>, smem,
        data_as<E>(q), data_as<E>(k), data_as<E>(v), ptr_or_null(g), ptr_or_null(h0), data_as<E>(o),
        final_state.data_ptr<float>(), p);
  });
  return {o, final_state};
}

ScalarDecayChunkGrads scalar_decay_chunk_backward(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v, const torch::Tensor& g,
                                                  const torch::Tensor& h0, const torch::Tensor& d_out,
                                                  const torch::Tensor& d_final, double scale, bool want_d_initial,
                                                  bool want_row_dots) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  ScalarDecayChunkGrads out;
  out.dq = torch::empty_like(q);
  out.dk = torch::empty_like(k);
  out.dv = torch::empty_like(v);
  if (want_d_initial) out.d_initial = torch::empty({B, H, K, V}, v.options().dtype(torch::kFloat));
  if (want_row_dots) {
    out.dot_q = torch::empty({B, H, T}, v.options().dtype(torch::kFloat));
    out.dot_k = torch::empty({B, H, T}, v.options().dtype(torch::kFloat));
  }
  if (T == 0) {
    if (want_d_initial) out.d_initial.copy_(d_final.defined() ? d_final : torch::zeros_like(out.d_initial));
    return out;
  }
  const Shape p{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<float>(scale)};
  dispatch(K, V, q.scalar_type(), [&](auto key_size, auto value_size, auto elem) {
    constexpr int KK = decltype(key_size)::value, VV = decltype(value_size)::value;
    using E = decltype(elem);
    auto kernel = chunk_backward_kernel<KK, VV, E>;
    constexpr size_t smem = Layout<KK, VV>::bytes;
    const dim3 grid(static_cast<unsigned>(B * H), 2);
    launch(kernel, grid, kBlockThreads<KK>, smem,
        data_as<E>(q), data_as<E>(k), data_as<E>(v), ptr_or_null(g), ptr_or_null(h0), data_as<E>(d_out),
        ptr_or_null(d_final), data_as<E>(out.dq), data_as<E>(out.dk), data_as<E>(out.dv), out_or_null(out.d_initial),
        out_or_null(out.dot_q), out_or_null(out.dot_k), p);
  });
  return out;
}

}  // namespace linearize::ops::cuda_kernels
