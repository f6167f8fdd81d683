// Device building blocks of the fused chunk kernels (ops/cuda/chunk_*.cu): chunks of 64 rows walked
// by one block of 256 threads, 16-bit operands in shared memory, products on tensor cores (mma.sync
// m16n8k16, fp32 accumulation), fp32 state and gates. Each .cu file keeps its own shared-memory layout
// and kernels; what they have in common lies here:
//   - 16-bit <-> fp32 conversion of single values (to_float, from_float) and of 16-byte words (Elem,
//     unpack8, pack8, load8);
//   - a 16x16 fp32 accumulator tile in mma.sync's register layout (Acc, zero, scale_tile, negate,
//     store_tile, load_tile) and 16-bit operand tiles loaded with ldmatrix (product_tile);
//   - tile products (product_tile, lower_tiles_into_stage, each_tile, square_tiles, tiles_into_stage,
//     two_tiles_into_stage, accumulate_state, update_state) over row-major tiles, the lower tiles in a
//     chosen order (tile_order, ordered_lower_tiles), and x - y tile by tile (subtract_tile16);
//   - the rows of one head fetched a chunk ahead into registers (RowPrefetch) and stored back with
//     optional fp32 row sums (store_rows) or a tile at a time from its accumulator (store_tile16,
//     store_tile16_rows, store_zero_tile16);
//   - the chunk's gates (fetch_gates, chunk_gates) and the row factors and causal decay mask built
//     from them, on 16-bit rows (scale_rows, scale_rows_to) or on accumulators (scale_tile_rows,
//     decay_tile, decayed_scores16);
//   - fp32 state in and out of shared memory (load_state, store_state, copy_state, store_state16), or
//     held in registers across a walk (RegisterState);
//   - views of the dynamic shared memory by byte offset (view).
// Included only by .cu files: everything here is device code in an unnamed namespace.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/shared_memory.cuh"

