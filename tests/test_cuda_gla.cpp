// The fused chunk kernels of gated linear attention (no, fixed, scalar and per-key-channel decay) in bf16 and
// fp16 against the libtorch chunked form in fp32, and the vector-decay scores kernels against calls of
// themselves: the keys' own scores in the same call, and wide keys in parts of 64 channels. Without a GPU
// these run the kernels on the CPU build's emulator (cuda_test_util.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ops/common.h"
#include "ops/gla/gla.h"
#include "ops/ops.h"
#include "test_util.h"

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

// The fused chunk kernels of the GLA family (16-bit operands on tensor cores, fp32 state) against the libtorch
// chunked form in fp32 on the same rounded inputs: o, the final state and the gradients of q, k, v, g and
// h0 (both outputs carry a loss, so the final state's gradient flows in too). No decay, a fixed and a
// scalar decay (chunk_scalar_decay.cu; K = V = 64 and 128) and a decay per key channel (the scores and
// walk kernels; K = V = 64, and K = V = 128, K = 64, V = 128 or K = 256 in parts: two key groups of 128
// whose outputs are summed); T = 333 ends in a partial chunk. The libtorch form fed the same 16-bit inputs
// is printed beside them for scale.
TEST(CudaOps, FusedGatedLinearAttentionChunkMatchesFp32) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 333, H = 3;
  struct Case {
    int64_t D;  // K, and V unless given
    int gate;
    torch::ScalarType dt;
    int64_t V = 0;
  };
  const std::vector<Case> cases = {{64, 0, torch::kBFloat16},  {64, 1, torch::kBFloat16}, {64, 2, torch::kBFloat16},
                                   {128, 0, torch::kBFloat16}, {128, 2, torch::kBFloat16}, {64, 2, torch::kHalf},
                                   {64, 3, torch::kBFloat16},  {64, 3, torch::kHalf},  {128, 3, torch::kBFloat16},
                                   {64, 3, torch::kBFloat16, 128}, {256, 3, torch::kBFloat16, 64}};
  for (const auto& c : cases) {
    const OpCase op{"gla", Family::Gla, c.gate};
    const int64_t V = c.V > 0 ? c.V : c.D;
    SCOPED_TRACE("D=" + std::to_string(c.D) + " V=" + std::to_string(V) + " gate=" + std::to_string(c.gate));
    torch::manual_seed(c.D + c.gate);
    auto base = random_inputs(op, B, T, H, c.D, V);
    for (auto* t : {&base.q, &base.k, &base.v}) *t = t->to(c.dt).to(torch::kFloat);  // representable inputs
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    auto dout = torch::randn({B, T, H, V}, dev), dstate = torch::randn({B, H, c.D, V}, dev);

    // o, state and the gradients of q, k, v, g, h0 (g's only when it is data-dependent or fixed).
    auto run = [&](torch::ScalarType dt, bool fused) {
      auto in = to_device(base, dev, true);
      for (auto* t : {&in.q, &in.k, &in.v}) *t = t->detach().to(dt).requires_grad_(true);
      if (in.g.defined()) in.g = in.g.detach().requires_grad_(true);
      ops::set_fused_kernels(fused);
      auto r = ops::gla_chunk(in.q, in.k, in.v, in.g, in.h0, scale);
      ops::set_fused_kernels(true);
      ((r.o.to(torch::kFloat) * dout).sum() + (r.state * dstate).sum()).backward();
      std::vector<torch::Tensor> out = {r.o, r.state, in.q.grad(), in.k.grad(), in.v.grad(), in.h0.grad()};
      if (in.g.defined()) out.push_back(in.g.grad());
      return out;
    };
    {
      torch::NoGradGuard no_grad;
      auto in = to_device(base, dev, false);
      for (auto* t : {&in.q, &in.k, &in.v}) *t = t->to(c.dt);
      const auto kind = ops::detail::gate_kind(in.g, B, T, H, c.D, "test");
      const auto taken = c.gate == 3 ? ops::detail::fused_vector_decay_chunk(in.q, in.k, in.v, in.g, kind, in.h0, scale, 64)
                                     : ops::detail::fused_scalar_decay_chunk(in.q, in.k, in.v, in.g, kind, in.h0, scale, 64);
      ASSERT_TRUE(taken.has_value()) << "the fused kernels should take this case";
    }
    auto ref = run(torch::kFloat, false), fused = run(c.dt, true);
    const auto plain = has_plain_form(kernels, c.dt) ? run(c.dt, false) : std::vector<torch::Tensor>{};
    const std::string line = compare_fused(ref, fused, plain, {"o", "state", "dq", "dk", "dv", "dh0", "dg"});
    EXPECT_EQ(fused[0].scalar_type(), c.dt);
    EXPECT_EQ(fused[1].scalar_type(), torch::kFloat);
    std::printf("[cuda-fused-chunk] D=%ld%s gate=%d %s:%s\n", static_cast<long>(c.D),
                V != c.D ? (" V=" + std::to_string(V)).c_str() : "", c.gate,
                c.dt == torch::kHalf ? "fp16" : "bf16", line.c_str());
  }
}

