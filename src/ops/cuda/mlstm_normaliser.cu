// The mLSTM's gates and normaliser in fp32 (see mlstm_normaliser.h, mlstm_normaliser_forward): everything of the
// mLSTM's chunked form that mlstm/fused_chunk.cpp does not hand to the scalar-decay chunk kernels,
// and the division of its numerator by the denominator.
//
// The gates come first, one warp per (batch, head, segment of the steps) walking 32 steps at a time: m
// from a warp-wide scan of the maps m -> max(m + log σ(f_t), i_t) (first (α1, β1) then (α2, β2)
// composes to (α1 + α2, max(β1 + α2, β2))), then g_t = log σ(f_t) + m_{t-1} - m_t and w_t = e^{i_t - m_t}.
// A first pass composes each segment's map, so that a segment starts from m0 carried through the maps
// of the segments before it.
//
// The normaliser's state is K independent recurrences, n_t[c] = e^{g_t} n_{t-1}[c] + w_t k_t[c], so its
// walk has one thread per key channel and exchanges nothing between threads; the sums over the channels
// (den_t = n_t · scale q_t, and in the backward the gates' gradients) are taken per sub-tile of 16 steps,
// from products kept in shared memory, a warp a row. The walks copy the next sub-tile's rows into shared
// memory while they walk the current one. One (batch, head) alone would leave the walk with two warps and
// its latency in full, so the steps are split into segments of whole tiles of 64 steps, a block each: a
// first pass walks every segment from zero (segment_walk_kernel), and the main walk starts each segment
// from n0 carried over the segments before it, n_in(s + 1) = e^{Σ_s g} n_in(s) + (segment s from zero).
//
// The backward walks the same segments in reverse. It recomputes a sub-tile's n from the n that entered
// it (saved for every sub-tile by the forward), then carries λ_t = dL/dn_t back:
//   λ_t   = dden_t scale q_t + e^{g_{t+1}} λ_{t+1}          (after the last step: dL/dn_T)
//   dk'_t = λ_t + the numerator's gradient of k'_t,  dk_t = w_t dk'_t,  d(i_t - m_t) = dk'_t · k'_t
//   dq_t  = dden_t scale n_t,  dg_t = e^{g_t} n_{t-1} · λ_t,  dn_0 = e^{g_0} λ_0
// (λ across the segments as n, from the end). Warps per (batch, head, segment) then turn dg and
// d(i - m) into the gates' gradients. In g_t and k'_t, m is held constant (only m_{-1} = m0 is an input there;
// mlstm/fused_chunk.cpp adds m's own gradient), and the gradient dm_t of the returned m runs back
// through the max: to log σ(f_t) and m_{t-1} where the forget branch won, to i_t where the input gate
// did. That is a reverse scan of the maps x -> [forget won] (x + dm_t), also warp-wide, composed per
// segment first as the forward's maps are.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_pipeline.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cuda/chunk_tiles.cuh"
#include "ops/cuda/mlstm_normaliser.h"
#include "ops/cuda/launch.cuh"

namespace linearize::ops::cuda_kernels {

namespace {

constexpr int kTile = 64;  // steps per tile of the normaliser's walks
constexpr unsigned kAll = 0xffffffffu;

// Steps per sub-tile of the normaliser's walks. A block holds a sub-tile's rows (q, k; in the backward also
// dk') twice over, the next sub-tile's copy in flight while it walks this one, and the row products of
// this one: at K = 128 in bf16, 24 KiB a block in the forward and 41 KiB in the backward (eight and five
// blocks an SM). The forward saves the n entering each sub-tile for the backward.
constexpr int kSub = 16;
constexpr int kSubs = kTile / kSub;  // sub-tiles per tile

__host__ __device__ __forceinline__ int tiles_of(int64_t T) { return static_cast<int>((T + kTile - 1) / kTile); }

__device__ __forceinline__ float to_float(float x) { return x; }
template <>
__device__ __forceinline__ float from_float(float x) { return x; }

__device__ __forceinline__ float log_sigmoid(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }
__device__ __forceinline__ float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// The gate inputs of one step, read by one lane (fp32 [B,T,H], fg and ig at this head's column).
struct Gates {
  float f, lf, ig;  // forget gate pre-activation, log σ(f), input gate
  bool live;        // the step is before T
};
__device__ __forceinline__ Gates read_gates(const float* __restrict__ fg, const float* __restrict__ ig, int t, int T,
                                            int H) {
  Gates s;
  s.live = t < T;
  s.f = s.live ? fg[static_cast<size_t>(t) * H] : 0.f;
  s.lf = s.live ? log_sigmoid(s.f) : 0.f;
  s.ig = s.live ? ig[static_cast<size_t>(t) * H] : -INFINITY;
  return s;
}

// The max-state maps m -> max(m + α, β) of 32 steps (one per lane, α = log σ(f), β = i; past T the
// identity, α = 0 and β = -inf), scanned in place: afterwards lane L holds the map of steps 0..L.
__device__ __forceinline__ void scan_max_maps(float& a, float& b) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float ap = __shfl_up_sync(kAll, a, off), bp = __shfl_up_sync(kAll, b, off);
    if (lane >= off) b = fmaxf(bp + a, b), a = ap + a;
  }
}

// m_t for 32 steps (one per lane), given the max state before them, m_in, which then moves past them.
__device__ __forceinline__ float max_state_scan(const Gates& s, float& m_in) {
  float a = s.lf, b = s.ig;
  scan_max_maps(a, b);
  const float m = fmaxf(m_in + a, b);
  m_in = __shfl_sync(kAll, m, 31);
  return m;
}

// m's gradient walked back over 32 steps (one per lane) passes through the maps x -> [forget won]
// (x + dm) (the identity past T), scanned from the last step: afterwards lane L holds x -> M x + A, the
// steps L..31 composed (the later ones applied first).
__device__ __forceinline__ void scan_gradient_maps(float dm, bool forget_won, bool live, float& M, float& A) {
  const int lane = threadIdx.x & 31;
  M = !live || forget_won ? 1.f : 0.f, A = live && forget_won ? dm : 0.f;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float Mo = __shfl_down_sync(kAll, M, off), Ao = __shfl_down_sync(kAll, A, off);
    if (lane + off < 32) A = M * Ao + A, M = M * Mo;
  }
}

