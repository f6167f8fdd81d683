// The fused decode step against the libtorch recurrent step (fp32; bf16 within bf16 round-off), checked to
// be what a T = 1 recurrent call runs, and that step with grouped KV heads against the heads spread first.
// Without a GPU these run the kernels on the CPU build's emulator (cuda_test_util.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "io/error.h"
#include "model/mixers/blocks.h"
#include "ops/ops.h"
#include "test_util.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/recurrent_step.h"
#endif

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

// Copies of `parts` ([B, T, heads, D] each) as views into one wider tensor, side by side along the last
// dimension as a packed product lays them out (so at B > 1 none is contiguous).
std::vector<torch::Tensor> as_slices_of_one_product(const std::vector<torch::Tensor>& parts) {
  const auto B = parts[0].size(0), T = parts[0].size(1);
  int64_t width = 3;  // a gap, so no slice starts at the row's start
  for (const auto& p : parts) width += p.size(2) * p.size(3);
  auto wide = torch::zeros({B, T, width}, parts[0].options());
  std::vector<torch::Tensor> out;
  int64_t at = 3;
  for (const auto& p : parts) {
    const auto n = p.size(2) * p.size(3);
    auto slice = wide.narrow(2, at, n).view({B, T, p.size(2), p.size(3)});
    slice.copy_(p);
    out.push_back(slice);
    at += n;
  }
  return out;
}

// One recurrent step (T = 1) with fused kernels on or off.
std::pair<torch::Tensor, torch::Tensor> recurrent_step(const OpCase& c, const OpInputs& in, double scale, bool fused) {
  ops::set_fused_kernels(fused);
  auto r = c.family == Family::Gla ? ops::gla_recurrent(in.q, in.k, in.v, in.g, in.h0, scale)
                                   : ops::delta_rule_recurrent(in.q, in.k, in.v, in.beta, in.g, in.h0, scale);
  ops::set_fused_kernels(true);
  return {r.o, r.state};
}

TEST(CudaOps, FusedDecodeStepMatchesLibtorchStep) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  ASSERT_TRUE(ops::fused_kernels_enabled()) << "the CUDA build should compile the fused kernels";
  torch::NoGradGuard no_grad;
  const int64_t B = 3, H = 4, K = 64, V = 96;
  for (const auto& c : op_cases()) {
    if (c.family == Family::Mlstm) continue;
    SCOPED_TRACE(c.name);
    torch::manual_seed(1);
    auto in = to_device(random_inputs(c, B, 1, H, K, V), dev, false);
    auto [o_ref, s_ref] = recurrent_step(c, in, 0.125, false);
    auto [o_fused, s_fused] = recurrent_step(c, in, 0.125, true);
    EXPECT_EQ(s_fused.scalar_type(), torch::kFloat);
    const double e_o = rel_err(o_fused, o_ref), e_s = rel_err(s_fused, s_ref);
    EXPECT_LE(e_o, 1e-5);
    EXPECT_LE(e_s, 1e-5);

#ifdef LINEARIZE_WITH_KERNELS
    // The op call above went through the kernel: calling it directly gives bit-identical results.
    torch::Tensor g1 = !in.g.defined() ? torch::Tensor() : in.g.dim() == 1 ? in.g : in.g.select(1, 0);
    auto [o_direct, s_direct] = ops::cuda_kernels::recurrent_step(
        in.q.select(1, 0), in.k.select(1, 0), in.v.select(1, 0), g1,
        in.beta.defined() ? in.beta.select(1, 0) : torch::Tensor(), in.h0, 0.125);
    EXPECT_TRUE(torch::equal(o_direct.unsqueeze(1), o_fused));
    EXPECT_TRUE(torch::equal(s_direct, s_fused));
    // q, k and v as slices of one packed product are read in place, with the same results.
    const auto qkv = as_slices_of_one_product({in.q, in.k, in.v});
    ASSERT_FALSE(qkv[0].select(1, 0).is_contiguous());
    auto [o_slices, s_slices] = ops::cuda_kernels::recurrent_step(
        qkv[0].select(1, 0), qkv[1].select(1, 0), qkv[2].select(1, 0), g1,
        in.beta.defined() ? in.beta.select(1, 0) : torch::Tensor(), in.h0, 0.125);
    EXPECT_TRUE(torch::equal(o_slices, o_direct)) << "o from slices of a packed product";
    EXPECT_TRUE(torch::equal(s_slices, s_direct)) << "the state from slices of a packed product";
#endif

    // bf16 q, k, v: the state stays fp32 and the output is within bf16 round-off of the fp32 step.
    OpInputs half = in;
    for (auto* t : {&half.q, &half.k, &half.v}) *t = t->to(torch::kBFloat16);
    auto [o_half, s_half] = recurrent_step(c, half, 0.125, true);
    EXPECT_EQ(o_half.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(s_half.scalar_type(), torch::kFloat);
    const double e_half = rel_err(o_half, o_ref);
    EXPECT_LE(e_half, 2e-2);
    std::printf("[cuda-fused] %-18s o %.1e  state %.1e  bf16 o %.1e\n", c.name.c_str(), e_o, e_s, e_half);
  }
}