namespace linearize::ops::cuda_kernels {
namespace {

constexpr int kC = 64;  // rows per chunk
// Threads a block. The helpers that chunk_scalar_decay.cu uses to spread work over a block take the count as
// a template argument (kThreads unless given; that file launches 512 at head size 128); the others assume
// kThreads.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowTiles = kC / 16;
constexpr int kLowerTiles = kRowTiles * (kRowTiles + 1) / 2;  // 16x16 tiles on or below the diagonal

// 16-bit element types: two values in a 32-bit word <-> two floats.
__device__ __forceinline__ float2 widen(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 widen(__half2 h) { return __half22float2(h); }
template <typename P>
__device__ P narrow(float a, float b);
template <>
__device__ __forceinline__ __nv_bfloat162 narrow(float a, float b) { return __floats2bfloat162_rn(a, b); }
template <>
__device__ __forceinline__ __half2 narrow(float a, float b) { return __floats2half2_rn(a, b); }

template <typename E>
struct Elem {
  using Pair = std::conditional_t<std::is_same_v<E, __half>, __half2, __nv_bfloat162>;
  static __device__ __forceinline__ float2 unpack(uint32_t x) {
    Pair h;
    memcpy(&h, &x, 4);
    return widen(h);
  }
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const Pair h = narrow<Pair>(a, b);
    uint32_t x;
    memcpy(&x, &h, 4);
    return x;
  }
};

// One 16-bit value <-> float.
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename E>
__device__ E from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

// Eight 16-bit values (one 16-byte word) <-> eight floats.
template <typename E>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = Elem<E>::unpack(w[i]);
    f[2 * i] = p.x, f[2 * i + 1] = p.y;
  }
}
template <typename E>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(Elem<E>::pack(f[0], f[1]), Elem<E>::pack(f[2], f[3]), Elem<E>::pack(f[4], f[5]),
                    Elem<E>::pack(f[6], f[7]));
}
__device__ __forceinline__ void load8(const float* src, float (&f)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(float* dst, const float (&f)[8]) {
  *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
  *reinterpret_cast<float4*>(dst + 4) = make_float4(f[4], f[5], f[6], f[7]);
}

constexpr size_t round32(size_t x) { return (x + 31) / 32 * 32; }

// Strides and sizes in shared memory for the head-size-64 kernels, where a chunk's rows, its scores and a
// state are all 64 x 64: 16-bit rows padded by 8 elements, fp32 rows by 4 (tile pointers stay 32-byte
// aligned, and ldmatrix's 16-byte rows do not start on the same bank).
struct Pads64 {
  static constexpr int ld = 64 + 8, ld32 = 64 + 4;
  static constexpr size_t rows16 = round32(size_t{kC} * ld * 2);   // [64, ld] 16-bit
  static constexpr size_t mat32 = round32(size_t{kC} * ld32 * 4);  // [64, ld32] fp32
  static constexpr size_t vec = round32(kC * 4);                   // [64] fp32
};

// A region of the dynamic shared memory (the kernels' layouts give byte offsets).
template <typename T>
__device__ __forceinline__ T* view(unsigned char* smem, size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}

// A 16x16 fp32 accumulator tile as two 16x8 halves in the register layout of mma.sync.m16n8k16 (PTX ISA,
// "Matrix fragments for mma.m16n8k16"): lane l, with g = l / 4 and t = l % 4, holds in x[4h .. 4h+3] the
// elements (g, 8h + 2t), (g, 8h + 2t + 1), (g + 8, 8h + 2t), (g + 8, 8h + 2t + 1). Element-wise work on two
// tiles (a.x[i] * b.x[i]) needs nothing more than that both are Acc.
struct Acc {
  static constexpr int num_elements = 8;
  float x[num_elements];
};

__device__ __forceinline__ void zero(Acc& a) {
#pragma unroll
  for (int i = 0; i < Acc::num_elements; ++i) a.x[i] = 0.f;
}

// a *= factor.
__device__ __forceinline__ void scale_tile(Acc& a, float factor) {
#pragma unroll
  for (int i = 0; i < Acc::num_elements; ++i) a.x[i] *= factor;
}

// a = -a.
__device__ __forceinline__ void negate(Acc& a) {
#pragma unroll
  for (int i = 0; i < Acc::num_elements; ++i) a.x[i] = -a.x[i];
}

// The tile to / from fp32 row-major memory [16, ld] (ld even).
__device__ __forceinline__ void store_tile(float* p, const Acc& a, int ld) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* r = p + g * ld + 8 * h + 2 * t;
    *reinterpret_cast<float2*>(r) = make_float2(a.x[4 * h], a.x[4 * h + 1]);
    *reinterpret_cast<float2*>(r + 8 * ld) = make_float2(a.x[4 * h + 2], a.x[4 * h + 3]);
  }
}
__device__ __forceinline__ void load_tile(Acc& a, const float* p, int ld) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float* r = p + g * ld + 8 * h + 2 * t;
    const float2 top = *reinterpret_cast<const float2*>(r), bottom = *reinterpret_cast<const float2*>(r + 8 * ld);
    a.x[4 * h] = top.x, a.x[4 * h + 1] = top.y, a.x[4 * h + 2] = bottom.x, a.x[4 * h + 3] = bottom.y;
  }
}

// The tile as 16-bit values into row-major memory [16, ld] (ld even).
template <typename E>
__device__ __forceinline__ void store_tile16(E* p, const Acc& a, int ld) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    E* r = p + g * ld + 8 * h + 2 * t;
    *reinterpret_cast<uint32_t*>(r) = Elem<E>::pack(a.x[4 * h], a.x[4 * h + 1]);
    *reinterpret_cast<uint32_t*>(r + 8 * ld) = Elem<E>::pack(a.x[4 * h + 2], a.x[4 * h + 3]);
  }
}

// The tile from 16-bit values (row stride ld; global or shared memory).
template <typename E>
__device__ __forceinline__ void load_tile16(Acc& a, const E* p, int ld) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const E* r = p + g * ld + 8 * h + 2 * t;
    const float2 top = Elem<E>::unpack(*reinterpret_cast<const uint32_t*>(r));
    const float2 bottom = Elem<E>::unpack(*reinterpret_cast<const uint32_t*>(r + 8 * ld));
    a.x[4 * h] = top.x, a.x[4 * h + 1] = top.y, a.x[4 * h + 2] = bottom.x, a.x[4 * h + 3] = bottom.y;
  }
}