// The gradient reaching m_t from the returned m, for 32 steps walked back (one per lane): c_t = dm_t +
// (what m_{t+1} passes back), and m_t passes c_t on to m_{t-1} where the forget branch won, nothing
// where the input gate did. `carry` enters as what reaches the last of the steps from after them and
// leaves as what the first passes back.
__device__ __forceinline__ float max_state_gradient(float dm, bool forget_won, bool live, float& carry) {
  const int lane = threadIdx.x & 31;
  float M, A;
  scan_gradient_maps(dm, forget_won, live, M, A);
  const float through = M * carry + A;               // what this lane's step passes back
  float after = __shfl_down_sync(kAll, through, 1);  // what reaches it from the next step
  if (lane == 31) after = carry;
  carry = __shfl_sync(kAll, through, 0);
  return after + dm;
}

// Head (b, h) of x [B, T, H, K]: row t at t * H * K.
template <typename E>
__device__ __forceinline__ E* head_of(E* x, int b, int h, int T, int H, int K) {
  return x == nullptr ? nullptr : x + (static_cast<size_t>(b) * T * H + h) * K;
}

// Starts copying rows t0 .. t0+Rows-1 of one head (row stride H*K) into shared memory [Rows][K] unpadded
// (thread c reads column c, so consecutive threads read consecutive elements), 16 bytes at a time
// through cp.async, while the block reads its gates; rows past T, or of an absent tensor, are zeros.
// The caller commits, and waits before reading.
template <typename E, int K, int Rows = kTile>
__device__ __forceinline__ void start_tile_copy(E* dst, const E* __restrict__ x, size_t stride, int t0, int T) {
  constexpr int kPerRow = K * static_cast<int>(sizeof(E)) / 16, kWords = Rows * kPerRow / K;
  static_assert(Rows * kPerRow % K == 0, "whole words a thread");
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const int i = threadIdx.x + j * K, r = i / kPerRow, c = (i % kPerRow) * (16 / static_cast<int>(sizeof(E)));
    E* d = dst + r * K + c;
    if (x != nullptr && t0 + r < T) __pipeline_memcpy_async(d, x + (t0 + r) * stride + c, 16);
    else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
}

// The row sums sum_c x[r][c] of rows r < rows of a [rows][K + 1] tile (and of a second tile y, when given),
// handed to out(r, sum of x, sum of y). The block (K threads) shares the rows a warp at a time: the lanes
// take the columns lane, lane + 32, ... (consecutive words, no bank met twice), then a butterfly over the
// lanes. A thread per row would add K terms in sequence while most of the block waits.
template <int K, typename Out>
__device__ __forceinline__ void row_sums(const float (*x)[K + 1], const float (*y)[K + 1], int rows, Out out) {
  constexpr int kWarps = K / 32;
  const int lane = threadIdx.x & 31;
  for (int r = threadIdx.x / 32; r < rows; r += kWarps) {
    float sx = 0.f, sy = 0.f;
#pragma unroll
    for (int i = 0; i < K / 32; ++i) {
      sx += x[r][lane + 32 * i];
      if (y != nullptr) sy += y[r][lane + 32 * i];
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      sx += __shfl_xor_sync(kAll, sx, o);
      if (y != nullptr) sy += __shfl_xor_sync(kAll, sy, o);
    }
    if (lane == 0) out(r, sx, sy);
  }
}

// Dynamic shared memory of the walks (byte offsets; fp32 tiles first, 16-byte aligned).
template <typename In, typename Lo, int K>
struct Smem {
  static constexpr size_t sums = (size_t{kSub} * (K + 1) * 4 + 15) / 16 * 16;  // one [kSub][K + 1] fp32
  static constexpr size_t rows_in = size_t{kTile} * K * sizeof(In);
  static constexpr size_t sub_in = size_t{kSub} * K * sizeof(In), sub_lo = size_t{kSub} * K * sizeof(Lo);
  static constexpr size_t segment_walk = rows_in;  // y (a tile)
  // A sub-tile's rows, one of two buffers: q | k (and dk' in the backward).
  static constexpr size_t forward_rows = 2 * sub_in, backward_rows = 2 * sub_in + sub_lo;
  static constexpr size_t forward = sums + 2 * forward_rows;           // prod | rows x 2
  static constexpr size_t backward = 2 * sums + 2 * backward_rows;     // nrow | kprod | rows x 2
};

// The segment of blockIdx.x: (batch, head) bh and segment s of S, its tiles [first, end).
struct Segment {
  int bh, s, first, end;
};
__device__ __forceinline__ Segment segment_of(int S, int seg_tiles, int T) {
  Segment x;
  x.bh = blockIdx.x / S, x.s = blockIdx.x % S;
  x.first = x.s * seg_tiles;
  x.end = min(x.first + seg_tiles, tiles_of(T));
  return x;
}

// The sub-tiles [first, end) of a segment's tiles that hold steps before T (at least its first).
struct SubTiles {
  int first, end;
};
__device__ __forceinline__ SubTiles sub_tiles_of(const Segment& seg, int T) {
  return {seg.first * kSubs, min(seg.end * kSubs, (T + kSub - 1) / kSub)};
}

// The segment of one warp of the gate kernels: warp (bh, s) of B*H*S takes steps [begin, end) of segment s.
struct WarpSegment {
  int bh, s, begin, end;
  bool valid;
};
__device__ __forceinline__ WarpSegment warp_segment(int BH, int S, int seg_len, int T) {
  const int id = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  WarpSegment x;
  x.bh = id / S, x.s = id % S, x.valid = x.bh < BH;
  x.begin = x.s * seg_len, x.end = min(x.begin + seg_len, T);
  return x;
}

// A warp's steps [begin, end) read 32 at a time (one per lane), four groups of 32 fetched together so
// that their loads overlap: read(t) then use(t, what was read), group by group, in order or reversed.
template <bool Reverse, typename Read, typename Use>
__device__ __forceinline__ void over_groups(int begin, int end, Read read, Use use) {
  const int lane = threadIdx.x & 31, groups = (end - begin + 31) / 32;
  for (int base = 0; base < groups; base += 4) {
    decltype(read(0)) x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int gr = Reverse ? groups - 1 - (base + i) : base + i;
      if (base + i < groups) x[i] = read(begin + gr * 32 + lane);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int gr = Reverse ? groups - 1 - (base + i) : base + i;
      if (base + i < groups) use(begin + gr * 32 + lane, x[i]);
    }
  }
}

