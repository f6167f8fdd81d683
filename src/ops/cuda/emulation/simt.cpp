// The SIMT emulator's scheduler and collectives (see simt.h): a block's threads are fibers run round-robin
// on the calling thread; a fiber gives way only at a barrier or a warp collective. On x86-64 a switch saves
// and restores the callee-saved registers by hand (a few nanoseconds); elsewhere it goes through ucontext,
// whose every switch is a system call.
#include "ops/cuda/emulation/simt.h"

#include <sys/mman.h>
#ifdef LINEARIZE_RACECHECK
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_read16(void* addr);  // what instrumented code calls before a 16-byte load
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cuda/emulation/include/cuda_bf16.h"
#include "ops/cuda/emulation/include/cuda_fp16.h"

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

#if defined(__x86_64__)
// simt_switch(&from, to): pushes the callee-saved registers and the SSE and x87 control words on the running
// stack, keeps its stack pointer in *from, and resumes the stack `to` (saved the same way, or set up by
// start_context) by popping them again.
extern "C" void simt_switch(void** from, void* to);
asm(R"(
  .pushsection .text
  .globl simt_switch
  .type simt_switch, @function
simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_switch, .-simt_switch
  .popsection
)");
#endif

namespace linearize::simt {
namespace {

// ---- race detection (the racecheck build, LINEARIZE_RACECHECK) -------------------------------------------
// The kernels' translation units are compiled with ThreadSanitizer and this file without it, so that TSan
// sees the kernels' memory accesses and none of the scheduler's. Each emulated thread is a TSan fiber;
// switching between them orders nothing; __syncthreads and each warp collective order what came before
// them in every participant before what comes after (a release by each arriving thread, an acquire by
// each leaving one), and the end of a block orders it before the next. Any two accesses to one address,
// one a write, that these do not order are reported as a data race: racecheck's shared-memory hazards,
// and the same for global memory within a block.
#ifdef LINEARIZE_RACECHECK
void* race_fiber_create() { return __tsan_create_fiber(0); }
void* race_current_fiber() { return __tsan_get_current_fiber(); }
void race_switch(void* to, bool order) { __tsan_switch_to_fiber(to, order ? 0 : __tsan_switch_to_fiber_no_sync); }
void race_release(void* sync) { __tsan_release(sync); }
void race_acquire(void* sync) { __tsan_acquire(sync); }
void race_read16(const void* at) { __tsan_read16(const_cast<void*>(at)); }
#else
void* race_fiber_create() { return nullptr; }
void* race_current_fiber() { return nullptr; }
void race_switch(void*, bool) {}
void race_release(void*) {}
void race_acquire(void*) {}
void race_read16(const void*) {}
#endif

// Under AddressSanitizer a fiber's stack keeps the redzones of the frames that last ran on it; a reused
// stack is cleared of them before it starts again.
void unpoison_stack([[maybe_unused]] char* stack, [[maybe_unused]] size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(stack, bytes);
#endif
}

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
// A stack that simt_switch resumes into entry(), as if entry had been called (entry must never return).
void start_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  unpoison_stack(stack, bytes);
  auto* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15}) - 16);
  top[0] = reinterpret_cast<uint64_t>(entry);  // the return address popped by simt_switch's ret
  uint64_t* sp = top - 7;                       // rbp, rbx, r12..r15 (zero) and the control words
  for (int i = 1; i < 7; ++i) sp[i] = 0;
  sp[0] = 0x1f80u | (uint64_t{0x037f} << 32);   // MXCSR and the x87 control word at their defaults
  c.sp = sp;
}
void switch_context(Context& from, Context& to) { simt_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void start_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  unpoison_stack(stack, bytes);
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kFullMask = 0xffffffffu;

enum class Wait { None, Block, Warp, Done };

// The collective a warp's lanes have reached, the operands each lane gave and what each gets back.
enum class Collective { None, Sync, Shuffle, LoadMatrices, Mma16, MmaHalf16, MmaTf32 };
const char* name(Collective c) {
  switch (c) {
    case Collective::None: return "none";
    case Collective::Sync: return "__syncwarp";
    case Collective::Shuffle: return "a shuffle";
    case Collective::LoadMatrices: return "ldmatrix";
    case Collective::Mma16: return "mma.sync (bf16)";
    case Collective::MmaHalf16: return "mma.sync (f16)";
    case Collective::MmaTf32: return "mma.sync (tf32)";
  }
  return "?";
}

struct LaneOperands {
  uint32_t w[12];
  uint64_t value;
  const void* address;
  Shuffle kind;
  int arg, width;
};
struct WarpState {
  Collective pending = Collective::None;
  int arrived = 0, live = 0, started = 0;
  LaneOperands in[32];
  uint32_t out[32][4];
  uint64_t value_out[32];
  char sync[2];  // TSan sync objects (their addresses)
};

struct Fiber {
  Context context;
  char* stack = nullptr;
  uint3 index{};
  int warp = 0, lane = 0;  // of the block's threads in linear order
  Wait wait = Wait::None;
  void* race = nullptr;  // its TSan fiber (racecheck build)
  bool entered = false;
  int barriers = 0, collectives = 0;  // passed so far: which of two sync objects the next one uses
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  int live = 0, arrived = 0;
  int current = -1;
  Context scheduler;
  void* scheduler_race = nullptr;
  char barrier_sync[2], end_sync;  // TSan sync objects (their addresses)
  const std::function<void()>* body = nullptr;
  std::string error;
};

thread_local Block* g_block = nullptr;
thread_local std::vector<char*> g_stacks;
thread_local std::vector<void*> g_race_fibers;  // TSan fibers, one a thread slot, kept like the stacks
thread_local std::vector<unsigned char> g_shared;

char* stack_for(size_t i) {
  while (g_stacks.size() <= i) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("simt: cannot map a fiber stack");
    g_stacks.push_back(static_cast<char*>(p));
  }
  return g_stacks[i];
}