// A 16x16 tile of zeros (16-bit, row stride ld) by one warp: the tiles above a causal square's diagonal.
template <typename E>
__device__ __forceinline__ void store_zero_tile16(E* p, int ld) {
  Acc a;
  zero(a);
  store_tile16(p, a, ld);
}

// The tile as 16-bit values into rows row0 .. row0 + 15 of out (row stride `stride`, global memory); rows at
// or past T are dropped.
template <typename E>
__device__ __forceinline__ void store_tile16_rows(E* __restrict__ out, size_t stride, int row0, int T, const Acc& a) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= T) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint32_t*>(out + row * stride + 8 * h + 2 * t) =
          Elem<E>::pack(a.x[4 * h + 2 * r], a.x[4 * h + 2 * r + 1]);
  }
}

// x = x - a in place over one tile of 16-bit row-major memory [16, ld] (ld even), straight from the
// accumulator and rounded once.
template <typename E>
__device__ __forceinline__ void subtract_tile16(E* p, const Acc& a, int ld) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      auto* w = reinterpret_cast<uint32_t*>(p + (g + 8 * r) * ld + 8 * h + 2 * t);
      const float2 x = Elem<E>::unpack(*w);
      *w = Elem<E>::pack(x.x - a.x[4 * h + 2 * r], x.y - a.x[4 * h + 2 * r + 1]);
    }
  }
}

template <typename E>
__device__ __forceinline__ const E* tile(const E* m, int ld, int r16, int c16) {
  return m + r16 * 16 * ld + c16 * 16;
}

// Four 8x8 16-bit matrices from shared memory, lanes 8i .. 8i+7 giving the row addresses of matrix i; lane l
// receives in r[i] row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i, or with Trans rows 2 (l % 4)
// and 2 (l % 4) + 1 of column l / 4.
template <bool Trans>
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
#ifdef LINEARIZE_CUDA_EMULATION
  linearize::simt::load_matrices_x4(r, row, Trans);
#else
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#endif
}

// d += a b for one 16x8 half of an Acc: a a 16x16 row-major operand, b a 16x8 column-major one.
template <typename E>
__device__ __forceinline__ void mma_16x8x16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef LINEARIZE_CUDA_EMULATION
  linearize::simt::mma_m16n8k16(d, a, b0, b1, std::is_same_v<E, __half>);