// The gates, one warp per (batch, head, segment) walking the segment's steps: m_t, g_t = log σ(f_t) +
// m_{t-1} - m_t and the key factor w_t = e^{i_t - m_t} [B,H,T], and gsum [B,H,S] the sum of g over the
// segment. The max state entering the segment is m0 carried through the earlier segments' maps
// (alpha, beta [B,H,S]), which the MapOnly pass writes first.
template <bool MapOnly>
__global__ void gates_forward_kernel(const float* __restrict__ ig, const float* __restrict__ fg,
                                     const float* __restrict__ m0, float* __restrict__ alpha,
                                     float* __restrict__ beta, float* __restrict__ m_out, float* __restrict__ g_out,
                                     float* __restrict__ w_out, float* __restrict__ gsum, int BH, int T, int H,
                                     int seg_len, int S) {
  const WarpSegment seg = warp_segment(BH, S, seg_len, T);
  if (!seg.valid) return;  // whole warps
  const int b = seg.bh / H, h = seg.bh % H, lane = threadIdx.x & 31;
  const float* fgh = fg + static_cast<size_t>(b) * T * H + h;
  const float* igh = ig + static_cast<size_t>(b) * T * H + h;
  const size_t row = static_cast<size_t>(seg.bh) * T, at = static_cast<size_t>(seg.bh) * S;
  auto read = [&](int t) { return read_gates(fgh, igh, t, T, H); };
  if (MapOnly) {
    float A = 0.f, Bm = -INFINITY;  // the identity
    over_groups<false>(seg.begin, seg.end, read, [&](int, const Gates& s) {
      float a = s.lf, b = s.ig;
      scan_max_maps(a, b);
      const float ga = __shfl_sync(kAll, a, 31), gb = __shfl_sync(kAll, b, 31);
      Bm = fmaxf(Bm + ga, gb), A += ga;
    });
    if (lane == 0) alpha[at + seg.s] = A, beta[at + seg.s] = Bm;
    return;
  }
  float m_in = m0[seg.bh], part = 0.f;
  for (int s = 0; s < seg.s; ++s) m_in = fmaxf(m_in + alpha[at + s], beta[at + s]);
  over_groups<false>(seg.begin, seg.end, read, [&](int t, const Gates& s) {
    float m_prev = m_in;  // lane 0: the step before the group
    const float m = max_state_scan(s, m_in);
    const float up = __shfl_up_sync(kAll, m, 1);
    if (lane > 0) m_prev = up;
    const float g = s.lf + m_prev - m;
    if (s.live) m_out[row + t] = m, g_out[row + t] = g, w_out[row + t] = expf(s.ig - m), part += g;
  });
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kAll, part, off);
  if (lane == 0) gsum[at + seg.s] = part;
}

// The gates' gradients, one warp per (batch, head, segment) walking the segment's steps back: given the
// normaliser's sums dg_n (of dg) and dlogw (of d(i - m)) per step, and the gradients d_g, d_m of the
// returned g and m. m's gradient entering the segment from its end is carried back through the later
// segments' maps x -> M x + A (map_m, map_a [B,H,S]), which the MapOnly pass writes first.
template <bool MapOnly>
__global__ void gates_backward_kernel(const float* __restrict__ ig, const float* __restrict__ fg,
                                      const float* __restrict__ m0, const float* __restrict__ m,
                                      const float* __restrict__ dg_n, const float* __restrict__ dlogw,
                                      const float* __restrict__ d_g, const float* __restrict__ d_m,
                                      float* __restrict__ map_m, float* __restrict__ map_a, float* __restrict__ d_ig,
                                      float* __restrict__ d_fg, float* __restrict__ d_m0, int BH, int T, int H,
                                      int seg_len, int S) {
  const WarpSegment seg = warp_segment(BH, S, seg_len, T);
  if (!seg.valid) return;  // whole warps
  const int b = seg.bh / H, h = seg.bh % H, lane = threadIdx.x & 31;
  const size_t grow = static_cast<size_t>(b) * T * H + h;  // this head's column of [B, T, H]
  const size_t row = static_cast<size_t>(seg.bh) * T, at = static_cast<size_t>(seg.bh) * S;
  struct Step {
    Gates s;
    bool forget_won;  // m_t = log σ(f_t) + m_{t-1}, not i_t
    float dg, dlogw, dm;
  };
  auto read = [&](int t) {
    Step x;
    x.s = read_gates(fg + grow, ig + grow, t, T, H);
    const bool live = x.s.live;
    const float m_prev = !live ? 0.f : t == 0 ? m0[seg.bh] : m[row + t - 1];
    x.forget_won = x.s.lf + m_prev >= x.s.ig;
    x.dm = live && d_m != nullptr ? d_m[row + t] : 0.f;
    x.dg = live && !MapOnly ? dg_n[row + t] + (d_g != nullptr ? d_g[row + t] : 0.f) : 0.f;
    x.dlogw = live && !MapOnly ? dlogw[row + t] : 0.f;
    return x;
  };
  if (MapOnly) {
    float Ms = 1.f, As = 0.f;  // the identity
    over_groups<true>(seg.begin, seg.end, read, [&](int, const Step& x) {
      float M, A;
      scan_gradient_maps(x.dm, x.forget_won, x.s.live, M, A);
      const float gm = __shfl_sync(kAll, M, 0), ga = __shfl_sync(kAll, A, 0);
      As = gm * As + ga, Ms = gm * Ms;  // the group after what came later
    });
    if (lane == 0) map_m[at + seg.s] = Ms, map_a[at + seg.s] = As;
    return;
  }
  float carry = 0.f, dg_first = 0.f;
  for (int s = S - 1; s > seg.s; --s) carry = map_m[at + s] * carry + map_a[at + s];
  over_groups<true>(seg.begin, seg.end, read, [&](int t, const Step& x) {
    const float c_t = max_state_gradient(x.dm, x.forget_won, x.s.live, carry);
    if (x.s.live) {
      d_fg[grow + static_cast<size_t>(t) * H] = (x.dg + (x.forget_won ? c_t : 0.f)) * sigmoid(-x.s.f);
      d_ig[grow + static_cast<size_t>(t) * H] = x.dlogw + (x.forget_won ? 0.f : c_t);
    }
    if (t == 0) dg_first = x.dg;  // g_0 = log σ(f_0) + m0 - m_0
  });
  if (seg.s == 0 && lane == 0) d_m0[seg.bh] = carry + dg_first;
}

