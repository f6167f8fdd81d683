// The mLSTM's fused path (the scalar-decay kernels for the numerator, an fp32 normaliser) in bf16 and fp16
// against the libtorch chunked form in fp32, and its gates and normaliser kernels against a step-by-step
// recurrence in fp64. Without a GPU these run the kernels on the CPU build's emulator (cuda_test_util.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "ops/common.h"
#include "ops/mlstm/mlstm.h"
#include "ops/ops.h"
#include "test_util.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/mlstm_normaliser.h"
#endif

namespace linearize {
namespace {

using cuda_test::compare_fused;
using cuda_test::Family;
using cuda_test::has_plain_form;
using cuda_test::NoTf32;
using cuda_test::random_inputs;
using cuda_test::to_device;
using test::rel_err;

// The mLSTM through the scalar-decay kernels (numerator) and an fp32 normaliser, in bf16 and fp16,
// against the libtorch chunked form in fp32 on the same rounded inputs: h, the final state (c, n, m) and
// the gradients of q, k, v, both gates and the initial state. Head size 64 and 128, T = 333 (a partial
// last chunk), an initial state with its own max state. The libtorch form run in the 16-bit dtype is
// printed alongside as the round-off to expect.
TEST(CudaOps, FusedMlstmChunkMatchesFp32) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 333, H = 3;
  struct Case {
    int64_t D;
    torch::ScalarType dt;
  };
  for (const Case c : {Case{64, torch::kBFloat16}, Case{128, torch::kBFloat16}, Case{64, torch::kHalf}}) {
    SCOPED_TRACE("D=" + std::to_string(c.D));
    torch::manual_seed(30 + c.D);
    auto base = random_inputs({"mlstm", Family::Mlstm, 0}, B, T, H, c.D, c.D);
    for (auto* t : {&base.q, &base.k, &base.v}) *t = t->to(c.dt).to(torch::kFloat);  // representable inputs
    base.ig = base.ig * 2;  // input gates that move the max state often
    auto c0 = torch::randn({B, H, c.D, c.D}) * 0.1, n0 = torch::randn({B, H, c.D}) * 0.1, m0 = torch::randn({B, H});
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    auto dout = torch::randn({B, T, H, c.D}, dev), dc = torch::randn({B, H, c.D, c.D}, dev);
    auto dn = torch::randn({B, H, c.D}, dev);

    auto run = [&](torch::ScalarType dt, bool fused) {
      auto in = to_device(base, dev, true);
      for (auto* t : {&in.q, &in.k, &in.v}) *t = t->detach().to(dt).requires_grad_(true);
      ops::MlstmState init{c0.to(dev).detach().requires_grad_(true), n0.to(dev).detach().requires_grad_(true),
                           m0.to(dev)};
      ops::set_fused_kernels(fused);
      auto r = ops::mlstm_chunk(in.q, in.k, in.v, in.ig, in.fg, init, scale);
      ops::set_fused_kernels(true);
      ((r.h.to(torch::kFloat) * dout).sum() + (r.state.c * dc).sum() + (r.state.n * dn).sum()).backward();
      return std::vector<torch::Tensor>{r.h,           r.state.c,     r.state.n,      r.state.m,   in.q.grad(),
                                        in.k.grad(),   in.v.grad(),   in.ig.grad(),   in.fg.grad(), init.c.grad(),
                                        init.n.grad()};
    };
    {
      auto in = to_device(base, dev, false);
      for (auto* t : {&in.q, &in.k, &in.v}) *t = t->to(c.dt);
      ASSERT_TRUE(ops::detail::fused_mlstm_chunk(in.q, in.k, in.v, in.ig, in.fg, {}, scale, 1e-6, 64).has_value())
          << "the fused kernels should take this case";
    }
    auto ref = run(torch::kFloat, false), fused = run(c.dt, true);
    const auto plain = has_plain_form(kernels, c.dt) ? run(c.dt, false) : std::vector<torch::Tensor>{};
    const std::string line = compare_fused(ref, fused, plain,
                                           {"h", "c", "n", "m", "dq", "dk", "dv", "dig", "dfg", "dc0", "dn0"});
    EXPECT_EQ(fused[0].scalar_type(), c.dt);
    EXPECT_EQ(fused[1].scalar_type(), torch::kFloat);
    std::printf("[cuda-fused-mlstm] D=%ld %s:%s\n", static_cast<long>(c.D), c.dt == torch::kHalf ? "fp16" : "bf16",
                line.c_str());
  }
}

// The mLSTM's gates and normaliser kernels (ops/cuda/mlstm_normaliser.cu) against a step-by-step
// recurrence in fp64 with the kernels' gradient convention (m held constant inside g and k', m0
// excepted): every output and, for a random weighting of all five outputs, the gradient of every input.
// q and k in fp32 (k' in bf16) or in the 16-bit dtype, head size 64 and 128, input gates that move the
// max state often. The walks split the steps into segments by the number of heads: T = 333 over 6
// heads gives one tile per segment (a partial last tile), 400 over 512 heads two tiles per segment and
// a shorter last one, 50 one segment of one partial tile, 4100 over one head the most segments (64 are
// wanted, 33 of two tiles result, the last of one).
TEST(CudaOps, MlstmNormaliserKernelMatchesRecurrenceFp64) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  struct Case {
    int64_t B, H, T, K;
    torch::ScalarType in, lo;
  };
  const auto f32 = torch::kFloat, bf16 = torch::kBFloat16;
  for (const Case c : {Case{2, 3, 333, 64, f32, bf16}, Case{2, 3, 333, 128, f32, bf16}, Case{2, 3, 333, 64, bf16, bf16},
                       Case{2, 3, 333, 64, torch::kHalf, torch::kHalf}, Case{16, 32, 400, 64, f32, bf16},
                       Case{2, 3, 50, 64, f32, bf16}, Case{1, 1, 4100, 64, f32, bf16}}) {
    if (!kernels.gpu && c.B * c.H > 64) continue;  // its fp64 reference alone takes a minute on 2 cores
    const int64_t B = c.B, H = c.H, T = c.T;
    SCOPED_TRACE("B*H=" + std::to_string(B * H) + " T=" + std::to_string(T) + " K=" + std::to_string(c.K) +
                 " in=" + std::string(c10::toString(c.in)));
    torch::manual_seed(40 + c.K + T);
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    auto q = torch::randn({B, T, H, c.K}, f64).to(c.in).to(torch::kDouble);  // representable in c.in
    auto k = torch::randn({B, T, H, c.K}, f64).to(c.in).to(torch::kDouble);
    auto ig = (torch::randn({B, T, H}, f64) * 2).to(torch::kFloat).to(torch::kDouble);
    auto fg = (torch::randn({B, T, H}, f64) + 3).to(torch::kFloat).to(torch::kDouble);
    auto m0 = torch::randn({B, H}, f64).to(torch::kFloat).to(torch::kDouble);
    auto n0 = (torch::randn({B, H, c.K}, f64) * 0.1).to(torch::kFloat).to(torch::kDouble);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.K));
    auto d_kp = torch::randn({B, T, H, c.K}, f64).to(c.lo).to(torch::kDouble);
    auto d_g = torch::randn({B, H, T}, f64), d_m = torch::randn({B, H, T}, f64);
    auto d_den = torch::randn({B, H, T}, f64), d_final = torch::randn({B, H, c.K}, f64);

    // The reference, step by step.
    std::vector<torch::Tensor> leaves = {q, k, ig, fg, m0, n0};
    for (auto& t : leaves) t = t.clone().requires_grad_(true);
    auto lf = torch::log_sigmoid(leaves[3]);
    std::vector<torch::Tensor> kps, gs, ms, dens;
    auto m_prev = leaves[4], n = leaves[5];
    for (int64_t t = 0; t < T; ++t) {
      auto lf_t = lf.select(1, t), ig_t = leaves[2].select(1, t);  // [B,H]
      auto m_t = torch::maximum(lf_t + m_prev, ig_t);
      auto m_c = m_t.detach();
      auto g_t = lf_t + (t == 0 ? m_prev : m_prev.detach()) - m_c;
      auto kp_t = leaves[1].select(1, t) * (ig_t - m_c).exp().unsqueeze(-1);  // [B,H,K]
      n = g_t.exp().unsqueeze(-1) * n + kp_t;
      dens.push_back((n * leaves[0].select(1, t)).sum(-1) * scale);
      kps.push_back(kp_t), gs.push_back(g_t), ms.push_back(m_t);
      m_prev = m_t;
    }
    auto kp = torch::stack(kps, 1), g = torch::stack(gs, 2), m = torch::stack(ms, 2), den = torch::stack(dens, 2);
    ((kp * d_kp).sum() + (g * d_g).sum() + (m * d_m).sum() + (den * d_den).sum() + (n * d_final).sum()).backward();

    auto cu = [&](const torch::Tensor& x, torch::ScalarType dt) { return x.to(dev, dt).contiguous(); };
    auto fw = ops::cuda_kernels::mlstm_normaliser_forward(cu(q, c.in), cu(k, c.in), cu(ig, torch::kFloat),
                                                          cu(fg, torch::kFloat), cu(m0, torch::kFloat),
                                                          cu(n0, torch::kFloat), scale, c.lo);
    auto bw = ops::cuda_kernels::mlstm_normaliser_backward(
        cu(q, c.in), cu(k, c.in), cu(ig, torch::kFloat), cu(fg, torch::kFloat), cu(m0, torch::kFloat), fw,
        cu(d_kp, c.lo), cu(d_g, torch::kFloat), cu(d_m, torch::kFloat), cu(d_den, torch::kFloat),
        cu(d_final, torch::kFloat), scale, true);
    // Again with a gradient that q has from elsewhere, which dq takes in.
    auto dq_add = torch::randn({B, T, H, c.K}, f64).to(c.in).to(torch::kDouble);
    auto bw_add = ops::cuda_kernels::mlstm_normaliser_backward(
        cu(q, c.in), cu(k, c.in), cu(ig, torch::kFloat), cu(fg, torch::kFloat), cu(m0, torch::kFloat), fw,
        cu(d_kp, c.lo), cu(d_g, torch::kFloat), cu(d_m, torch::kFloat), cu(d_den, torch::kFloat),
        cu(d_final, torch::kFloat), scale, true, cu(dq_add, c.in));
    EXPECT_EQ(fw.kp.scalar_type(), c.lo);
    EXPECT_EQ(bw.dq.scalar_type(), c.in);
    const double lo_tol = c.lo == torch::kHalf ? 2e-3 : 1e-2;  // one rounding to the 16-bit dtype
    const double in_tol = c.in == torch::kFloat ? 1e-4 : lo_tol;
    const std::vector<std::tuple<std::string, torch::Tensor, torch::Tensor, double>> checks = {
        {"dq+add", bw_add.dq, leaves[0].grad() + dq_add, in_tol},
        {"kp", fw.kp, kp, lo_tol},          {"g", fw.g, g, 1e-4},
        {"m", fw.m, m, 1e-5},               {"den", fw.den, den, 1e-4},
        {"n_final", fw.n_final, n, 1e-4},   {"dq", bw.dq, leaves[0].grad(), in_tol},
        {"dk", bw.dk, leaves[1].grad(), in_tol}, {"digate", bw.d_igate, leaves[2].grad(), 1e-4},
        {"dfgate", bw.d_fgate, leaves[3].grad(), 1e-4}, {"dm0", bw.d_m0, leaves[4].grad(), 1e-4},
        {"dn0", bw.d_n0, leaves[5].grad(), 1e-4}};
    std::string line;
    for (const auto& [name, got, want, tol] : checks) {
      const double err = rel_err(got, want);
      EXPECT_LE(err, tol) << name;
      char buf[64];
      std::snprintf(buf, sizeof buf, "  %s %.1e", name.c_str(), err);
      line += buf;
    }
    std::printf("[cuda-mlstm-normaliser] B*H=%ld T=%ld K=%ld %s:%s\n", static_cast<long>(B * H), static_cast<long>(T),
                static_cast<long>(c.K), c10::toString(c.in), line.c_str());
  }
#endif
}

}  // namespace
}  // namespace linearize