void* race_fiber_for(size_t i) {
  while (g_race_fibers.size() <= i) g_race_fibers.push_back(race_fiber_create());
  return g_race_fibers[i];
}

Fiber& current_fiber() { return g_block->fibers[static_cast<size_t>(g_block->current)]; }
WarpState& warp_state(const Fiber& f) { return g_block->warps[static_cast<size_t>(f.warp)]; }

// "simt: block (x,y,z)", where an error message starts.
std::string block_name() {
  return "simt: block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
         std::to_string(blockIdx.z) + ")";
}

// Back to the scheduler until this fiber is released.
void to_scheduler(Fiber& f) {
  race_switch(g_block->scheduler_race, false);
  switch_context(f.context, g_block->scheduler);
}

// The scheduler resumes no thread once the block has failed, so this returns only when released.
void yield_fiber() { to_scheduler(current_fiber()); }

// Ends the block with an error naming this thread; does not return.
void fail(const std::string& what) {
  Fiber& f = current_fiber();
  g_block->error = block_name() + " thread (" + std::to_string(f.index.x) + "," + std::to_string(f.index.y) +
                   "," + std::to_string(f.index.z) + "): " + what;
  f.wait = Wait::Done;
  race_release(&g_block->end_sync);
  to_scheduler(f);
}

void release_block() {
  for (auto& f : g_block->fibers)
    if (f.wait == Wait::Block) f.wait = Wait::None;
  g_block->arrived = 0;
}

// ---- the collectives, completed by the last lane to arrive -----------------------------------------------