// Per segment, the walk from zero over its steps (one thread per channel), of
//   forward:  x_t = a_t x_{t-1} + b_t y_t       (n from k' = w k: y = k, b = w)
//   reverse:  x_t = a_t (x_{t+1} + b_t y_t)     (μ from λ = dden scale q + μ: y = q, b = scale dden)
// with a = e^g: what the segment adds to the state it passes on, out [B,H,S,K].
template <typename In, int K, bool Reverse>
__global__ void __launch_bounds__(K) segment_walk_kernel(const In* __restrict__ y, const float* __restrict__ g,
                                                         const float* __restrict__ bcoef, float b_scale,
                                                         float* __restrict__ out, int T, int H, int seg_tiles, int S) {
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(16, unsigned char, smem);
  In* sy = reinterpret_cast<In*>(smem);
  __shared__ float decay[kTile], coef[kTile];
  const Segment seg = segment_of(S, seg_tiles, T);
  const int b = seg.bh / H, h = seg.bh % H, c = threadIdx.x;
  const size_t stride = static_cast<size_t>(H) * K, row = static_cast<size_t>(seg.bh) * T;
  const In* yh = head_of(y, b, h, T, H, K);
  float x = 0.f;
  for (int i = 0; i < seg.end - seg.first; ++i) {
    const int tile = Reverse ? seg.end - 1 - i : seg.first + i, t0 = tile * kTile, len = min(kTile, T - t0);
    start_tile_copy<In, K>(sy, yh, stride, t0, T);
    __pipeline_commit();
    if (c < kTile) {
      const bool live = c < len;
      decay[c] = live ? expf(g[row + t0 + c]) : 1.f;
      coef[c] = live && bcoef != nullptr ? bcoef[row + t0 + c] * b_scale : 0.f;
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    if (Reverse) {
#pragma unroll 8
      for (int j = len - 1; j >= 0; --j) x = decay[j] * (x + coef[j] * to_float(sy[j * K + c]));
    } else {
#pragma unroll 8
      for (int j = 0; j < len; ++j) x = decay[j] * x + coef[j] * to_float(sy[j * K + c]);
    }
    __syncthreads();
  }
  out[(static_cast<size_t>(seg.bh) * S + seg.s) * K + c] = x;
}

template <typename In, typename Lo, int K>
__global__ void __launch_bounds__(K) normaliser_forward_kernel(
    const In* __restrict__ q, const In* __restrict__ k, const float* __restrict__ g, const float* __restrict__ w,
    const float* __restrict__ gsum, const float* __restrict__ n_local, const float* __restrict__ n0,
    Lo* __restrict__ kp, float* __restrict__ den, float* __restrict__ n_final, float* __restrict__ entering, int T,
    int H, int seg_tiles, int S, float scale) {
  using L = Smem<In, Lo, K>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(16, unsigned char, smem);
  auto prod = reinterpret_cast<float(*)[K + 1]>(smem);  // n_t[c] q_t[c]
  auto rows = [&](int buf) { return reinterpret_cast<In*>(smem + L::sums + buf * L::forward_rows); };  // q | k
  __shared__ float decay[kSub], key_factor[kSub];
  const Segment seg = segment_of(S, seg_tiles, T);
  const SubTiles st = sub_tiles_of(seg, T);
  const int b = seg.bh / H, h = seg.bh % H, c = threadIdx.x;
  const size_t stride = static_cast<size_t>(H) * K, row = static_cast<size_t>(seg.bh) * T;
  const In* qh = head_of(q, b, h, T, H, K);
  const In* kh = head_of(k, b, h, T, H, K);
  Lo* kph = head_of(kp, b, h, T, H, K) + c;
  float* enter = entering + static_cast<size_t>(seg.bh) * tiles_of(T) * kSubs * K + c;  // [tiles * kSubs][K]
  auto fetch = [&](int sub, int buf) {
    start_tile_copy<In, K, kSub>(rows(buf), qh, stride, sub * kSub, T);
    start_tile_copy<In, K, kSub>(rows(buf) + kSub * K, kh, stride, sub * kSub, T);
  };
  auto gates_at = [&](int sub) {  // (e^g, w) of step c of the sub-tile, threads c < kSub
    const int t = sub * kSub + c;
    return c < kSub && t < T ? make_float2(expf(g[row + t]), w[row + t]) : make_float2(1.f, 0.f);
  };
  fetch(st.first, 0);
  __pipeline_commit();
  float2 next = gates_at(st.first);
  // The n entering the segment: n0 carried over the segments before it.
  float n = n0 != nullptr ? n0[static_cast<size_t>(seg.bh) * K + c] : 0.f;
#pragma unroll 8
  for (int s = 0; s < seg.s; ++s) {
    const size_t at = static_cast<size_t>(seg.bh) * S + s;
    n = expf(gsum[at]) * n + n_local[at * K + c];
  }
  for (int sub = st.first, buf = 0; sub < st.end; ++sub, buf ^= 1) {
    const int t0 = sub * kSub, len = min(kSub, T - t0);
    if (sub + 1 < st.end) fetch(sub + 1, buf ^ 1);  // the other buffer, free since the last barrier
    __pipeline_commit();
    if (c < kSub) decay[c] = next.x, key_factor[c] = next.y;
    if (sub + 1 < st.end) next = gates_at(sub + 1);
    enter[static_cast<size_t>(sub) * K] = n;
    __pipeline_wait_prior(1);  // this sub-tile's rows
    __syncthreads();
    const In* sq = rows(buf);
    const In* sk = sq + kSub * K;
#pragma unroll 8
    for (int j = 0; j < len; ++j) {
      const float kv = to_float(sk[j * K + c]) * key_factor[j];
      n = decay[j] * n + kv;
      kph[static_cast<size_t>(t0 + j) * stride] = from_float<Lo>(kv);
      prod[j][c] = n * to_float(sq[j * K + c]);
    }
    __syncthreads();
    row_sums<K>(prod, nullptr, len, [&](int r, float sum, float) { den[row + t0 + r] = sum * scale; });
  }
  if (seg.s == S - 1) n_final[static_cast<size_t>(seg.bh) * K + c] = n;
}

template <typename In, typename Lo, int K>
__global__ void __launch_bounds__(K) normaliser_backward_kernel(
    const In* __restrict__ q, const In* __restrict__ k, const float* __restrict__ g, const float* __restrict__ w,
    const float* __restrict__ gsum, const float* __restrict__ mu_local, const float* __restrict__ entering,
    const Lo* __restrict__ d_kp, const float* __restrict__ d_den, const float* __restrict__ d_final,
    const In* __restrict__ dq_add, In* __restrict__ dq, In* __restrict__ dk, float* __restrict__ dg_n,
    float* __restrict__ dlogw,
    float* __restrict__ d_n0, int T, int H, int seg_tiles, int S, float scale) {
  using L = Smem<In, Lo, K>;
  LINEARIZE_DYNAMIC_SHARED_ALIGNED(16, unsigned char, smem);
  auto nrow = reinterpret_cast<float(*)[K + 1]>(smem);              // n_t, then e^{g_t} n_{t-1}[c] λ_t[c]
  auto kprod = reinterpret_cast<float(*)[K + 1]>(smem + L::sums);  // dk'_t[c] k'_t[c]
  auto rows = [&](int buf) { return reinterpret_cast<In*>(smem + 2 * L::sums + buf * L::backward_rows); };
  __shared__ float decay[kSub], key_factor[kSub], dden[kSub];
  const Segment seg = segment_of(S, seg_tiles, T);
  const SubTiles st = sub_tiles_of(seg, T);
  const int b = seg.bh / H, h = seg.bh % H, c = threadIdx.x;
  const size_t stride = static_cast<size_t>(H) * K, row = static_cast<size_t>(seg.bh) * T;
  const In* qh = head_of(q, b, h, T, H, K);
  const In* kh = head_of(k, b, h, T, H, K);
  const Lo* dkph = head_of(d_kp, b, h, T, H, K);
  In* dqh = head_of(dq, b, h, T, H, K) + c;
  In* dkh = head_of(dk, b, h, T, H, K) + c;
  const In* dqah = dq_add != nullptr ? head_of(dq_add, b, h, T, H, K) + c : nullptr;
  const float* enter = entering + static_cast<size_t>(seg.bh) * tiles_of(T) * kSubs * K + c;
  auto fetch = [&](int sub, int buf) {  // q | k | dk'
    start_tile_copy<In, K, kSub>(rows(buf), qh, stride, sub * kSub, T);
    start_tile_copy<In, K, kSub>(rows(buf) + kSub * K, kh, stride, sub * kSub, T);
    start_tile_copy<Lo, K, kSub>(reinterpret_cast<Lo*>(rows(buf) + 2 * kSub * K), dkph, stride, sub * kSub, T);
  };
  struct Scalars {
    float decay, key_factor, dden;  // of step c of the sub-tile (threads c < kSub)
    float n_entering;               // channel c
  };
  auto scalars_at = [&](int sub) {
    const int t = sub * kSub + c;
    const bool live = c < kSub && t < T;
    return Scalars{live ? expf(g[row + t]) : 1.f, live ? w[row + t] : 0.f,
                   live && d_den != nullptr ? d_den[row + t] : 0.f, enter[static_cast<size_t>(sub) * K]};
  };
  fetch(st.end - 1, 0);
  __pipeline_commit();
  Scalars next = scalars_at(st.end - 1);
  // μ = e^{g_{t+1}} λ_{t+1} entering the segment from its end: dL/dn_T carried back over the later segments.
  float mu = d_final != nullptr ? d_final[static_cast<size_t>(seg.bh) * K + c] : 0.f;
#pragma unroll 8
  for (int s = S - 1; s > seg.s; --s) {
    const size_t at = static_cast<size_t>(seg.bh) * S + s;
    mu = expf(gsum[at]) * mu + mu_local[at * K + c];
  }
  for (int sub = st.end - 1, buf = 0; sub >= st.first; --sub, buf ^= 1) {
    const int t0 = sub * kSub, len = min(kSub, T - t0);
    if (sub > st.first) fetch(sub - 1, buf ^ 1);  // the other buffer, free since the last barrier
    __pipeline_commit();
    if (c < kSub) decay[c] = next.decay, key_factor[c] = next.key_factor, dden[c] = next.dden;
    const float n_entering = next.n_entering;
    if (sub > st.first) next = scalars_at(sub - 1);
    float dq_add_c[kSub];  // channel c of dq_add over the sub-tile, in flight through the first walk
#pragma unroll
    for (int j = 0; j < kSub; ++j)
      dq_add_c[j] = dqah != nullptr && t0 + j < T ? to_float(dqah[static_cast<size_t>(t0 + j) * stride]) : 0.f;
    __pipeline_wait_prior(1);  // this sub-tile's rows
    __syncthreads();
    const In* sq = rows(buf);
    const In* sk = sq + kSub * K;
    const Lo* sdkp = reinterpret_cast<const Lo*>(sq + 2 * kSub * K);
    float n = n_entering;
#pragma unroll 8
    for (int j = 0; j < len; ++j) {
      n = decay[j] * n + to_float(sk[j * K + c]) * key_factor[j];
      nrow[j][c] = n;
    }
#pragma unroll
    for (int j = kSub - 1; j >= 0; --j) {  // whole, so that dq_add_c stays in registers
      if (j >= len) continue;
      const size_t r = static_cast<size_t>(t0 + j) * stride;
      const float lambda = dden[j] * scale * to_float(sq[j * K + c]) + mu;
      const float dkp = lambda + to_float(sdkp[j * K + c]);
      const float n_t = nrow[j][c], n_prev = j > 0 ? nrow[j - 1][c] : n_entering;
      dkh[r] = from_float<In>(dkp * key_factor[j]);
      dqh[r] = from_float<In>(dden[j] * scale * n_t + dq_add_c[j]);
      kprod[j][c] = dkp * to_float(sk[j * K + c]) * key_factor[j];
      nrow[j][c] = decay[j] * n_prev * lambda;  // n_t is not read again: step j + 1 came first
      mu = decay[j] * lambda;
    }
    __syncthreads();
    row_sums<K>(nrow, kprod, len, [&](int r, float dg, float dlw) {
      dg_n[row + t0 + r] = dg, dlogw[row + t0 + r] = dlw;
    });
  }
  if (seg.s == 0 && d_n0 != nullptr) d_n0[static_cast<size_t>(seg.bh) * K + c] = mu;
}

// Eight consecutive values of an fp32 or 16-bit row <-> floats (16 or 32 bytes).
template <typename E>
__device__ __forceinline__ void load8_as_float(const E* src, float (&f)[8]) {
  if constexpr (std::is_same_v<E, float>) load8(src, f);
  else unpack8<E>(*reinterpret_cast<const uint4*>(src), f);
}
template <typename E>
__device__ __forceinline__ void store8_from_float(E* dst, const float (&f)[8]) {
  if constexpr (std::is_same_v<E, float>) store8(dst, f);
  else *reinterpret_cast<uint4*>(dst) = pack8<E>(f);
}

// The denominator of row r = (b, t, h) of [B,T,H,V] in denom [B,H,T].
__device__ __forceinline__ int64_t denom_index(int64_t r, int T, int H) {
  const int64_t h = r % H, t = (r / H) % T, b = r / (static_cast<int64_t>(H) * T);
  return (b * H + h) * T + t;
}

// The mLSTM's denominator of row r = (b, t, h), max(|den|, e^{-m}) + eps (den, m [B,H,T] at index at).
__device__ __forceinline__ float denominator(const float* __restrict__ den, const float* __restrict__ m, int64_t at,
                                             float eps) {
  return fmaxf(fabsf(den[at]), expf(-m[at])) + eps;
}

// h = o / (max(|den|, e^{-m}) + eps) row by row: o [B,T,H,V] 16-bit, den and m [B,H,T] fp32, h in Out.
// Each thread takes eight consecutive values of a row, V / 8 consecutive threads a row.
template <typename Lo, typename Out>
__global__ void divide_rows_forward_kernel(const Lo* __restrict__ o, const float* __restrict__ den,
                                           const float* __restrict__ m, float eps, Out* __restrict__ out,
                                           int64_t rows, int T, int H, int V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, r = i / (V / 8);
  if (r >= rows) return;
  const int64_t at = r * V + (i % (V / 8)) * 8;
  const float inv = 1.f / denominator(den, m, denom_index(r, T, H), eps);
  float f[8];
  load8_as_float(o + at, f);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] *= inv;
  store8_from_float(out + at, f);
}