// gla_recurrent with grouped KV heads (k, v and the gate with Hkv < H heads, as GLA's and RetNet's decode
// steps pass them) against the same step with those heads spread over the H query heads first, for each
// decay kind: the fused kernel within fp32 round-off, and the libtorch form bit for bit (it spreads them).
TEST(CudaOps, GroupedDecodeStepMatchesSpreadHeads) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  torch::NoGradGuard no_grad;
  const int64_t B = 2, H = 6, Hkv = 2, G = H / Hkv, K = 64, V = 48;
  const auto opts = torch::TensorOptions().device(dev);
  torch::manual_seed(7);
  auto q = torch::randn({B, 1, H, K}, opts), k = torch::randn({B, 1, Hkv, K}, opts) * 0.2;
  auto v = torch::randn({B, 1, Hkv, V}, opts), h0 = torch::randn({B, H, K, V}, opts);
  auto spread = [&](const torch::Tensor& x) { return mixers::repeat_heads(x, G); };
  const std::vector<std::pair<std::string, torch::Tensor>> gates = {
      {"none", torch::Tensor()},
      {"fixed [H]", -torch::rand({H}, opts)},
      {"scalar [B,1,Hkv]", -torch::rand({B, 1, Hkv}, opts)},
      {"vector [B,1,Hkv,K]", -torch::rand({B, 1, Hkv, K}, opts)}};
  for (const auto& [name, g] : gates) {
    SCOPED_TRACE(name);
    const auto g_spread = g.defined() && g.dim() > 1 ? spread(g.dim() == 3 ? g.unsqueeze(-1) : g) : g;
    const auto g_ref = g.defined() && g.dim() == 3 ? g_spread.squeeze(-1) : g_spread;
    ops::set_fused_kernels(false);
    auto ref = ops::gla_recurrent(q, spread(k), spread(v), g_ref, h0, 0.125);
    auto plain = ops::gla_recurrent(q, k, v, g, h0, 0.125);
    ops::set_fused_kernels(true);
    auto fused = ops::gla_recurrent(q, k, v, g, h0, 0.125);
    EXPECT_TRUE(torch::equal(plain.o, ref.o) && torch::equal(plain.state, ref.state)) << "the libtorch form";
    const auto qkv = as_slices_of_one_product({q, k, v});  // the grouped heads read in place
    const auto sliced = ops::gla_recurrent(qkv[0], qkv[1], qkv[2], g, h0, 0.125);
    EXPECT_TRUE(torch::equal(sliced.o, fused.o) && torch::equal(sliced.state, fused.state))
        << "q, k and v as slices of one packed product";
    const double e_o = rel_err(fused.o, ref.o), e_s = rel_err(fused.state, ref.state);
    EXPECT_LE(e_o, 1e-5);
    EXPECT_LE(e_s, 1e-5);
    std::printf("[cuda-grouped-step] %-18s o %.1e  state %.1e\n", name.c_str(), e_o, e_s);
  }
  EXPECT_THROW(ops::gla_recurrent(q, k.narrow(2, 0, 1).expand({B, 1, 4, K}), v, {}, h0, 0.125), Error)
      << "Hkv must divide H and match v's heads";
}


// gla_recurrent with the gate's logits (GLA's decode step): the fused step computes log_sigmoid(x) / 16 as it
// reads them, within fp32 round-off of the step given that log decay, with grouped KV heads and bf16 logits;
// and the libtorch form, which computes the log decay first, gives that step's result to the bit.
TEST(CudaOps, DecodeStepFromGateLogitsMatchesLogDecay) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  torch::NoGradGuard no_grad;
  const int64_t B = 3, H = 4, Hkv = 2, K = 64, V = 32;
  const auto opts = torch::TensorOptions().device(dev);
  torch::manual_seed(17);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto q = torch::randn({B, 1, H, K}, opts).to(dtype), k = (torch::randn({B, 1, Hkv, K}, opts) * 0.2).to(dtype);
    auto v = torch::randn({B, 1, Hkv, V}, opts).to(dtype), h0 = torch::randn({B, H, K, V}, opts);
    auto logits = (torch::randn({B, 1, Hkv, K}, opts) * 4).to(dtype);
    const auto log_decay = torch::log_sigmoid(logits.to(torch::kFloat)) / 16.0;
    const auto want = ops::gla_recurrent(q, k, v, log_decay, h0, 0.125);
    const auto got = ops::gla_recurrent(q, k, v, logits, h0, 0.125, false, 16.0);
    const double e_o = rel_err(got.o, want.o), e_s = rel_err(got.state, want.state);
    EXPECT_LE(e_o, dtype == torch::kFloat ? 1e-5 : 1e-2);
    EXPECT_LE(e_s, 1e-5);
    ops::set_fused_kernels(false);
    const auto plain = ops::gla_recurrent(q, k, v, logits, h0, 0.125, false, 16.0);
    const auto plain_want = ops::gla_recurrent(q, k, v, log_decay, h0, 0.125);
    ops::set_fused_kernels(true);
    EXPECT_TRUE(torch::equal(plain.o, plain_want.o) && torch::equal(plain.state, plain_want.state));
    std::printf("[cuda-gate-logits] %s o %.1e  state %.1e\n", c10::toString(dtype), e_o, e_s);
  }
  EXPECT_THROW(ops::gla_recurrent(torch::randn({1, 1, 2, 8}), torch::randn({1, 1, 2, 8}), torch::randn({1, 1, 2, 8}),
                                  torch::randn({1, 1, 2}), {}, 0.125, false, 16.0),
               Error)
      << "logits need a per-channel gate";
}