#else
  if constexpr (std::is_same_v<E, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// acc += Σ_{s = s0}^{s1-1} X(R, s) Y(s, Cc) over 16x16 tiles, X row-major [., ldx] (or its transpose when
// TransX), Y row-major [., ldy] (or its transpose when TransY), both in shared memory with 16-byte aligned
// rows. Each operand tile is one ldmatrix of its four 8x8 quarters, transposing where the stored layout is
// not the one mma takes: the row operand a as a0..a3 = quarters (0-7, 0-7), (8-15, 0-7), (0-7, 8-15),
// (8-15, 8-15) of (row, k); the column operand b as b0, b1 of half 0 then of half 1 = quarters (k 0-7,
// n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
template <bool TransX, bool TransY, typename E>
__device__ __forceinline__ void product_tile(Acc& acc, const E* X, int ldx, const E* Y, int ldy, int R, int Cc,
                                             int s0, int s1) {
  const int lane = threadIdx.x % 32, eighth = lane % 8, second = (lane / 8) % 2, upper = lane / 16;
  // The stored row and column this lane addresses within a tile: quarter lane / 8 of the order above.
  const int xr = TransX ? eighth + 8 * upper : lane % 16, xc = TransX ? 8 * second : 8 * upper;
  const int yr = TransY ? eighth + 8 * upper : eighth + 8 * second, yc = TransY ? 8 * second : 8 * upper;
  for (int s = s0; s < s1; ++s) {
    const E* x = TransX ? tile(X, ldx, s, R) : tile(X, ldx, R, s);
    const E* y = TransY ? tile(Y, ldy, Cc, s) : tile(Y, ldy, s, Cc);
    uint32_t a[4], b[4];
    load_matrices<TransX>(a, x + xr * ldx + xc);
    load_matrices<!TransY>(b, y + yr * ldy + yc);
    mma_16x8x16<E>(acc.x, a, b[0], b[1]);
    mma_16x8x16<E>(acc.x + 4, a, b[2], b[3]);
  }
}

__device__ __forceinline__ void lower_tile(int t, int& R, int& Cc) {
  R = 0;
  while (t > R) t -= ++R;
  Cc = t;
}

// Upper tile number u of a [C, C] result (of the kRowTiles^2 - kLowerTiles above the diagonal): (b, a + 1)
// for lower tile u = (a, b).
__device__ __forceinline__ void upper_tile(int u, int& R, int& Cc) {
  lower_tile(u, Cc, R);
  ++Cc;
}

// The ten tiles on and below the diagonal in a given order, ten 4-bit codes 4 R + Cc (tile t in bits 4t ..
// 4t + 3). Warps 0 and 1 take a second tile (t = 8, 9), so an order for uneven products puts cheap tiles at
// t = 0, 1, 8 and 9.
constexpr uint64_t tile_order(const int (&codes)[kLowerTiles]) {
  uint64_t x = 0;
  for (int t = 0; t < kLowerTiles; ++t) x |= static_cast<uint64_t>(codes[t]) << (4 * t);
  return x;
}
constexpr int kNaturalCodes[kLowerTiles] = {0, 4, 5, 8, 9, 10, 12, 13, 14, 15};  // lower_tile's, row by row
constexpr uint64_t kNaturalOrder = tile_order(kNaturalCodes);

// body(R, Cc) for the tiles on and below the diagonal, spread over the warps in `order` (tile_order).
template <typename Body>
__device__ __forceinline__ void ordered_lower_tiles(uint64_t order, Body body) {
  for (int t = threadIdx.x / 32; t < kLowerTiles; t += kWarps) {
    const int code = static_cast<int>((order >> (4 * t)) & 15);
    body(code / 4, code % 4);
  }
}

// Rows t0 .. t0+C-1 of head (b, h) of x [B, T, H, D] (row stride H*D), fetched into registers as
// 16-byte words (zeros past T or before 0) while the block works on the previous chunk, then put into
// shared memory [C, ld]. Rows other than C: as many rows of something else (a state of K rows).
template <int D, typename E, int Threads = kThreads, int Rows = kC>
struct RowPrefetch {
  static constexpr int kTotal = Rows * D / 8, kWords = (kTotal + Threads - 1) / Threads;
  uint4 w[kWords];

  __device__ __forceinline__ void fetch(const E* __restrict__ x, size_t stride, int t0, int T) {
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      const int i = threadIdx.x + j * Threads, r = i / (D / 8), c = (i % (D / 8)) * 8;
      w[j] = make_uint4(0, 0, 0, 0);
      if (i < kTotal && t0 >= 0 && t0 + r < T) w[j] = *reinterpret_cast<const uint4*>(x + (t0 + r) * stride + c);
    }
  }
  // A [64, 64] square that holds zeros above its diagonal (scores, their gradients): only the 16-byte words
  // that reach the diagonal or below are read; the others are the zeros they hold.
  __device__ __forceinline__ void fetch_lower(const E* __restrict__ x) {
    static_assert(D == kC && Rows == kC, "a square [64, 64]");
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      const int i = threadIdx.x + j * Threads, r = i / (D / 8), c = (i % (D / 8)) * 8;
      w[j] = make_uint4(0, 0, 0, 0);
      if (c <= r) w[j] = *reinterpret_cast<const uint4*>(x + r * D + c);
    }
  }
  __device__ __forceinline__ void put(E* dst, int ld) const {
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      const int i = threadIdx.x + j * Threads, r = i / (D / 8), c = (i % (D / 8)) * 8;
      if (i < kTotal) *reinterpret_cast<uint4*>(dst + r * ld + c) = w[j];
    }
  }
};