// Its backward: d_o = dh / denom (o's dtype) and, with s = -Σ_v dh o / denom² (the sum over the V / 8
// threads of a row, a power of two, so a row's threads are a shuffle group), the gradients [B,H,T] fp32
//   d_den = s sign(den) where |den| wins the max (s / 2 sign(den) on a tie, as torch.maximum),
//   d_m   = s eps  (e^{-m} is taken as a constant: see mlstm/fused_chunk.cpp).
template <typename Lo, typename Out>
__global__ void divide_rows_backward_kernel(const Lo* __restrict__ o, const float* __restrict__ den,
                                            const float* __restrict__ m, float eps, const Out* __restrict__ dh,
                                            Lo* __restrict__ d_o, float* __restrict__ d_den, float* __restrict__ d_m,
                                            int64_t rows, int T, int H, int V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, r = i / (V / 8);
  const bool live = r < rows;  // every lane takes part in the shuffles
  const int64_t at = live ? r * V + (i % (V / 8)) * 8 : 0, d_at = live ? denom_index(r, T, H) : 0;
  float g[8] = {}, x[8] = {}, dot = 0.f;
  const float inv = live ? 1.f / denominator(den, m, d_at, eps) : 0.f;
  if (live) {
    load8_as_float(dh + at, g);
    load8_as_float(o + at, x);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) dot += g[j] * x[j], g[j] *= inv;
  if (live) store8_from_float(d_o + at, g);
  for (int off = V / 16; off > 0; off >>= 1) dot += __shfl_xor_sync(kAll, dot, off);
  if (live && i % (V / 8) == 0) {
    const float s = -dot * inv * inv, a = fabsf(den[d_at]), lower = expf(-m[d_at]);
    const float wins = a > lower ? 1.f : a == lower ? 0.5f : 0.f;
    d_den[d_at] = den[d_at] > 0.f ? s * wins : den[d_at] < 0.f ? -s * wins : 0.f;
    d_m[d_at] = s * eps;
  }
}