void complete_shuffles(WarpState& w, int lanes) {
  for (int l = 0; l < lanes; ++l) {
    const auto& op = w.in[l];
    const int seg = l - l % op.width;
    int src = l;
    switch (op.kind) {
      case Shuffle::Index: src = seg + (op.arg % op.width + op.width) % op.width; break;
      case Shuffle::Up: src = l - op.arg >= seg ? l - op.arg : l; break;
      case Shuffle::Down: src = l + op.arg < seg + op.width ? l + op.arg : l; break;
      case Shuffle::Xor: src = (l ^ op.arg) < seg + op.width && (l ^ op.arg) >= seg ? (l ^ op.arg) : l; break;
    }
    w.value_out[l] = src < lanes ? w.in[src].value : 0;
  }
}

void complete_load_matrices(WarpState& w, bool trans) {
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      if (!trans) {
        const auto* row = static_cast<const uint32_t*>(w.in[8 * i + l / 4].address);
        w.out[l][i] = row[l % 4];
      } else {
        const auto* r0 = static_cast<const uint16_t*>(w.in[8 * i + 2 * (l % 4)].address);
        const auto* r1 = static_cast<const uint16_t*>(w.in[8 * i + 2 * (l % 4) + 1].address);
        w.out[l][i] = static_cast<uint32_t>(r0[l / 4]) | (static_cast<uint32_t>(r1[l / 4]) << 16);
      }
    }
}

float widen16(uint32_t word, int which, bool half) {
  const auto bits = static_cast<uint16_t>(which ? word >> 16 : word & 0xffff);
  return half ? half_to_float(bits) : __bfloat162float(__nv_bfloat16{bits});
}

// Each lane's d = c + (A B)(r, col) for its four result elements: d[0..1] = D(g, 2t..2t+1), d[2..3] =
// D(g+8, 2t..2t+1) for lane l = 4 g + t, c the lane's own accumulators; sums in fp32 in order of k.
template <int K>
void multiply_fragments(WarpState& w, const float (&A)[16][K], const float (&B)[K][8]) {
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
      float acc = __uint_as_float(w.in[l].w[6 + i]);
      for (int k = 0; k < K; ++k) acc += A[r][k] * B[k][c];
      w.out[l][i] = __float_as_uint(acc);
    }
  }
}

// m16n8k16: lane l = 4 g + t holds a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..), a[2] = A(g, 2t+8..),
// a[3] = A(g+8, 2t+8..); b0 = B(2t..2t+1, g), b1 = B(2t+8.., g).
void complete_mma16(WarpState& w, bool half) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t* in = w.in[l].w;
    for (int j = 0; j < 2; ++j) {
      A[g][2 * t + j] = widen16(in[0], j, half);
      A[g + 8][2 * t + j] = widen16(in[1], j, half);
      A[g][2 * t + 8 + j] = widen16(in[2], j, half);
      A[g + 8][2 * t + 8 + j] = widen16(in[3], j, half);
      B[2 * t + j][g] = widen16(in[4], j, half);
      B[2 * t + 8 + j][g] = widen16(in[5], j, half);
    }
  }
  multiply_fragments(w, A, B);
}

// m16n8k8 tf32: a[0] = A(g, t), a[1] = A(g+8, t), a[2] = A(g, t+4), a[3] = A(g+8, t+4); b0 = B(t, g),
// b1 = B(t+4, g). The operands' low 13 bits are not read.
void complete_mma_tf32(WarpState& w) {
  float A[16][8], B[8][8];
  auto tf32 = [](uint32_t x) { return __uint_as_float(x & 0xffffe000u); };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t* in = w.in[l].w;
    A[g][t] = tf32(in[0]), A[g + 8][t] = tf32(in[1]), A[g][t + 4] = tf32(in[2]), A[g + 8][t + 4] = tf32(in[3]);
    B[t][g] = tf32(in[4]), B[t + 4][g] = tf32(in[5]);
  }
  multiply_fragments(w, A, B);
}

void complete(WarpState& w, Collective c, int lanes) {
  switch (c) {
    case Collective::Shuffle: complete_shuffles(w, lanes); break;
    case Collective::LoadMatrices: complete_load_matrices(w, w.in[0].arg != 0); break;
    case Collective::Mma16: complete_mma16(w, false); break;
    case Collective::MmaHalf16: complete_mma16(w, true); break;
    case Collective::MmaTf32: complete_mma_tf32(w); break;
    default: break;
  }
}