// fp32 staging [C, ld] -> rows t0 .. of head (b, h) of out [B, T, H, D]; rows past T are dropped.
// With `dot` given, also dot[t0 + r] = x[r, :] · staging[r, :] (x 16-bit [C, ldx], the sum in fp32 over the
// D / 8 consecutive threads that hold row r).
template <int D, int Threads = kThreads, typename E>
__device__ void store_rows(E* __restrict__ out, size_t stride, int t0, int T, const float* src, int ld,
                           const E* x = nullptr, int ldx = 0, float* __restrict__ dot = nullptr) {
  static_assert((kC * D / 8) % 32 == 0, "whole warps take part in the row sums");
  for (int i = threadIdx.x; i < kC * D / 8; i += Threads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    const bool live = t0 + r < T;
    float f[8];
    load8(src + r * ld + c, f);
    if (live) *reinterpret_cast<uint4*>(out + (t0 + r) * stride + c) = pack8<E>(f);
    if (dot != nullptr) {  // uniform over the block
      float xv[8], part = 0.f;
      unpack8<E>(*reinterpret_cast<const uint4*>(x + r * ldx + c), xv);
#pragma unroll
      for (int j = 0; j < 8; ++j) part += xv[j] * f[j];
#pragma unroll
      for (int off = D / 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
      if (live && c == 0) dot[t0 + r] = part;
    }
  }
}

// The log decay of steps t0 + 2 lane and t0 + 2 lane + 1 (lanes of warp 0; zeros past T, before 0 or
// without a gate), fetched ahead like the rows.
__device__ __forceinline__ float2 fetch_gates(const float* __restrict__ g, int t0, int T) {
  const int t = t0 + 2 * static_cast<int>(threadIdx.x);
  float2 ab = make_float2(0.f, 0.f);
  if (g == nullptr || threadIdx.x >= 32 || t0 < 0) return ab;
  if (t < T) ab.x = g[t];
  if (t + 1 < T) ab.y = g[t + 1];
  return ab;
}

// The chunk's gates, by warp 0: G = inclusive cumulative sum of the log decay within the chunk, then
// the row factors e^G and e^{Gl - G} (all exponents <= 0).
__device__ void chunk_gates(float* gates, float2 ab) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  float incl = ab.x + ab.y;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const float last = __shfl_sync(0xffffffffu, incl, 31), g0 = incl - ab.y, g1 = incl;
  float *G = gates, *eG = gates + kC, *eEnd = gates + 2 * kC;
  G[2 * lane] = g0, G[2 * lane + 1] = g1;
  eG[2 * lane] = expf(g0), eG[2 * lane + 1] = expf(g1);
  eEnd[2 * lane] = expf(last - g0), eEnd[2 * lane + 1] = expf(last - g1);
}

// The causal decay mask on an accumulator: the tile at row tile R, column tile Cc of a [C, C] result times
// scale * exp(G_i - G_j) where j <= i (j < i when Strict), zeros elsewhere (every exponent <= 0); with `rows`
// given, row i's scale is scale * rows[i].
template <bool Strict>
__device__ __forceinline__ void decay_tile(Acc& a, const float* G, int R, int Cc, float scale,
                                           const float* rows = nullptr) {
  const int lane = threadIdx.x % 32, i0 = 16 * R + lane / 4, j0 = 16 * Cc + 2 * (lane % 4);
  const float Gi[2] = {G[i0], G[i0 + 8]};
  const float si[2] = {rows != nullptr ? scale * rows[i0] : scale, rows != nullptr ? scale * rows[i0 + 8] : scale};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int j = j0 + 8 * h + c;
      const float Gj = G[j];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = i0 + 8 * r;
        float& x = a.x[4 * h + 2 * r + c];
        x = (Strict ? j < i : j <= i) ? x * si[r] * __expf(Gi[r] - Gj) : 0.f;
      }
    }
  }
}

// Zeros on and above the diagonal of tile (R, Cc) of a [C, C] result: only a diagonal tile changes.
__device__ __forceinline__ void strictly_lower(Acc& a, int R, int Cc) {
  if (R != Cc) return;
  const int i = (threadIdx.x % 32) / 4, j0 = 2 * (threadIdx.x % 4);  // within the tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int j = j0 + 8 * h + c;
      if (j >= i) a.x[4 * h + c] = 0.f;
      if (j >= i + 8) a.x[4 * h + 2 + c] = 0.f;
    }
  }
}

// The rows of the tile at row tile R times factor * f[i] (f: a row factor of chunk_gates), in registers.
__device__ __forceinline__ void scale_tile_rows(Acc& a, const float* f, int R, float factor) {
  const int i0 = 16 * R + (threadIdx.x % 32) / 4;
  const float top = factor * f[i0], bottom = factor * f[i0 + 8];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    a.x[4 * h] *= top, a.x[4 * h + 1] *= top;
    a.x[4 * h + 2] *= bottom, a.x[4 * h + 3] *= bottom;
  }
}