// fn(In{}, Lo{}, std::integral_constant<int, K>{}) for the supported input dtype (fp32 or the 16-bit
// dtype lo), lo and head size K.
template <typename Fn>
void dispatch(torch::ScalarType in, torch::ScalarType lo, int64_t K, Fn fn) {
  TORCH_CHECK(lo == torch::kBFloat16 || lo == torch::kHalf, "mlstm_normaliser: k' must be bf16 or fp16");
  TORCH_CHECK(in == torch::kFloat || in == lo, "mlstm_normaliser: q and k must be fp32 or k''s dtype");
  TORCH_CHECK(mlstm_normaliser_supported(K), "mlstm_normaliser: head size ", K, " (expected 64 or 128)");
  auto with_k = [&](auto in_tag, auto lo_tag) {
    if (K == 64) fn(in_tag, lo_tag, std::integral_constant<int, 64>{});
    else fn(in_tag, lo_tag, std::integral_constant<int, 128>{});
  };
  dispatch_16bit(lo, [&](auto lo_tag) {
    if (in == torch::kFloat) with_k(float{}, lo_tag);
    else with_k(lo_tag, lo_tag);
  });
}

// How the walks split the steps: S segments of seg_tiles tiles each (the last may be shorter), about
// kTargetBlocks blocks over the batch and heads while a segment keeps at least one tile. The blocks are of
// one size, so they run in waves, and the last wave leaves the GPU partly idle: with 5 (K = 128) to 11
// (K = 64) blocks an SM on 132 SMs and B*H = 256, a target of 8192 makes 3 to 13 waves with at most 11%
// of the last one's room idle, where 2048 made 2 to 4 waves with 22-29% idle.
// Each block first carries the state over the segments before it, so S stays at most kMaxSegments.
constexpr int64_t kMaxSegments = 64;
constexpr int64_t kTargetBlocks = 8192;
struct Segments {
  int64_t seg_tiles, S;
};
Segments segments(int64_t B, int64_t H, int64_t T) {
  const int64_t tiles = tiles_of(T);
  const int64_t want =
      std::min({tiles, kMaxSegments, std::max<int64_t>(1, (kTargetBlocks + B * H - 1) / (B * H))});
  const int64_t seg_tiles = (tiles + want - 1) / want;
  return {seg_tiles, (tiles + seg_tiles - 1) / seg_tiles};
}