// ops::delta_rule_decode takes q and k before their L2 norm and beta as logits, read in place from one packed
// product as a layer gives them; the fused step normalises and takes the sigmoid itself. Against the
// normalised step in fp32 libtorch, for each gate of the family and both beta scales.
TEST(CudaOps, DecodeStepFromRawInputsMatchesNormalisedStep) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  torch::NoGradGuard no_grad;
  const int64_t B = 3, H = 4, K = 64, V = 64;
  const double scale = 0.125;
  const auto opts = torch::TensorOptions().device(dev);
  torch::manual_seed(23);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16})
    for (int gate = 0; gate < 3; ++gate)  // none (DeltaNet), one per step (Gated DeltaNet), per key channel (KDA)
      for (const double beta_scale : {1.0, 2.0}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " gate " + std::to_string(gate) + " beta x" +
                     std::to_string(beta_scale));
        const auto packed = (torch::randn({B, 1, 2 * H * K + H}, opts) * 2).to(dtype);  // q, k, beta logits
        const auto q = packed.narrow(2, 0, H * K).view({B, 1, H, K});
        const auto k = packed.narrow(2, H * K, H * K).view({B, 1, H, K});
        const auto logits = packed.narrow(2, 2 * H * K, H);
        const auto v = torch::randn({B, 1, H, V}, opts).to(dtype), h0 = torch::randn({B, H, K, V}, opts) * 0.1;
        torch::Tensor g;
        if (gate == 1) g = -torch::softplus(torch::randn({B, 1, H}, opts));
        if (gate == 2) g = -torch::softplus(torch::randn({B, 1, H, K}, opts));
        ops::set_fused_kernels(false);
        auto f = [](const torch::Tensor& x) { return x.to(torch::kFloat); };
        const auto want = ops::delta_rule_recurrent(ops::l2_norm(f(q)), ops::l2_norm(f(k)), f(v),
                                                    torch::sigmoid(f(logits)) * beta_scale, g, h0, scale);
        const auto plain = ops::delta_rule_decode(q, k, v, logits, beta_scale, g, h0, scale);
        ops::set_fused_kernels(true);
        auto state = h0.clone();
        const auto got = ops::delta_rule_decode(q, k, v, logits, beta_scale, g, state, scale, /*in_place=*/true);
        const double e_o = rel_err(got.o, want.o), e_s = rel_err(got.state, want.state);
        EXPECT_LE(e_o, dtype == torch::kFloat ? 1e-5 : 1e-2);
        EXPECT_LE(e_s, dtype == torch::kFloat ? 1e-5 : 1e-4);
        EXPECT_TRUE(got.state.is_same(state)) << "in place: the state written over the one given";
        // The libtorch form rounds the normalised q and k to the inputs' dtype; the fused step does not.
        EXPECT_LE(rel_err(plain.o, want.o), dtype == torch::kFloat ? 1e-5 : 2e-2);
        EXPECT_LE(rel_err(plain.state, want.state), dtype == torch::kFloat ? 1e-5 : 1e-2);
        if (beta_scale == 1)
          std::printf("[cuda-raw-decode] %s gate %d: o %.1e  state %.1e\n", c10::toString(dtype), gate, e_o, e_s);
      }
  const auto x = torch::randn({1, 2, 2, 8});
  EXPECT_THROW(ops::delta_rule_decode(x, x, x, torch::randn({1, 2, 2}), 1, {}, {}, 0.125), Error) << "one step only";
  const auto x1 = torch::randn({1, 1, 2, 8});
  EXPECT_THROW(ops::delta_rule_decode(x1, x1, x1, torch::randn({1, 1, 3}), 1, {}, {}, 0.125), Error) << "beta's heads";
}

}  // namespace
}  // namespace linearize