// The 16x16 tiles of a [C, C] result, on and below the diagonal first (lower_tile's order), then those above it
// ((b, a + 1) for lower tile (a, b)), as warp w of W takes them: w, w + W, ... after rotating the warps by
// `shift`, so that two calls in one phase give their extra tiles to different warps.
template <int Threads = kThreads, typename Lower, typename Upper>
__device__ __forceinline__ void square_tiles(int shift, Lower lower, Upper upper) {
  constexpr int kW = Threads / 32;
  for (int t = (threadIdx.x / 32 + shift) % kW; t < kRowTiles * kRowTiles; t += kW) {
    int R, Cc;
    if (t < kLowerTiles) {
      lower_tile(t, R, Cc);
      lower(R, Cc);
    } else {
      upper_tile(t - kLowerTiles, R, Cc);
      upper(R, Cc);
    }
  }
}

// The causal decayed scores scale (X Y^T) ⊙ exp(G_i - G_j), j <= i, of X, Y [C, D] (row-major [., ld]) into 16-bit
// dst [C, ldc] with zeros above the diagonal, straight from the accumulators (no fp32 staging area, no barrier
// between the product and the mask). `shift` as in square_tiles.
template <int D, int Threads = kThreads, typename E>
__device__ void decayed_scores16(E* dst, int ldc, const E* X, const E* Y, int ld, const float* G, float scale,
                                 int shift = 0) {
  square_tiles<Threads>(
      shift,
      [&](int R, int Cc) {
        Acc acc;
        zero(acc);
        product_tile<false, true>(acc, X, ld, Y, ld, R, Cc, 0, D / 16);
        decay_tile<false>(acc, G, R, Cc, scale);
        store_tile16(dst + R * 16 * ldc + Cc * 16, acc, ldc);
      },
      [&](int R, int Cc) { store_zero_tile16(dst + R * 16 * ldc + Cc * 16, ldc); });
}

// dst[r, :] = x[r, :] * factor * f[r] (f: a row factor of chunk_gates), both [C, ld]; dst may be x.
template <int D, int Threads = kThreads, typename E>
__device__ void scale_rows_to(E* dst, const E* x, int ld, const float* f, float factor) {
  for (int i = threadIdx.x; i < kC * D / 8; i += Threads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    float v[8];
    unpack8<E>(*reinterpret_cast<const uint4*>(x + r * ld + c), v);
    const float m = factor * f[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] *= m;
    *reinterpret_cast<uint4*>(dst + r * ld + c) = pack8<E>(v);
  }
}

// x[r, :] *= factor * f[r] in place.
template <int D, int Threads = kThreads, typename E>
__device__ void scale_rows(E* x, int ld, const float* f, float factor) {
  scale_rows_to<D, Threads>(x, x, ld, f, factor);
}

// Every 16x16 tile on or below the diagonal of a [C, C] fp32 result (row stride ld32), spread over the
// warps in `order` (tile_order): body(acc, R, Cc) accumulates row tile R, column tile Cc into a zeroed Acc,
// which is then stored. Tiles above the diagonal are not written.
template <typename Body>
__device__ __forceinline__ void lower_tiles_into_stage(float* stage, int ld32, uint64_t order, Body body) {
  ordered_lower_tiles(order, [&](int R, int Cc) {
    Acc acc;
    zero(acc);
    body(acc, R, Cc);
    store_tile(stage + R * 16 * ld32 + Cc * 16, acc, ld32);
  });
}
template <typename Body>
__device__ __forceinline__ void lower_tiles_into_stage(float* stage, int ld32, Body body) {
  lower_tiles_into_stage(stage, ld32, kNaturalOrder, body);
}

// body(R, Cc) for every 16x16 tile of a [C, D] result, spread over the warps.
template <int D, int Threads = kThreads, typename Body>
__device__ __forceinline__ void each_tile(Body body) {
  for (int t = threadIdx.x / 32; t < kRowTiles * (D / 16); t += Threads / 32) body(t / (D / 16), t % (D / 16));
}