constexpr int kGateWarps = 4;  // warps (each a segment of one head) per block of the gate kernels

}  // namespace

bool mlstm_normaliser_supported(int64_t K) { return K == 64 || K == 128; }

MlstmNormaliserForward mlstm_normaliser_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& igate, const torch::Tensor& fgate,
                                                const torch::Tensor& m0, const torch::Tensor& n0, double scale,
                                                torch::ScalarType kp_dtype) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto f32 = q.options().dtype(torch::kFloat);
  const auto [seg_tiles, S] = segments(B, H, T);
  MlstmNormaliserForward r;
  r.kp = torch::empty({B, T, H, K}, q.options().dtype(kp_dtype));
  r.g = torch::empty({B, H, T}, f32);
  r.m = torch::empty({B, H, T}, f32);
  r.w = torch::empty({B, H, T}, f32);
  r.gsum = torch::empty({B, H, S}, f32);
  r.den = torch::empty({B, H, T}, f32);
  r.n_final = torch::empty({B, H, K}, f32);
  r.entering = torch::empty({B, H, tiles_of(T) * kSubs, K}, f32);
  auto n_local = torch::empty({B, H, S, K}, f32);
  auto maps = torch::empty({2, B, H, S}, f32);  // the segments' max-state maps (alpha, beta)
  const dim3 gate_grid((B * H * S + kGateWarps - 1) / kGateWarps), gate_block(32 * kGateWarps);
  for (const bool map_only : {true, false}) {
    if (map_only && S == 1) continue;
    launch(map_only ? gates_forward_kernel<true> : gates_forward_kernel<false>, gate_grid, gate_block, 0,
           igate.data_ptr<float>(), fgate.data_ptr<float>(), m0.data_ptr<float>(), maps[0].data_ptr<float>(),
           maps[1].data_ptr<float>(), r.m.data_ptr<float>(), r.g.data_ptr<float>(), r.w.data_ptr<float>(),
           r.gsum.data_ptr<float>(), static_cast<int>(B * H), static_cast<int>(T), static_cast<int>(H),
           static_cast<int>(seg_tiles * kTile), static_cast<int>(S));
  }
  dispatch(q.scalar_type(), kp_dtype, K, [&](auto in_tag, auto lo_tag, auto k_tag) {
    using In = decltype(in_tag);
    using Lo = decltype(lo_tag);
    constexpr int Kc = decltype(k_tag)::value;
    const dim3 grid(B * H * S);
    if (S > 1)
      launch(segment_walk_kernel<In, Kc, false>, grid, dim3(Kc), Smem<In, Lo, Kc>::segment_walk, data_as<const In>(k),
             r.g.data_ptr<float>(), r.w.data_ptr<float>(), 1.f, n_local.data_ptr<float>(), static_cast<int>(T),
             static_cast<int>(H), static_cast<int>(seg_tiles), static_cast<int>(S));
    launch(normaliser_forward_kernel<In, Lo, Kc>, grid, dim3(Kc), Smem<In, Lo, Kc>::forward, data_as<const In>(q),
           data_as<const In>(k), r.g.data_ptr<float>(), r.w.data_ptr<float>(), r.gsum.data_ptr<float>(),
           n_local.data_ptr<float>(), ptr_or_null(n0), data_as<Lo>(r.kp), r.den.data_ptr<float>(),
           r.n_final.data_ptr<float>(), r.entering.data_ptr<float>(), static_cast<int>(T), static_cast<int>(H),
           static_cast<int>(seg_tiles), static_cast<int>(S), static_cast<float>(scale));
  });
  return r;
}

MlstmNormaliserGrads mlstm_normaliser_backward(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& igate, const torch::Tensor& fgate,
                                               const torch::Tensor& m0, const MlstmNormaliserForward& fw,
                                               const torch::Tensor& d_kp, const torch::Tensor& d_g,
                                               const torch::Tensor& d_m, const torch::Tensor& d_den,
                                               const torch::Tensor& d_final, double scale, bool want_d_n0,
                                               const torch::Tensor& dq_add) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto f32 = q.options().dtype(torch::kFloat);
  const auto [seg_tiles, S] = segments(B, H, T);
  TORCH_CHECK(!dq_add.defined() || (dq_add.sizes() == q.sizes() && dq_add.scalar_type() == q.scalar_type() &&
                                    dq_add.is_contiguous()),
              "mlstm_normaliser_backward: dq_add must be contiguous with q's shape ", q.sizes(), " and dtype ",
              q.scalar_type());
  MlstmNormaliserGrads r;
  r.dq = torch::empty_like(q);
  r.dk = torch::empty_like(k);
  r.d_igate = torch::empty({B, T, H}, f32);
  r.d_fgate = torch::empty({B, T, H}, f32);
  r.d_m0 = torch::empty({B, H}, f32);
  if (want_d_n0) r.d_n0 = torch::empty({B, H, K}, f32);
  auto mu_local = torch::empty({B, H, S, K}, f32);
  auto dg_n = torch::empty({B, H, T}, f32), dlogw = torch::empty({B, H, T}, f32);
  const auto lo = d_kp.defined() ? d_kp.scalar_type() : fw.kp.scalar_type();
  dispatch(q.scalar_type(), lo, K, [&](auto in_tag, auto lo_tag, auto k_tag) {
    using In = decltype(in_tag);
    using Lo = decltype(lo_tag);
    constexpr int Kc = decltype(k_tag)::value;
    const dim3 grid(B * H * S);
    if (S > 1)
      launch(segment_walk_kernel<In, Kc, true>, grid, dim3(Kc), Smem<In, Lo, Kc>::segment_walk, data_as<const In>(q),
             fw.g.data_ptr<float>(), ptr_or_null(d_den), static_cast<float>(scale), mu_local.data_ptr<float>(),
             static_cast<int>(T), static_cast<int>(H), static_cast<int>(seg_tiles), static_cast<int>(S));
    launch(normaliser_backward_kernel<In, Lo, Kc>, grid, dim3(Kc), Smem<In, Lo, Kc>::backward, data_as<const In>(q),
           data_as<const In>(k), fw.g.data_ptr<float>(), fw.w.data_ptr<float>(), fw.gsum.data_ptr<float>(),
           mu_local.data_ptr<float>(), fw.entering.data_ptr<float>(),
           d_kp.defined() ? data_as<const Lo>(d_kp) : nullptr, ptr_or_null(d_den), ptr_or_null(d_final),
           dq_add.defined() ? data_as<const In>(dq_add) : nullptr, data_as<In>(r.dq), data_as<In>(r.dk),
           dg_n.data_ptr<float>(), dlogw.data_ptr<float>(), out_or_null(r.d_n0), static_cast<int>(T),
           static_cast<int>(H), static_cast<int>(seg_tiles), static_cast<int>(S), static_cast<float>(scale));
  });
  auto maps = torch::empty({2, B, H, S}, f32);  // the segments' maps of m's gradient (M, A)
  const dim3 gate_grid((B * H * S + kGateWarps - 1) / kGateWarps), gate_block(32 * kGateWarps);
  for (const bool map_only : {true, false}) {
    if (map_only && S == 1) continue;
    launch(map_only ? gates_backward_kernel<true> : gates_backward_kernel<false>, gate_grid, gate_block, 0,
           igate.data_ptr<float>(), fgate.data_ptr<float>(), m0.data_ptr<float>(), fw.m.data_ptr<float>(),
           dg_n.data_ptr<float>(), dlogw.data_ptr<float>(), ptr_or_null(d_g), ptr_or_null(d_m),
           maps[0].data_ptr<float>(), maps[1].data_ptr<float>(), r.d_igate.data_ptr<float>(),
           r.d_fgate.data_ptr<float>(), r.d_m0.data_ptr<float>(), static_cast<int>(B * H), static_cast<int>(T),
           static_cast<int>(H), static_cast<int>(seg_tiles * kTile), static_cast<int>(S));
  }
  return r;
}