// This lane's arrival at collective c with operands op; returns once every live lane of the warp has
// arrived and the collective is complete.
void arrive(Collective c, const LaneOperands& op) {
  Fiber& f = current_fiber();
  WarpState& w = warp_state(f);
  if (w.arrived > 0 && w.pending != c)
    fail(std::string("warp divergence: lane ") + std::to_string(f.lane) + " reached " + name(c) +
         " while other lanes wait at " + name(w.pending));
  if (w.live < w.started)
    fail(std::string(name(c)) + " over the full warp after " + std::to_string(w.started - w.live) +
         " of its lanes returned");
  if (c != Collective::Sync && c != Collective::Shuffle && w.live != 32)
    fail(std::string(name(c)) + " needs all 32 lanes of the warp, " + std::to_string(w.live) + " are running");
  w.pending = c;
  w.in[f.lane] = op;
  char* sync = &w.sync[f.collectives++ % 2];
  race_release(sync);
  if (++w.arrived < w.live) {
    f.wait = Wait::Warp;
    yield_fiber();
    race_acquire(sync);
    return;
  }
  race_acquire(sync);
  complete(w, c, w.live);
  race_release(sync);  // what the collective wrote for the lanes, before they acquire
  w.arrived = 0;
  w.pending = Collective::None;
  Fiber* lanes = &g_block->fibers[static_cast<size_t>(32 * f.warp)];
  for (int l = 0; l < w.started; ++l)
    if (lanes[l].wait == Wait::Warp) lanes[l].wait = Wait::None;
}

void fiber_main() {
  (*g_block->body)();
  Fiber& f = current_fiber();
  f.wait = Wait::Done;
  --g_block->live;
  WarpState& w = warp_state(f);
  --w.live;
  // A barrier the others wait at may now be complete without this thread.
  if (g_block->arrived > 0 && g_block->arrived == g_block->live) release_block();
  if (w.arrived > 0)
    g_block->error = block_name() + ": a lane of warp " + std::to_string(f.warp) +
                     " returned while the others wait at " + name(w.pending);
  race_release(&g_block->end_sync);
  to_scheduler(f);
}

void run_block(Block& block, size_t threads) {
  block.live = static_cast<int>(threads);
  block.warps.assign((threads + 31) / 32, WarpState{});
  for (size_t i = 0; i < block.warps.size(); ++i)
    block.warps[i].live = block.warps[i].started = static_cast<int>(std::min<size_t>(32, threads - 32 * i));
  block.fibers.resize(threads);
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = block.fibers[i];
    f.index = {static_cast<unsigned>(i % blockDim.x), static_cast<unsigned>(i / blockDim.x % blockDim.y),
               static_cast<unsigned>(i / (blockDim.x * blockDim.y))};
    f.warp = static_cast<int>(i / 32), f.lane = static_cast<int>(i % 32);
    f.wait = Wait::None;
    f.stack = stack_for(i);
    start_context(f.context, f.stack, kStackBytes, fiber_main);
    f.race = race_fiber_for(i);
    f.entered = false;
    f.barriers = f.collectives = 0;
  }
  size_t done = 0;
  while (done < threads && block.error.empty()) {
    bool progressed = false;
    done = 0;
    for (size_t i = 0; i < threads && block.error.empty(); ++i) {
      Fiber& f = block.fibers[i];
      if (f.wait == Wait::Done) {
        ++done;
        continue;
      }
      if (f.wait != Wait::None) continue;
      block.current = static_cast<int>(i);
      threadIdx = f.index;
      race_switch(f.race, !f.entered);  // a thread starts after what came before the block
      f.entered = true;
      switch_context(block.scheduler, f.context);
      progressed = true;
    }
    if (!progressed && done < threads && block.error.empty()) {
      int at_block = 0, at_warp = 0;
      for (const auto& f : block.fibers) at_block += f.wait == Wait::Block, at_warp += f.wait == Wait::Warp;
      block.error = block_name() + " cannot go on: " + std::to_string(at_block) +
                    " threads wait at __syncthreads and " + std::to_string(at_warp) +
                    " at a warp collective that the others never reach";
    }
  }
  race_acquire(&block.end_sync);  // the block before what comes after it
}

}  // namespace