// Every 16x16 tile of a [C, D] fp32 result in the staging area (row stride ld32), spread over the
// warps: body(acc, R, Cc) accumulates row tile R, column tile Cc into a zeroed Acc.
template <int D, int Threads = kThreads, typename Body>
__device__ __forceinline__ void tiles_into_stage(float* stage, int ld32, Body body) {
  each_tile<D, Threads>([&](int R, int Cc) {
    Acc acc;
    zero(acc);
    body(acc, R, Cc);
    store_tile(stage + R * 16 * ld32 + Cc * 16, acc, ld32);
  });
}

// Two [C, D] fp32 results side by side, stage0 and stage1 (row stride ld32), their tiles spread over the
// warps together: first(acc, R, Cc) and second(acc, R, Cc) each accumulate one tile into a zeroed Acc.
template <int D, typename First, typename Second>
__device__ __forceinline__ void two_tiles_into_stage(float* stage0, float* stage1, int ld32, First first,
                                                     Second second) {
  constexpr int kTiles = kRowTiles * (D / 16);
  for (int t = threadIdx.x / 32; t < 2 * kTiles; t += kWarps) {
    const bool is_second = t >= kTiles;
    const int R = (t % kTiles) / (D / 16), Cc = (t % kTiles) % (D / 16);
    Acc acc;
    zero(acc);
    if (!is_second) first(acc, R, Cc);
    else second(acc, R, Cc);
    store_tile((is_second ? stage1 : stage0) + R * 16 * ld32 + Cc * 16, acc, ld32);
  }
}

// A K x V fp32 state held in registers across the chunks of a walk: warp w keeps tiles w, w + 8, ... of
// its grid of 16x16 tiles (row tile t / (V / 16), column tile t % (V / 16)), the same tiles
// accumulate_state gives it, so the state never passes through shared memory in fp32.
template <int K, int V>
struct RegisterState {
  static constexpr int kTiles = (K / 16) * (V / 16) / kWarps;
  static_assert((K / 16) * (V / 16) % kWarps == 0, "whole tiles per warp");
  Acc tile[kTiles];

  __device__ static int row_tile(int i) { return (threadIdx.x / 32 + i * kWarps) / (V / 16); }
  __device__ static int col_tile(int i) { return (threadIdx.x / 32 + i * kWarps) % (V / 16); }
  // From / to a contiguous [K, V] fp32 state (global); zeros when src is null.
  __device__ void load(const float* __restrict__ src) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (src == nullptr) zero(tile[i]);
      else load_tile(tile[i], src + row_tile(i) * 16 * V + col_tile(i) * 16, V);
    }
  }
  __device__ void store(float* __restrict__ dst) const {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) store_tile(dst + row_tile(i) * 16 * V + col_tile(i) * 16, tile[i], V);
  }
  // The 16-bit copy the products read, [K, ld] in shared memory.
  template <typename E>
  __device__ void copy16(E* S16, int ld) const {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) store_tile16(S16 + row_tile(i) * 16 * ld + col_tile(i) * 16, tile[i], ld);
  }
  // S = decay * S + what body(acc, R, Cc) adds to row tile R, column tile Cc.
  template <typename Body>
  __device__ void update(float decay, Body body) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      scale_tile(tile[i], decay);
      body(tile[i], row_tile(i), col_tile(i));
    }
  }
};

// S = decay * S + what body adds, over the fp32 state S [K, ld32] by warp tiles: body(acc, R, Cc) adds its
// products to row tile R, column tile Cc. With row_decay given, row r decays by decay * row_decay[r] instead.
// With S16 given, the new state's 16-bit copy [K, ld16] too, tile by tile (copy_state's values, without its
// pass over S): only where no product reads S16 until the next barrier.
template <int K, int V, int Threads = kThreads, typename Body, typename E16 = __nv_bfloat16>
__device__ __forceinline__ void accumulate_state(float* S, int ld32, float decay, Body body,
                                                 const float* row_decay = nullptr, E16* S16 = nullptr,
                                                 int ld16 = 0) {
  for (int t = threadIdx.x / 32; t < (K / 16) * (V / 16); t += Threads / 32) {
    const int R = t / (V / 16), Cc = t % (V / 16);
    Acc acc;
    load_tile(acc, S + R * 16 * ld32 + Cc * 16, ld32);
    if (row_decay != nullptr) scale_tile_rows(acc, row_decay, R, decay);
    else scale_tile(acc, decay);
    body(acc, R, Cc);
    store_tile(S + R * 16 * ld32 + Cc * 16, acc, ld32);
    if (S16 != nullptr) store_tile16(S16 + R * 16 * ld16 + Cc * 16, acc, ld16);
  }
}