namespace {

// fn(Lo{}, Out{}) for o's 16-bit dtype and h's dtype (fp32 or o's), value size V = 64 or 128.
template <typename Fn>
void dispatch_rows(torch::ScalarType lo, torch::ScalarType out, int64_t V, Fn fn) {
  TORCH_CHECK(lo == torch::kBFloat16 || lo == torch::kHalf, "divide_rows: o must be bf16 or fp16");
  TORCH_CHECK(out == torch::kFloat || out == lo, "divide_rows: h must be fp32 or o's dtype");
  TORCH_CHECK(V == 64 || V == 128, "divide_rows: value size ", V, " (expected 64 or 128)");
  dispatch_16bit(lo, [&](auto lo_tag) {
    if (out == torch::kFloat) fn(lo_tag, float{});
    else fn(lo_tag, lo_tag);
  });
}

constexpr int kRowThreads = 256;

// den and m of the division: [B,H,T] fp32 contiguous each.
void check_denominator_parts(const torch::Tensor& den, const torch::Tensor& m, int64_t B, int64_t H, int64_t T) {
  for (const auto* x : {&den, &m})
    TORCH_CHECK(x->sizes() == torch::IntArrayRef({B, H, T}) && x->scalar_type() == torch::kFloat && x->is_contiguous(),
                "divide_rows: ", x == &den ? "den" : "m", " must be [", B, ", ", H, ", ", T,
                "] fp32 contiguous; got ", x->sizes(), " ", x->scalar_type());
}

}  // namespace

torch::Tensor divide_rows_forward(const torch::Tensor& o, const torch::Tensor& den, const torch::Tensor& m, double eps,
                                  torch::ScalarType out_dtype) {
  const int64_t B = o.size(0), T = o.size(1), H = o.size(2), V = o.size(3), rows = B * T * H;
  check_denominator_parts(den, m, B, H, T);
  const c10::cuda::CUDAGuard guard(o.device());
  auto h = torch::empty(o.sizes(), o.options().dtype(out_dtype));
  if (rows == 0) return h;
  dispatch_rows(o.scalar_type(), out_dtype, V, [&](auto lo_tag, auto out_tag) {
    using Lo = decltype(lo_tag);
    using Out = decltype(out_tag);
    launch(divide_rows_forward_kernel<Lo, Out>, dim3((rows * V / 8 + kRowThreads - 1) / kRowThreads),
           dim3(kRowThreads), 0, data_as<const Lo>(o), den.data_ptr<float>(), m.data_ptr<float>(),
           static_cast<float>(eps), data_as<Out>(h), rows, static_cast<int>(T), static_cast<int>(H),
           static_cast<int>(V));
  });
  return h;
}

DivideRowsGrads divide_rows_backward(const torch::Tensor& o, const torch::Tensor& den, const torch::Tensor& m,
                                     double eps, const torch::Tensor& dh) {
  const int64_t B = o.size(0), T = o.size(1), H = o.size(2), V = o.size(3), rows = B * T * H;
  check_denominator_parts(den, m, B, H, T);
  const c10::cuda::CUDAGuard guard(o.device());
  DivideRowsGrads r;
  r.d_o = torch::empty_like(o);
  r.d_den = torch::empty({B, H, T}, o.options().dtype(torch::kFloat));
  r.d_m = torch::empty_like(r.d_den);
  if (rows == 0) return r;
  dispatch_rows(o.scalar_type(), dh.scalar_type(), V, [&](auto lo_tag, auto out_tag) {
    using Lo = decltype(lo_tag);
    using Out = decltype(out_tag);
    launch(divide_rows_backward_kernel<Lo, Out>, dim3((rows * V / 8 + kRowThreads - 1) / kRowThreads),
           dim3(kRowThreads), 0, data_as<const Lo>(o), den.data_ptr<float>(), m.data_ptr<float>(),
           static_cast<float>(eps), data_as<const Out>(dh), data_as<Lo>(r.d_o), r.d_den.data_ptr<float>(),
           r.d_m.data_ptr<float>(), rows, static_cast<int>(T), static_cast<int>(H), static_cast<int>(V));
  });
  return r;
}

}  // namespace linearize::ops::cuda_kernels
