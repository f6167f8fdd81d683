// The chunked op families on CUDA against the CPU forms (forward and every gradient, fp32), and the pieces
// the chunked forms share against their libtorch forms: the diagonal sub-block scores of vector gates, the
// delta rule's unit-lower solve and the scalar decay's gradient from a walk's row sums. Without a GPU these
// run the kernels on the CPU build's emulator (cuda_test_util.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/ops.h"
#include "test_util.h"

namespace linearize {
namespace {

using cuda_test::Family;
using cuda_test::NoTf32;
using cuda_test::op_cases;
using cuda_test::OpCase;
using cuda_test::OpInputs;
using cuda_test::random_inputs;
using cuda_test::to_device;
using test::rel_err;

// Output and final state of the chunked form (chunk 64).
std::pair<torch::Tensor, torch::Tensor> run_chunk(const OpCase& c, OpInputs& in, double scale) {
  if (c.family == Family::Gla) {
    auto r = ops::gla_chunk(in.q, in.k, in.v, in.g, in.h0, scale);
    return {r.o, r.state};
  }
  if (c.family == Family::DeltaRule) {
    auto r = ops::delta_rule_chunk(in.q, in.k, in.v, in.beta, in.g, in.h0, scale);
    return {r.o, r.state};
  }
  auto r = ops::mlstm_chunk(in.q, in.k, in.v, in.ig, in.fg, {}, scale);
  return {r.h, r.state.c};
}

TEST(CudaOps, ChunkMatchesCpuForwardAndGradients) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 200, H = 3, K = 32, V = 48;
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  for (const auto& c : op_cases()) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(0);
    auto base = random_inputs(c, B, T, H, K, V);
    auto cpu = to_device(base, torch::kCPU, true), gpu = to_device(base, dev, true);
    std::pair<torch::Tensor, torch::Tensor> on_cpu;
    {
      test::EmulationScope cpu_forms(false);  // the CPU forms, also where the kernels run emulated
      on_cpu = run_chunk(c, cpu, scale);
    }
    auto [o_cpu, s_cpu] = on_cpu;
    auto [o_gpu, s_gpu] = run_chunk(c, gpu, scale);
    ASSERT_EQ(o_gpu.device(), dev);
    const double e_o = rel_err(o_gpu, o_cpu), e_s = rel_err(s_gpu, s_cpu);
    EXPECT_LE(e_o, 1e-4);
    EXPECT_LE(e_s, 1e-4);
    auto dout = torch::randn_like(o_cpu);
    {
      test::EmulationScope cpu_forms(false);
      (o_cpu * dout).sum().backward();
    }
    (o_gpu * dout.to(dev)).sum().backward();
    double e_grad = 0;
    auto cpu_all = cpu.all(), gpu_all = gpu.all();
    for (size_t i = 0; i < cpu_all.size(); ++i) {
      if (!cpu_all[i]->defined() || !cpu_all[i]->grad().defined()) continue;
      ASSERT_TRUE(gpu_all[i]->grad().defined()) << "input " << i << " has no gradient on CUDA";
      e_grad = std::max(e_grad, rel_err(gpu_all[i]->grad(), cpu_all[i]->grad()));
    }
    EXPECT_LE(e_grad, 1e-4);
    std::printf("[cuda-ops] %-18s o %.1e  state %.1e  worst grad %.1e\n", c.name.c_str(), e_o, e_s, e_grad);
  }
}

// The diagonal sub-block scores of vector gates: kernels (fused on) vs pairwise libtorch ops, both
// masks, forward and the gradients of X, Y and G.
TEST(CudaOps, DiagonalBlockScoresMatchLibtorch) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  // The second shape has more sub-chunks than a grid's y dimension holds (65535).
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 5, 16, 40}, {70000, 16, 8}};
  for (const auto& shape : shapes)
    for (bool strict : {false, true}) {
      torch::manual_seed(strict ? 1 : 0);
      auto X = torch::randn(shape, dev).requires_grad_(true);
      auto Y = torch::randn(shape, dev).requires_grad_(true);
      auto G = (torch::log_sigmoid(torch::randn(shape, dev) + 2) / 4).cumsum(-2).detach().requires_grad_(true);
      auto out_shape = shape;
      out_shape.back() = 16;
      auto dout = torch::randn(out_shape, dev);
      auto run = [&](bool fused) {
        ops::set_fused_kernels(fused);
        auto out = ops::detail::diagonal_block_scores({X}, Y, G, strict)[0];
        ops::set_fused_kernels(true);
        auto grads = torch::autograd::grad({out}, {X, Y, G}, {dout});
        return std::make_pair(out, grads);
      };
      auto [o_k, g_k] = run(true);
      auto [o_t, g_t] = run(false);
      const double e_o = rel_err(o_k, o_t);
      double e_g = 0;
      for (size_t i = 0; i < 3; ++i) e_g = std::max(e_g, rel_err(g_k[i], g_t[i]));
      EXPECT_LE(e_o, 1e-5);
      EXPECT_LE(e_g, 1e-5);
      // The mask: nothing above the diagonal (nor on it when strict).
      EXPECT_EQ(o_k.triu(strict ? 0 : 1).abs().max().item<float>(), 0.f);
      std::printf("[cuda-ops] diagonal scores %ld sub-chunks strict=%d  o %.1e  worst grad %.1e\n",
                  static_cast<long>(X.numel() / (16 * shape.back())), strict, e_o, e_g);
    }
}