// S = decay * S + X^T Y over the chunk (X [C, K], Y [C, V] row-major), S fp32 [K, ld32]; with S16 given
// also its 16-bit copy (see accumulate_state).
template <int K, int V, int Threads = kThreads, typename E>
__device__ void update_state(float* S, int ld32, float decay, const E* X, int ldx, const E* Y, int ldy,
                             E* S16 = nullptr, int ld16 = 0) {
  accumulate_state<K, V, Threads>(
      S, ld32, decay,
      [&](Acc& acc, int R, int Cc) { product_tile<true, false>(acc, X, ldx, Y, ldy, R, Cc, 0, kC / 16); }, nullptr,
      S16, ld16);
}

template <int K, int V, int Threads = kThreads, typename E>
__device__ void copy_state(E* dst, int ld, const float* S, int ld32) {
  for (int i = threadIdx.x; i < K * V / 8; i += Threads) {
    const int r = i / (V / 8), c = (i % (V / 8)) * 8;
    float f[8];
    load8(S + r * ld32 + c, f);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = pack8<E>(f);
  }
}

// The 16-bit copy of a state [K, ld] to global [K, V].
template <int K, int V, typename E>
__device__ void store_state16(E* __restrict__ dst, const E* S16, int ld) {
  for (int i = threadIdx.x; i < K * V / 8; i += kThreads) {
    const int r = i / (V / 8), c = (i % (V / 8)) * 8;
    reinterpret_cast<uint4*>(dst)[i] = *reinterpret_cast<const uint4*>(S16 + r * ld + c);
  }
}

// A square that is zero above its diagonal (scores in 16 bits, the UT's inverse in fp32) between shared
// memory [64, ld] and global [64, 64], by 16-byte words: only the words that reach the diagonal or below
// (c <= r) go to global memory, and only those come back (RowPrefetch::fetch_lower reads 16-bit ones into
// registers); load_lower puts zeros in the others' place.
template <typename T>
__device__ void store_lower(T* __restrict__ dst, const T* src, int ld) {
  constexpr int kWord = 16 / sizeof(T);  // elements a word
  for (int i = threadIdx.x; i < kC * kC / kWord; i += kThreads) {
    const int r = i / (kC / kWord), c = (i % (kC / kWord)) * kWord;
    if (c <= r) reinterpret_cast<uint4*>(dst)[i] = *reinterpret_cast<const uint4*>(src + r * ld + c);
  }
}
template <typename T>
__device__ void load_lower(T* dst, int ld, const T* __restrict__ src) {
  constexpr int kWord = 16 / sizeof(T);
  for (int i = threadIdx.x; i < kC * kC / kWord; i += kThreads) {
    const int r = i / (kC / kWord), c = (i % (kC / kWord)) * kWord;
    *reinterpret_cast<uint4*>(dst + r * ld + c) =
        c <= r ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
  }
}

template <int K, int V, int Threads = kThreads>
__device__ void load_state(float* S, int ld32, const float* __restrict__ src) {
  for (int i = threadIdx.x; i < K * V / 4; i += Threads) {
    const int r = i / (V / 4), c = (i % (V / 4)) * 4;
    const float4 x = src != nullptr ? reinterpret_cast<const float4*>(src)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(S + r * ld32 + c) = x;
  }
}

template <int K, int V, int Threads = kThreads>
__device__ void store_state(float* __restrict__ dst, const float* S, int ld32) {
  for (int i = threadIdx.x; i < K * V / 4; i += Threads) {
    const int r = i / (V / 4), c = (i % (V / 4)) * 4;
    reinterpret_cast<float4*>(dst)[i] = *reinterpret_cast<const float4*>(S + r * ld32 + c);
  }
}

}  // namespace
}  // namespace linearize::ops::cuda_kernels