// Backward from a random weighting of every output (the weights drawn after seeding with `seed`, so two runs
// with outputs of the same shapes take the same ones), then the inputs' gradients appended to the outputs.
void with_grads_of_random_loss(std::vector<torch::Tensor>& out, uint64_t seed,
                               std::initializer_list<torch::Tensor> inputs) {
  torch::manual_seed(seed);
  auto loss = torch::zeros({}, out.front().options().dtype(torch::kFloat));
  for (const auto& o : out) loss = loss + (o.to(torch::kFloat) * torch::randn(o.sizes(), loss.options())).sum();
  loss.backward();
  for (const auto& x : inputs) out.push_back(x.grad());
}

// The scores kernels asked for the keys' own scores as well (Kimi Delta Attention's one call) against two
// calls of the plain kernels, q against k and k against k: the forward's six outputs, and dq, dk, dg for
// random gradients of all six. Both read the same rounded inputs, so the outputs may differ by a rounding
// of the last place only; dk is summed in fp32 and rounded once by the pair, twice by the two calls.
TEST(CudaOps, FusedVectorScoresWithKeyScoresMatchTwoCalls) {
  REQUIRE_KERNELS();
  const int64_t B = 2, T = 333, H = 3, D = 64;
  const auto opts = torch::TensorOptions().device(dev);
  for (const auto dt : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(dt == torch::kHalf ? "fp16" : "bf16");
    torch::manual_seed(50);
    const auto q0 = torch::randn({B, T, H, D}, opts).to(dt), k0 = ops::l2_norm(torch::randn({B, T, H, D}, opts)).to(dt);
    const auto g0 = torch::log_sigmoid(torch::randn({B, T, H, D}, opts) + 3) / 4;
    const double scale = 0.125;
    auto run = [&](bool pair) {  // A, qd, kd, a, Akk, ek, dq, dk, dg
      auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
      auto g = g0.clone().requires_grad_(true);
      auto s = ops::detail::fused_vector_scores(q, k, g, dt, scale, pair);
      std::vector<torch::Tensor> out = {s.A, s.qd, s.kd, s.a};
      if (pair) {
        out.push_back(s.Akk), out.push_back(s.ek);
      } else {
        auto keys = ops::detail::fused_vector_scores(k, k, g, dt, 1.0);
        out.push_back(keys.A), out.push_back(keys.qd);
      }
      with_grads_of_random_loss(out, 51, {q, k, g});
      return out;
    };
    const auto pair = run(true), two = run(false);
    const char* names[] = {"A", "qd", "kd", "a", "Akk", "ek", "dq", "dk", "dg"};
    const double ulp = dt == torch::kHalf ? 1.0 / 1024 : 1.0 / 128;  // of the largest element, 16-bit
    const double bound[] = {ulp, ulp, ulp, 1e-6, ulp, ulp, ulp, 2 * ulp, 1e-4};
    ASSERT_EQ(pair.size(), 9u);
    std::string line;
    for (size_t i = 0; i < pair.size(); ++i) {
      ASSERT_TRUE(pair[i].defined()) << names[i];
      ASSERT_EQ(pair[i].sizes(), two[i].sizes()) << names[i];
      const double e = rel_err(pair[i], two[i]);
      EXPECT_LE(e, bound[i]) << names[i];
      char buf[48];
      std::snprintf(buf, sizeof buf, "  %s %.1e", names[i], e);
      line += buf;
    }
    std::printf("[cuda-vector-scores] %s pair vs two calls:%s\n", dt == torch::kHalf ? "fp16" : "bf16", line.c_str());
  }
}