void launch(dim3 grid, dim3 block_dim, size_t smem_bytes, const std::function<void()>& body) {
  const size_t threads = static_cast<size_t>(block_dim.x) * block_dim.y * block_dim.z;
  if (threads == 0 || threads > 1024)
    throw std::runtime_error("simt: a block of " + std::to_string(threads) + " threads (1 to 1024 expected)");
  if (g_block) throw std::runtime_error("simt: a launch from inside a kernel");
  gridDim = grid;
  blockDim = block_dim;
  g_shared.resize(smem_bytes + 128);
  Block block;
  block.body = &body;
  block.scheduler_race = race_current_fiber();
  g_block = &block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        std::memset(g_shared.data(), 0xff, g_shared.size());
        block.arrived = 0;
        run_block(block, threads);
        if (!block.error.empty()) {
          g_block = nullptr;
          throw std::runtime_error(block.error);
        }
      }
  g_block = nullptr;
}

unsigned char* dynamic_shared() {
  auto p = reinterpret_cast<uintptr_t>(g_shared.data());
  return reinterpret_cast<unsigned char*>((p + 127) / 128 * 128);
}

void sync_block() {
  Fiber& f = current_fiber();
  char* sync = &g_block->barrier_sync[f.barriers++ % 2];
  race_release(sync);
  if (++g_block->arrived == g_block->live) {
    release_block();
  } else {
    f.wait = Wait::Block;
    yield_fiber();
  }
  race_acquire(sync);
}

void sync_warp() { arrive(Collective::Sync, LaneOperands{}); }

uint64_t shuffle(unsigned mask, uint64_t value, Shuffle kind, int arg, int width) {
  if (mask != kFullMask) fail("a shuffle with mask " + std::to_string(mask) + ": only the full warp is emulated");
  if (width <= 0 || width > 32 || (width & (width - 1))) fail("a shuffle of width " + std::to_string(width));
  LaneOperands op{};
  op.value = value, op.kind = kind, op.arg = arg, op.width = width;
  arrive(Collective::Shuffle, op);
  const Fiber& f = current_fiber();
  return warp_state(f).value_out[f.lane];
}

namespace {
void take_words(uint32_t* r, int n) {
  const Fiber& f = current_fiber();
  const auto& out = warp_state(f).out[f.lane];
  for (int i = 0; i < n; ++i) r[i] = out[i];
}
void mma(Collective c, float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  LaneOperands op{};
  for (int i = 0; i < 4; ++i) op.w[i] = a[i], op.w[6 + i] = __float_as_uint(d[i]);
  op.w[4] = b0, op.w[5] = b1;
  arrive(c, op);
  uint32_t r[4];
  take_words(r, 4);
  for (int i = 0; i < 4; ++i) d[i] = __uint_as_float(r[i]);
}
}  // namespace

void load_matrices_x4(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fail("ldmatrix from a row address that is not 16-byte aligned");
  race_read16(row);  // the warp reads every lane's row
  LaneOperands op{};
  op.address = row, op.arg = trans ? 1 : 0;
  arrive(Collective::LoadMatrices, op);
  take_words(r, 4);
}

void mma_m16n8k16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool half) {
  mma(half ? Collective::MmaHalf16 : Collective::Mma16, d, a, b0, b1);
}

void mma_m16n8k8_tf32(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma(Collective::MmaTf32, d, a, b0, b1);
}

uint32_t to_tf32(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // infinities and NaN as they are
  return (u + 0x1000u) & 0xffffe000u;
}

}  // namespace linearize::simt
