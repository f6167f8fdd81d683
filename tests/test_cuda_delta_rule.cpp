// The delta rule's fused kernels: the UT transform (the shapes it refuses, and its values and gradients
// against the transform written out in fp32), and the whole chunked delta rule (DeltaNet, Gated DeltaNet,
// KDA) in bf16 and fp16 against the libtorch chunked form in fp32. Without a GPU these run the kernels on
// the CPU build's emulator (cuda_test_util.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "ops/common.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/ops.h"
#include "test_util.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/ut_transform.h"
#endif

namespace linearize {
namespace {

using cuda_test::compare_fused;
using cuda_test::Family;
using cuda_test::has_plain_form;
using cuda_test::NoTf32;
using cuda_test::OpCase;
using cuda_test::random_inputs;
using cuda_test::to_device;
using test::rel_err;

// The UT transform given the scores, with heads that are parts of wider key heads: shapes that do not fit
// get an error that says what was expected. Four heads of v on two key heads (two parts each), T = 70.
TEST(CudaOps, UtTransformGivenRejectsShapesThatDoNotFit) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  const int64_t B = 1, T = 70, H = 4, N = 2;
  const auto opts = torch::TensorOptions().device(dev).dtype(torch::kBFloat16);
  const auto v = torch::randn({B, T, H, 64}, opts), ek = torch::randn({B, H, N * 64, 64}, opts);
  const auto beta = torch::rand({B, H, T}, opts.dtype(torch::kFloat));
  auto error_of = [&](const torch::Tensor& scores, int64_t w_parts, int64_t u_parts) -> std::string {
    try {
      ops::cuda_kernels::ut_transform_given_forward(scores, ek, v, beta, w_parts, u_parts);
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  const auto fits = torch::randn({B, 2, N, 64, 64}, opts);
  auto r = ops::cuda_kernels::ut_transform_given_forward(fits, ek, v, beta, 2, 1);
  EXPECT_EQ(r.w.sizes(), torch::IntArrayRef({B, 2, N * 64, 128}));  // W's two key parts side by side
  EXPECT_EQ(r.u.sizes(), torch::IntArrayRef({B, 2, N * 64, 64}));   // U from the first part only
  EXPECT_NE(error_of(torch::randn({B, 3, N, 64, 64}, opts), 1, 1).find("the scores' heads must divide v's 4"),
            std::string::npos);
  EXPECT_NE(error_of(fits, 3, 1).find("W and U take 1 to 2 parts of a key head; got 3 and 1"), std::string::npos);
  EXPECT_NE(error_of(torch::randn({B, 2, N + 1, 64, 64}, opts), 1, 1).find("the scores must be [B,H/parts,N,64,64]"),
            std::string::npos);
#endif
}

// The fused UT transform (ops/cuda/ut_transform.cu) against the transform written out with libtorch ops
// in fp32 on the same bf16-representable inputs: W, U and the gradients of k, v, beta and the decay,
// T = 150 (a partial last chunk), no decay and a scalar decay.
TEST(CudaOps, FusedUtTransformMatchesFp32) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 150, H = 3, D = 64, C = 64, N = 3, Tp = N * C;
  for (int gate : {0, 2}) {
    SCOPED_TRACE("gate=" + std::to_string(gate));
    torch::manual_seed(30 + gate);
    auto base = to_device(random_inputs({"delta", Family::DeltaRule, gate}, B, T, H, D, D), dev, false);
    for (auto* t : {&base.k, &base.v}) *t = t->to(torch::kBFloat16).to(torch::kFloat);
    auto dW = torch::randn({B, H, Tp, D}, dev), dU = torch::randn({B, H, Tp, D}, dev);
    const auto kind = gate == 0 ? ops::detail::GateKind::None : ops::detail::GateKind::Scalar;

    auto run = [&](bool fused) {
      const auto dt = fused ? torch::kBFloat16 : torch::kFloat;
      auto k = base.k.to(dt).detach().requires_grad_(true), v = base.v.to(dt).detach().requires_grad_(true);
      auto beta = base.beta.clone().requires_grad_(true);
      auto g = base.g.defined() ? base.g.clone().requires_grad_(true) : torch::Tensor();
      torch::Tensor W, U;
      if (fused) {
        std::tie(W, U) = ops::detail::fused_ut_transform(k, v, beta, g, kind, dt);
      } else {
        auto chunked = [&](const torch::Tensor& x) {  // [B,T,H,...] -> [B,H,N,C,...] zero past T
          auto h = x.transpose(1, 2);
          auto shape = h.sizes().vec();
          shape[2] = Tp - T;
          return torch::cat({h, torch::zeros(shape, h.options())}, 2).reshape({B, H, N, C, -1});
        };
        auto Kc = chunked(k), Vc = chunked(v), bt = chunked(beta.unsqueeze(-1));  // bt [B,H,N,C,1]
        auto G = g.defined() ? chunked(g.unsqueeze(-1)).squeeze(-1).cumsum(-1) : torch::zeros({B, H, N, C}, k.options());
        auto strict = torch::ones({C, C}, torch::dtype(torch::kBool).device(dev)).tril(-1);
        auto decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~strict, -INFINITY).exp();  // [B,H,N,C,C]
        auto Kb = Kc * bt;
        auto A = Kb.matmul(Kc.transpose(-1, -2)) * decay + torch::eye(C, k.options());
        auto solve = [&](const torch::Tensor& R) {
          return torch::linalg_solve_triangular(A, R, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
        };
        W = solve(Kb * G.exp().unsqueeze(-1)).reshape({B, H, Tp, D});
        U = solve(Vc * bt).reshape({B, H, Tp, D});
      }
      ((W.to(torch::kFloat) * dW).sum() + (U.to(torch::kFloat) * dU).sum()).backward();
      std::vector<torch::Tensor> out = {W, U, k.grad(), v.grad(), beta.grad()};
      if (g.defined()) out.push_back(g.grad());
      return out;
    };
    auto ref = run(false), fused = run(true);
    const char* names[] = {"W", "U", "dk", "dv", "dbeta", "dg"};
    std::string line;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(fused[i].defined()) << names[i];
      const double e = rel_err(fused[i], ref[i]);
      EXPECT_LE(e, 3e-2) << names[i];
      char buf[48];
      std::snprintf(buf, sizeof buf, "  %s %.1e", names[i], e);
      line += buf;
    }
    EXPECT_EQ(fused[0].scalar_type(), torch::kBFloat16);
    std::printf("[cuda-fused-ut] gate=%d:%s\n", gate, line.c_str());
  }
}

// The fused delta rule in bf16 and fp16 against the libtorch chunked form in fp32 on the same rounded
// inputs: o, final state and the gradients of q, k, v, beta, h0 and the decay. Head size 64, no or a
// scalar decay (the UT transform and the walk of ops/cuda) and a decay per key channel (Kimi Delta
// Attention: the vector-decay scores, the solve, the vector-decay walk); K = 128 and V = 128 in parts of 64
// channels, the walk with 128 key channels, for every gate (DeltaNet and Gated DeltaNet through KDA's
// kernels); KDA at K = 192 (the scores kernel on parts of 64 key channels, the rest the libtorch form). The
// libtorch form run in the 16-bit dtype is printed alongside as the round-off to expect.
TEST(CudaOps, FusedDeltaWalkMatchesFp32) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 333, H = 3;
  struct Case {
    int gate;
    torch::ScalarType dt;
    int64_t K = 64, V = 64;  // beyond 64: the kernels in parts of 64 channels (any gate; K = 64 or 128)
  };
  const std::vector<Case> cases = {
      {0, torch::kBFloat16},           {2, torch::kBFloat16},          {2, torch::kHalf},
      {3, torch::kBFloat16},           {3, torch::kHalf},              {3, torch::kBFloat16, 128, 128},
      {3, torch::kBFloat16, 64, 128},  {3, torch::kBFloat16, 128, 64}, {0, torch::kBFloat16, 128, 128},
      {2, torch::kBFloat16, 128, 128}, {1, torch::kHalf, 128, 128},     {3, torch::kBFloat16, 192, 64}};
  for (const auto& c : cases) {
    const OpCase op{"delta", Family::DeltaRule, c.gate};
    const int64_t K = c.K, V = c.V;
    SCOPED_TRACE("gate=" + std::to_string(c.gate) + " K=" + std::to_string(K) + " V=" + std::to_string(V));
    torch::manual_seed(20 + c.gate);
    auto base = random_inputs(op, B, T, H, K, V);
    for (auto* t : {&base.q, &base.k, &base.v}) *t = t->to(c.dt).to(torch::kFloat);  // representable inputs
    const double scale = 1.0 / std::sqrt(static_cast<double>(K));
    auto dout = torch::randn({B, T, H, V}, dev), dstate = torch::randn({B, H, K, V}, dev);

    auto run = [&](torch::ScalarType dt, bool fused) {
      auto in = to_device(base, dev, true);
      for (auto* t : {&in.q, &in.k, &in.v}) *t = t->detach().to(dt).requires_grad_(true);
      if (in.g.defined()) in.g = in.g.detach().requires_grad_(true);
      ops::set_fused_kernels(fused);
      auto r = ops::delta_rule_chunk(in.q, in.k, in.v, in.beta, in.g, in.h0, scale);
      ops::set_fused_kernels(true);
      ((r.o.to(torch::kFloat) * dout).sum() + (r.state * dstate).sum()).backward();
      std::vector<torch::Tensor> out = {r.o, r.state, in.q.grad(), in.k.grad(), in.v.grad(), in.beta.grad(), in.h0.grad()};
      if (in.g.defined()) out.push_back(in.g.grad());
      return out;
    };
    {
      auto in = to_device(base, dev, false);
      for (auto* t : {&in.q, &in.k, &in.v}) *t = t->to(c.dt);
      const auto kind = ops::detail::gate_kind(in.g, B, T, H, K, "test");
      bool taken = false;
      if (K > 128)  // the walk takes 128 key channels at most: the scores from the kernel, the rest libtorch's
        taken = ops::detail::vector_scores_by_parts(in.q, in.k, in.v, 64);
      else if (c.gate == 3 || K != 64 || V != 64)
        taken = ops::detail::fused_vector_delta_rule_chunk(in.q, in.k, in.v, in.beta, in.g, kind, in.h0, scale, 64)
                    .has_value();
      else
        taken = ops::detail::fused_delta_rule_dtype(in.q, in.k, in.v, kind, 64).has_value();
      ASSERT_TRUE(taken) << "the fused kernels should take this case";
    }
    auto ref = run(torch::kFloat, false), fused = run(c.dt, true);
    const auto plain = has_plain_form(kernels, c.dt) ? run(c.dt, false) : std::vector<torch::Tensor>{};
    const std::string line = compare_fused(ref, fused, plain, {"o", "state", "dq", "dk", "dv", "dbeta", "dh0", "dg"});
    EXPECT_EQ(fused[0].scalar_type(), c.dt);
    EXPECT_EQ(fused[1].scalar_type(), torch::kFloat);
    std::printf("[cuda-fused-delta] gate=%d K=%ld V=%ld %s:%s\n", c.gate, static_cast<long>(K), static_cast<long>(V),
                c.dt == torch::kHalf ? "fp16" : "bf16", line.c_str());
  }
}

}  // namespace
}  // namespace linearize