// The scores kernels on K = 64 m key channels (taken 64 at a time, the scores summed in fp32 and rounded
// once) against m calls on the 64-channel parts, whose scores are summed after their rounding: the row
// factors, ek and the gradients dq, dk, dg are the parts' to the bit, A and Akk within a rounding. T = 333
// ends inside a chunk.
TEST(CudaOps, FusedVectorScoresInPartsMatchPartCalls) {
  REQUIRE_KERNELS();
  const int64_t B = 2, T = 333, H = 3;
  const auto opts = torch::TensorOptions().device(dev);
  for (const int64_t K : {128, 192})
    for (const bool pair : {false, true}) {
      const auto dt = torch::kBFloat16;
      SCOPED_TRACE("K=" + std::to_string(K) + " pair=" + std::to_string(pair));
      const int64_t m = K / 64;
      torch::manual_seed(60 + K + pair);
      const auto q0 = torch::randn({B, T, H, K}, opts).to(dt);
      const auto k0 = ops::l2_norm(torch::randn({B, T, H, K}, opts)).to(dt);
      const auto g0 = torch::log_sigmoid(torch::randn({B, T, H, K}, opts) + 3) / 4;
      const double scale = 0.1;
      // A, qd, kd, a, (Akk, ek,) dq, dk, dg; the parts' A and Akk summed in fp32, their rows side by side.
      auto run = [&](bool whole) {
        auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
        auto g = g0.clone().requires_grad_(true);
        std::vector<torch::Tensor> out;
        if (whole) {
          auto s = ops::detail::fused_vector_scores(q, k, g, dt, scale, pair);
          out = {s.A.to(torch::kFloat), s.qd, s.kd, s.a};
          if (pair) out.push_back(s.Akk.to(torch::kFloat)), out.push_back(s.ek);
        } else {
          std::vector<ops::detail::VectorScores> parts;
          for (int64_t j = 0; j < m; ++j) {
            auto part = [&](const torch::Tensor& x) { return x.narrow(3, 64 * j, 64); };
            parts.push_back(ops::detail::fused_vector_scores(part(q), part(k), part(g), dt, scale, pair));
          }
          auto sum = [&](auto field) {
            auto total = (parts[0].*field).to(torch::kFloat);
            for (int64_t j = 1; j < m; ++j) total = total + (parts[j].*field).to(torch::kFloat);
            return total;
          };
          auto side_by_side = [&](auto field) {
            std::vector<torch::Tensor> xs;
            for (auto& p : parts) xs.push_back(p.*field);
            return torch::cat(xs, -1);
          };
          using S = ops::detail::VectorScores;
          out = {sum(&S::A), side_by_side(&S::qd), side_by_side(&S::kd), side_by_side(&S::a)};
          if (pair) {
            std::vector<torch::Tensor> eks;  // [B,H,R,64] each -> [B,H m,R,64], part j of head h at h m + j
            for (auto& p : parts) eks.push_back(p.ek.unsqueeze(2));
            auto ek = torch::cat(eks, 2);
            out.push_back(sum(&S::Akk)), out.push_back(ek.reshape({B, H * m, ek.size(3), 64}));
          }
        }
        with_grads_of_random_loss(out, 61, {q, k, g});
        return out;
      };
      const auto whole = run(true), parts = run(false);
      std::vector<std::string> names = {"A", "qd", "kd", "a"};
      if (pair) names.push_back("Akk"), names.push_back("ek");
      for (const char* n : {"dq", "dk", "dg"}) names.push_back(n);
      ASSERT_EQ(whole.size(), names.size());
      std::string line;
      for (size_t i = 0; i < whole.size(); ++i) {
        ASSERT_EQ(whole[i].sizes(), parts[i].sizes()) << names[i];
        const bool summed = names[i] == "A" || names[i] == "Akk";
        const double e = rel_err(whole[i], parts[i]);
        // The sums' one rounding against the parts' m. Every part's block takes the same gradients of the
        // scores and of its own factors as the part's call, so the gradients are the parts' to the bit.
        EXPECT_LE(e, summed ? 1.0 / 128 : 0.0) << names[i];
        char buf[48];
        std::snprintf(buf, sizeof buf, "  %s %.1e", names[i].c_str(), e);
        line += buf;
      }
      std::printf("[cuda-vector-scores] K=%ld %s whole vs parts:%s\n", static_cast<long>(K), pair ? "pair" : "plain",
                  line.c_str());
    }
}

}  // namespace
}  // namespace linearize
