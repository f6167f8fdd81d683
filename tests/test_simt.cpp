// The SIMT emulator that runs the CUDA kernels in the CPU build (ops/cuda/emulation/simt.h): its warp
// collectives against their definitions in the CUDA and PTX manuals, its barriers, and the errors it
// reports. The kernels themselves are checked through it by the CudaOps suites (test_cuda_*.cpp).
#include <gtest/gtest.h>

#ifdef LINEARIZE_CUDA_EMULATION
#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cuda/emulation/include/cuda_bf16.h"
#include "ops/cuda/emulation/simt.h"

namespace linearize {
namespace {

using simt::launch;

TEST(Simt, ShufflesMatchTheirDefinitions) {
  const int n = 64;  // two warps
  std::vector<int> idx(n), up(n), down(n), xr(n), seg(n);
  launch(dim3(1), dim3(n), 0, [&] {
    const int t = static_cast<int>(threadIdx.x), v = 100 + t;
    idx[t] = __shfl_sync(0xffffffffu, v, 5);
    up[t] = __shfl_up_sync(0xffffffffu, v, 3);
    down[t] = __shfl_down_sync(0xffffffffu, v, 2);
    xr[t] = __shfl_xor_sync(0xffffffffu, v, 9);
    seg[t] = __shfl_xor_sync(0xffffffffu, v, 4, 8);  // within groups of 8 lanes
  });
  for (int t = 0; t < n; ++t) {
    const int lane = t % 32, warp0 = t - lane;
    EXPECT_EQ(idx[t], 100 + warp0 + 5) << t;
    EXPECT_EQ(up[t], 100 + (lane >= 3 ? t - 3 : t)) << t;
    EXPECT_EQ(down[t], 100 + (lane + 2 < 32 ? t + 2 : t)) << t;
    EXPECT_EQ(xr[t], 100 + warp0 + (lane ^ 9)) << t;
    EXPECT_EQ(seg[t], 100 + warp0 + (lane ^ 4)) << t;
  }
}

// Static shared memory is the block's; __syncthreads orders writes before reads across warps.
TEST(Simt, BarrierOrdersSharedMemoryAcrossWarps) {
  const int n = 256, blocks = 3;
  std::vector<float> out(n * blocks);
  launch(dim3(blocks), dim3(n), 0, [&] {
    __shared__ float cell[256];
    const int t = static_cast<int>(threadIdx.x);
    cell[t] = static_cast<float>(t + 1000 * blockIdx.x);
    __syncthreads();
    out[blockIdx.x * n + t] = cell[(t + 97) % n];  // written by another warp
  });
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t) EXPECT_EQ(out[b * n + t], static_cast<float>((t + 97) % n + 1000 * b));
}

// ldmatrix.x4 and mma.m16n8k16 (bf16): A (16x16) and B (16x8) in shared memory, loaded as the kernels
// load them (chunk_tiles.cuh's product_tile without transposes), against the product in fp32.
TEST(Simt, LoadMatricesAndMmaGiveTheProduct) {
  torch::manual_seed(0);
  auto A = torch::randn({16, 16}).to(torch::kBFloat16), Bt = torch::randn({8, 16}).to(torch::kBFloat16);
  auto want = A.to(torch::kFloat).matmul(Bt.to(torch::kFloat).t());  // [16, 8]
  std::vector<float> got(16 * 8);
  const auto* a16 = reinterpret_cast<const uint16_t*>(A.data_ptr());
  const auto* b16 = reinterpret_cast<const uint16_t*>(Bt.data_ptr());
  launch(dim3(1), dim3(32), 0, [&] {
    __shared__ __align__(16) uint16_t sa[16 * 16], sb[8 * 16];
    const int lane = static_cast<int>(threadIdx.x);
    for (int e = lane; e < 256; e += 32) sa[e] = a16[e];
    for (int e = lane; e < 128; e += 32) sb[e] = b16[e];
    __syncwarp();
    // a: quarters (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), lane l addressing row l % 16 of
    // the quarter l / 16 selects by columns; b stored as [n][k] (column-major B): quarters (n 0-7, k 0-7),
    // (n 0-7, k 8-15), read as b0, b1.
    uint32_t a[4], b[4];
    simt::load_matrices_x4(a, sa + (lane % 16) * 16 + 8 * (lane / 16), false);
    simt::load_matrices_x4(b, sb + (lane % 8) * 16 + 8 * ((lane / 8) % 2), false);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    simt::mma_m16n8k16(d, a, b[0], b[1], false);
    const int g = lane / 4, t = lane % 4;
    got[g * 8 + 2 * t] = d[0], got[g * 8 + 2 * t + 1] = d[1];
    got[(g + 8) * 8 + 2 * t] = d[2], got[(g + 8) * 8 + 2 * t + 1] = d[3];
  });
  auto got_t = torch::from_blob(got.data(), {16, 8}).clone();
  EXPECT_LE((got_t - want).abs().max().item<float>(), 1e-4f * want.abs().max().item<float>());
}

TEST(Simt, ConversionsRoundToNearestEven) {
  EXPECT_EQ(__float2bfloat16_rn(1.0f).bits, 0x3f80);
  EXPECT_EQ(__float2bfloat16_rn(__uint_as_float(0x3f808000u)).bits, 0x3f80);  // a tie, to even
  EXPECT_EQ(__float2bfloat16_rn(__uint_as_float(0x3f818000u)).bits, 0x3f82);  // a tie, to even
  EXPECT_EQ(__float2bfloat16_rn(__uint_as_float(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(-2.5f)), -2.5f);
  // cvt.rna.tf32: ties away from zero.
  EXPECT_EQ(simt::to_tf32(__uint_as_float(0x3f801000u)), 0x3f802000u);
  EXPECT_EQ(simt::to_tf32(__uint_as_float(0xbf801000u)), 0xbf802000u);
  EXPECT_EQ(simt::to_tf32(__uint_as_float(0x3f800fffu)), 0x3f800000u);
}

// Lanes of one warp at different collectives, a partial mask, and a lane that leaves while the others
// wait: each is reported by the launch, naming the block and thread.
TEST(Simt, DivergenceIsReported) {
  auto error_of = [](const std::function<void()>& body) {
    try {
      launch(dim3(2), dim3(64), 0, body);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto divergent = error_of([] {
    if (threadIdx.x % 32 < 16)
      (void)__shfl_xor_sync(0xffffffffu, 1, 1);
    else
      __syncwarp();
  });
  EXPECT_NE(divergent.find("warp divergence"), std::string::npos) << divergent;
  EXPECT_NE(divergent.find("block (0,0,0)"), std::string::npos) << divergent;
  const auto partial = error_of([] { (void)__shfl_sync(0x0000ffffu, 1, 0); });
  EXPECT_NE(partial.find("mask"), std::string::npos) << partial;
  const auto left = error_of([] {
    if (threadIdx.x == 40) return;
    (void)__shfl_sync(0xffffffffu, 1, 0);
  });
  EXPECT_NE(left.find("returned while the others wait"), std::string::npos) << left;
  // After an error the emulator takes the next launch as usual.
  std::vector<int> ran(32, 0);
  launch(dim3(1), dim3(32), 0, [&] { ran[threadIdx.x] = 1; });
  EXPECT_EQ(std::accumulate(ran.begin(), ran.end(), 0), 32);
}

// Dynamic shared memory starts every block as 0xff bytes: a kernel reading what it never wrote gets NaN.
TEST(Simt, DynamicSharedMemoryStartsAsNaN) {
  std::vector<float> seen(2);
  launch(dim3(2), dim3(32), 64, [&] {
    auto* smem = reinterpret_cast<float*>(simt::dynamic_shared());
    if (threadIdx.x == 0) {
      seen[blockIdx.x] = smem[3];
      smem[3] = 1.f;  // not seen by the next block
    }
  });
  EXPECT_TRUE(std::isnan(seen[0]));
  EXPECT_TRUE(std::isnan(seen[1]));
}

// In the racecheck build (LINEARIZE_RACECHECK, scripts/racecheck.sh), a kernel whose warp 1 reads what
// warp 0 wrote with no barrier between is reported by ThreadSanitizer, and the same kernel with the
// barrier is not. Each runs in a child process of this binary, as TSan reports at its exit (status 66).
TEST(Simt, RacecheckReportsAnUnorderedRead) {
#ifndef LINEARIZE_RACECHECK
  GTEST_SKIP() << "skipped: not a racecheck build (scripts/racecheck.sh)";
#else
  if (const char* child = std::getenv("LINEARIZE_SIMT_RACE_CHILD")) {
    const bool barrier = std::string(child) == "barrier";
    std::vector<float> out(64);
    launch(dim3(1), dim3(64), 0, [&] {
      __shared__ float cell[32];
      const int t = static_cast<int>(threadIdx.x);
      if (t < 32) cell[t] = static_cast<float>(t);
      if (barrier) __syncthreads();
      if (t >= 32) out[t] = cell[t - 32];
    });
    return;
  }
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  auto run_child = [&](const char* mode, int& status) {
    const std::string cmd = std::string("LINEARIZE_SIMT_RACE_CHILD=") + mode + " '" + self +
                            "' --gtest_filter=Simt.RacecheckReportsAnUnorderedRead 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    status = pclose(p);
    return out;
  };
  int racy_status = 0, ordered_status = 0;
  const auto racy = run_child("none", racy_status), ordered = run_child("barrier", ordered_status);
  EXPECT_NE(racy.find("ThreadSanitizer: data race"), std::string::npos) << racy;
  EXPECT_NE(racy_status, 0);
  EXPECT_EQ(ordered.find("ThreadSanitizer"), std::string::npos) << ordered;
  EXPECT_EQ(ordered_status, 0) << ordered;
#endif
}

}  // namespace
}  // namespace linearize

#else
TEST(Simt, NotInThisBuild) { GTEST_SKIP() << "skipped: the SIMT emulator is compiled only in the CPU build"; }
#endif
