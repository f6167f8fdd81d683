// The CUDA kernels of ops/cuda run on the CPU: a SIMT emulator for the CPU build's tests (CI has no GPU).
//
// The .cu files compile as C++ against this header and the stand-ins for the CUDA headers in
// emulation/include/ (cuda_runtime.h, cuda_bf16.h, ...), which include it; their inline PTX and dynamic
// shared memory have emulated branches (chunk_tiles.cuh, ut_transform.cu, shared_memory.cuh). A launch
// runs the grid one block at a time; a block's threads are fibers on the calling thread, switched only
// where CUDA makes threads wait for each other: __syncthreads and the warp's collective operations
// (shuffles, ldmatrix, mma.sync).
// The last thread to reach a barrier or collective completes it for all, so a warp's collective sees every
// lane's operands at once, as on the hardware.
//
// What it checks, and reports by throwing from the launch: lanes of a warp at different collectives
// (divergence), a collective after some lanes of the warp returned or while a lane returns, a collective
// whose mask is not the full warp, and a block whose threads can no longer all go on. Shared memory starts
// each block filled with 0xff bytes (NaN as fp32 or 16-bit floats), so a kernel that reads what it has not
// written shows it in its results; and since a block's threads run in order up to each barrier, a missing
// __syncthreads usually shows the same way.
//
// Races: the racecheck build (LINEARIZE_RACECHECK, scripts/racecheck.sh) compiles the kernels with
// ThreadSanitizer, each emulated thread a TSan fiber, barriers and collectives as its release/acquire
// pairs (simt.cpp), and TSan reports any two accesses to one address, one a write, that they leave
// unordered. Blocks are ordered one after another, so races between blocks are not seen.
//
// What it does not model: timing, asynchronous copies (they complete at once), and rounding inside
// mma.sync (products summed in fp32 in order of k).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

// ---- what the CUDA headers declare --------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// A block's static shared arrays: one copy, shared by every thread, blocks running one after another.
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// The running thread's coordinates: threadIdx set by the scheduler at every switch, the rest per launch or block.
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// Round-to-nearest arithmetic that nvcc may not contract into a fused multiply-add (the emulated build targets
// x86-64's baseline, which has no fused multiply-add: plain operators keep each rounding).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// CUDA's overloaded min and max of device code.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

namespace linearize::simt {

// ---- the scheduler ---------------------------------------------------------------------------------------

// Runs body once for every thread of every block of grid (blocks in order, a block's threads as fibers),
// with dynamic shared memory of smem_bytes per block. Throws std::runtime_error on divergence.
void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);
// The running block's dynamic shared memory (128-byte aligned).
unsigned char* dynamic_shared();

void sync_block();  // __syncthreads
void sync_warp();   // __syncwarp

// A warp's collective operations. Every lane of the warp must call the same one.
enum class Shuffle { Index, Up, Down, Xor };
// The 64-bit value of the lane that `kind` and `arg` pick (within segments of `width` lanes); a lane
// whose source falls outside its segment (Up, Down) keeps its own value.
uint64_t shuffle(unsigned mask, uint64_t value, Shuffle kind, int arg, int width);
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: this lane's row address; returns its four words.
void load_matrices_x4(uint32_t (&r)[4], const void* row, bool trans);
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += a b in the PTX ISA's fragment layout.
void mma_m16n8k16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool half);
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32.
void mma_m16n8k8_tf32(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// cvt.rna.tf32.f32: to nearest with ties away from zero, 10 mantissa bits kept.
uint32_t to_tf32(float x);

template <typename T>
T shuffle_as(unsigned mask, T value, Shuffle kind, int arg, int width) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle(mask, bits, kind, arg, width);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace linearize::simt

inline void __syncthreads() { linearize::simt::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { linearize::simt::sync_warp(); }
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return linearize::simt::shuffle_as(mask, v, linearize::simt::Shuffle::Index, src, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return linearize::simt::shuffle_as(mask, v, linearize::simt::Shuffle::Up, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return linearize::simt::shuffle_as(mask, v, linearize::simt::Shuffle::Down, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return linearize::simt::shuffle_as(mask, v, linearize::simt::Shuffle::Xor, lane_mask, width);
}