// The delta rule's solve: the inverse kernel applied as a product (fused on) vs linalg_solve_triangular,
// values and the gradients of L and R, for chunk sizes 16 and 64. Entries of L on and above the
// diagonal must be ignored.
TEST(CudaOps, UnitLowerSolveMatchesTriangularSolve) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  for (int64_t C : {16, 64}) {
    torch::manual_seed(C);
    auto L = (torch::randn({3, 4, C, C}, dev) * 0.2).requires_grad_(true);
    auto R = torch::randn({3, 4, C, 24}, dev).requires_grad_(true);
    auto dout = torch::randn({3, 4, C, 24}, dev);
    auto run = [&](bool fused) {
      ops::set_fused_kernels(fused);
      auto X = ops::detail::solve_unit_lower(L.tril(-1), R);
      ops::set_fused_kernels(true);
      auto grads = torch::autograd::grad({X}, {L, R}, {dout});
      return std::make_pair(X, grads);
    };
    auto [x_k, g_k] = run(true);
    auto [x_t, g_t] = run(false);
    const double e_x = rel_err(x_k, x_t), e_g = std::max(rel_err(g_k[0], g_t[0]), rel_err(g_k[1], g_t[1]));
    EXPECT_LE(e_x, 1e-5);
    EXPECT_LE(e_g, 1e-5);
    // Upper garbage in L changes nothing on the kernel path.
    ops::set_fused_kernels(true);
    auto with_upper = ops::detail::solve_unit_lower(L.detach().tril(-1) + L.detach().triu(0) * 7, R.detach());
    EXPECT_LE(rel_err(with_upper, x_k.detach()), 1e-6);
    std::printf("[cuda-ops] unit lower solve C=%ld  x %.1e  worst grad %.1e\n", static_cast<long>(C), e_x, e_g);
  }
}

// The scalar decay's gradient from a walk's row sums: the one-launch kernel (ops/cuda/decay_gradient.cu,
// what walk_decay_gradient runs on CUDA) against the libtorch form (what it runs on the CPU), with and
// without the w rows and the final state's gradient; T = 333 ends inside a tile and a chunk, T = 1500
// spans three tiles of 512.
TEST(CudaOps, DecayGradientKernelMatchesLibtorch) {
  REQUIRE_KERNELS();
  const int64_t B = 2, H = 3, K = 16, V = 8, C = 64;
  for (const int64_t T : {333, 1500})
    for (const bool rows_w : {false, true})
      for (const bool with_final : {false, true}) {
        SCOPED_TRACE("T=" + std::to_string(T) + " w=" + std::to_string(rows_w) + " final=" + std::to_string(with_final));
        torch::manual_seed(T + 2 * rows_w + with_final);
        const int64_t Tw = (T + C - 1) / C * C;
        auto dot_q = torch::randn({B, H, T}), dot_k = torch::randn({B, H, T});
        auto dot_w = rows_w ? torch::randn({B, H, Tw}) : torch::Tensor();
        auto final_state = torch::randn({B, H, K, V}), d_final = with_final ? torch::randn({B, H, K, V}) : torch::Tensor();
        auto on_dev = [&](const torch::Tensor& t) { return t.defined() ? t.to(dev) : t; };
        torch::Tensor want;
        {
          test::EmulationScope cpu_form(false);
          want = ops::detail::walk_decay_gradient(dot_q, dot_k, dot_w, C, d_final, final_state);
        }
        const auto got = ops::detail::walk_decay_gradient(on_dev(dot_q), on_dev(dot_k), on_dev(dot_w), C,
                                                          on_dev(d_final), on_dev(final_state));
        ASSERT_EQ(got.device(), dev);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_LE(rel_err(got, want), 1e-5);
      }
}

}  // namespace
}  // namespace linearize
