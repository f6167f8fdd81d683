// Tests of the CUDA code (suites named Cuda*, ctest label `cuda`):
//  (a) the chunked op families on CUDA equal the CPU forms, forward and every gradient (fp32), and the
//      fused kernels equal the libtorch forms (16-bit within the round-off of the fp32 form);
//  (b) the fused decode kernel equals the libtorch recurrent step (fp32; bf16 within bf16 round-off)
//      and is what a T = 1 recurrent call runs;
//  (c) every mixer on CUDA: token-by-token decode (fused kernels on) equals the whole-sequence forward,
//      and the forward equals the CPU's;
//  (e) a student's decode step captured as a CUDA graph equals the eager step, logits and state;
//  (d) a student's stage-3 step under bf16 autocast keeps fp32 weights and gradients, and lowers the
//      loss on a fixed batch.
// The tests of (a), (b) and the decode test of (c) check kernels: without a GPU they run them on the CPU
// build's SIMT emulator (ops/cuda/emulation/simt.h), so that CI checks the kernels' arithmetic too (the
// libtorch form is not run in fp16 there: libtorch 1.13 has no fp16 products on the CPU). The rest need
// a GPU and skip without one. The CUDA golden checks of the op families (also emulated) and the Llama
// teacher sit with their CPU twins (test_ops.cpp, test_llama.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "compat/torch_compat.h"
#include "distill/stages.h"
#include "infer/graphed_step.h"
#include "io/error.h"
#include "model/causal_lm.h"
#include "model/mixers/blocks.h"
#include "model/mixers/factory.h"
#include "model/mixers/mixer_config.h"
#include "model/student.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "test_util.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/kernels.h"
#endif

namespace linearize {
namespace {

using test::rel_err;

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "skipped: CUDA not available"

// Where a kernel test runs: the GPU when there is one, else the CPU through the kernel emulator (on for
// the test's whole scope), else nowhere. The GPU's device carries its index (cuda:0), as the tensors made
// there report theirs, so that the tests can compare devices.
struct KernelDevice {
  KernelDevice()
      : gpu(torch::cuda::is_available()),
        device(gpu ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU)) {
    if (!gpu && ops::kernel_emulation_available()) emulation.emplace(true);
  }
  bool available() const { return gpu || emulation.has_value(); }
  bool gpu;
  torch::Device device;
  std::optional<test::EmulationScope> emulation;
};
// Declares `kernels` (a KernelDevice) and `dev` (its device), or skips the test.
#define REQUIRE_KERNELS()                 \
  KernelDevice kernels;                   \
  if (!kernels.available())               \
    GTEST_SKIP() << "skipped: neither CUDA nor the kernel emulator in this build"; \
  const torch::Device dev = kernels.device
// Whether the libtorch form runs in dtype dt where the kernels do, to print its error beside theirs for
// scale: not in fp16 on the CPU (libtorch 1.13 has no fp16 products there), under the emulator.
bool has_plain_form(const KernelDevice& kernels, torch::ScalarType dt) {
  return kernels.gpu || dt != torch::kHalf;
}

// One output of a kernel test: what the kernel gave, the fp64 reference, the libtorch formula's result in
// the same dtypes (undefined where it does not run) and the bound on the kernel's error.
struct Fp64Check {
  std::string name;
  torch::Tensor got, want, formula;
  double bound;
};

// Expects each kernel output within its bound of the reference, and returns the line the test prints:
// "  name error" for each, with the formula's error in brackets where it ran.
std::string expect_near_fp64(const std::vector<Fp64Check>& checks) {
  std::string line;
  for (const auto& c : checks) {
    const double err = rel_err(c.got, c.want);
    EXPECT_LE(err, c.bound) << c.name;
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %s %.1e", c.name.c_str(), err);
    line += buf;
    if (c.formula.defined()) {
      std::snprintf(buf, sizeof buf, " (%.1e)", rel_err(c.formula, c.want));
      line += buf;
    }
  }
  return line;
}

// fp32 on the GPU means fp32: no TF32 in matrix products while these tests run.
struct NoTf32 {
  NoTf32() { at::globalContext().setAllowTF32CuBLAS(false); }
};

enum class Family { Gla, DeltaRule, Mlstm };
struct OpCase {
  std::string name;
  Family family;
  int gate;  // 0 none, 1 fixed [H], 2 scalar [B,T,H], 3 vector [B,T,H,K]
};

std::vector<OpCase> op_cases() {
  return {{"linear_attention", Family::Gla, 0},  {"retnet", Family::Gla, 1},      {"gla_scalar", Family::Gla, 2},
          {"gla_vector", Family::Gla, 3},        {"deltanet", Family::DeltaRule, 0}, {"gated_deltanet", Family::DeltaRule, 2},
          {"kda", Family::DeltaRule, 3},         {"mlstm", Family::Mlstm, 0}};
}

struct OpInputs {
  torch::Tensor q, k, v, g, beta, h0, ig, fg;
  std::vector<torch::Tensor*> all() { return {&q, &k, &v, &g, &beta, &h0, &ig, &fg}; }
};

OpInputs random_inputs(const OpCase& c, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V) {
  OpInputs in;
  in.q = torch::randn({B, T, H, K});
  in.k = ops::l2_norm(torch::randn({B, T, H, K}));
  in.v = torch::randn({B, T, H, V});
  if (c.gate == 1) in.g = torch::log_sigmoid(torch::randn({H}) + 3);
  if (c.gate == 2) in.g = torch::log_sigmoid(torch::randn({B, T, H}) + 3);
  if (c.gate == 3) in.g = torch::log_sigmoid(torch::randn({B, T, H, K}) + 3) / 4;
  if (c.family == Family::DeltaRule) in.beta = torch::sigmoid(torch::randn({B, T, H}));
  if (c.family != Family::Mlstm) in.h0 = torch::randn({B, H, K, V}) * 0.1;
  in.ig = torch::randn({B, T, H});
  in.fg = torch::randn({B, T, H}) + 3;
  return in;
}

OpInputs to_device(OpInputs in, const torch::Device& dev, bool grad) {
  for (auto* t : in.all())
    if (t->defined()) *t = t->to(dev).detach().requires_grad_(grad);
  return in;
}

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

// ---- (a) chunked forms: CUDA vs CPU ---------------------------------------------------------------

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

// The fused path's results against the fp32 reference, each within 3e-2 relative error; returns a line
// "  name err (err of the libtorch form in the same dtype)" per result for the printed summary (the
// bracket left out where `plain` is empty).
std::string compare_fused(const std::vector<torch::Tensor>& ref, const std::vector<torch::Tensor>& fused,
                          const std::vector<torch::Tensor>& plain, const std::vector<std::string>& names) {
  std::string line;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(fused[i].defined()) << names[i] << " missing on the fused path";
    if (!fused[i].defined()) continue;
    const double e = rel_err(fused[i], ref[i]);
    EXPECT_LE(e, 3e-2) << names[i];
    char buf[64];
    if (plain.empty())
      std::snprintf(buf, sizeof buf, "  %s %.1e", names[i].c_str(), e);
    else
      std::snprintf(buf, sizeof buf, "  %s %.1e (%.1e)", names[i].c_str(), e, rel_err(plain[i], ref[i]));
    line += buf;
  }
  return line;
}

// The fused chunk kernels of family A (16-bit operands on tensor cores, fp32 state) against the libtorch
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

// The row norms' kernels (ops/cuda/row_norms.cu) through ops::rms_norm and ops::l2_norm: value and gradients
// against the formula in fp64 on the same inputs (printed beside the libtorch formula's errors in the same
// dtypes, where it runs), and the value bit for bit what the kernel gives when called directly (so the ops
// do take the kernels). Sizes: the mixers' heads (64, 100, 128), SmolLM2-135M's and -1.7B's hidden sizes,
// and two above the one-row-per-warp range (5000 asks for more than 48 KiB of shared memory in the
// backward; 8192 with 520 rows walks more rows than the grid has warps); and the RMS norm with the mixers'
// output gates (sigmoid, silu), whose gradient is checked too.
TEST(CudaOps, RowNormKernelsMatchFp64) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  struct Case {
    int64_t rows, D;
    torch::ScalarType x, w;
    bool rms;  // else the L2 norm (no weight)
    ops::Gate gate = ops::Gate::none;
  };
  const auto f32 = torch::kFloat, bf16 = torch::kBFloat16, f16 = torch::kHalf;
  const auto sigmoid = ops::Gate::sigmoid, silu = ops::Gate::silu;
  const double eps = 1e-5;
  for (const Case c : {Case{37, 64, f32, f32, true}, Case{9, 576, bf16, f32, true}, Case{13, 100, bf16, bf16, true},
                       Case{5, 2048, f16, f16, true}, Case{6, 64, f32, bf16, true}, Case{3, 5000, f32, f32, true},
                       Case{260, 8192, bf16, f32, true}, Case{37, 64, f32, f32, false},
                       Case{11, 128, bf16, bf16, false}, Case{7, 64, f16, f16, false},
                       Case{37, 64, f32, f32, true, silu}, Case{33, 128, bf16, f32, true, sigmoid},
                       Case{13, 100, bf16, bf16, true, silu}, Case{5, 64, f16, f16, true, sigmoid}}) {
    const auto y_dtype = c.rms ? at::promote_types(c.x, c.w) : c.x;
    const bool gated = c.gate != ops::Gate::none;
    const char* gate_name = c.gate == sigmoid ? " sigmoid" : c.gate == silu ? " silu" : "";
    SCOPED_TRACE(std::string(c.rms ? "rms" : "l2") + gate_name + " D=" + std::to_string(c.D) +
                 " x=" + c10::toString(c.x) + " w=" + c10::toString(c.w));
    torch::manual_seed(60 + c.D);
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    auto x = (torch::randn({2, c.rows, c.D}, f64) * 3 + 0.5).to(c.x);
    auto w = (torch::rand({c.D}, f64) + 0.5).to(c.w);
    auto dy = torch::randn({2, c.rows, c.D}, f64).to(y_dtype);
    auto gate = (torch::randn({2, c.rows, c.D}, f64) * 2).to(c.x);

    auto x64 = x.to(torch::kDouble).requires_grad_(true), w64 = w.to(torch::kDouble).requires_grad_(true);
    auto gate64 = gate.to(torch::kDouble).requires_grad_(true);
    auto squares = x64.pow(2);
    auto y64 = x64 * torch::rsqrt((c.rms ? squares.mean(-1, true) : squares.sum(-1, true)) + eps);
    if (c.rms) y64 = y64 * w64;
    if (c.gate == sigmoid) y64 = y64 * torch::sigmoid(gate64);
    if (c.gate == silu) y64 = y64 * torch::silu(gate64);
    y64.backward(dy.to(torch::kDouble));

    // The ops on the kernel device (fused or, with fused false, the libtorch formula): y, dx, dw, dgate.
    auto run = [&](bool fused) {
      ops::set_fused_kernels(fused);
      auto xd = x.to(dev).clone().requires_grad_(true), wd = w.to(dev).clone().requires_grad_(true);
      auto gd = gate.to(dev).clone().requires_grad_(true);
      auto y = c.rms ? ops::rms_norm(xd, wd, eps, gd, c.gate) : ops::l2_norm(xd, eps);
      y.backward(dy.to(dev));
      ops::set_fused_kernels(true);
      return std::make_tuple(y.detach(), xd.grad(), c.rms ? wd.grad() : torch::Tensor(),
                             gated ? gd.grad() : torch::Tensor());
    };
    const auto [y, dx, dw, dgate] = run(true);
    EXPECT_EQ(y.scalar_type(), y_dtype);
    EXPECT_EQ(dx.scalar_type(), c.x);
    auto direct = ops::cuda_kernels::row_norm_forward(
        x.to(dev).view({-1, c.D}), c.rms ? w.to(dev) : torch::Tensor(), c.rms ? 1.0 / static_cast<double>(c.D) : 1.0,
        eps, gated ? gate.to(dev).view({-1, c.D}) : torch::Tensor(), c.gate);
    EXPECT_TRUE(torch::equal(y.view({-1, c.D}), direct.y)) << "ops did not run the kernel";

    // Bounds by the least precise dtype taking part: y and dw carry the rounding of n to x's dtype.
    auto tol = [](torch::ScalarType t) { return t == torch::kFloat ? 1e-5 : t == torch::kHalf ? 2e-3 : 1e-2; };
    const double bound = c.rms ? std::max(tol(c.x), tol(c.w)) : tol(c.x);
    const bool plain = has_plain_form(kernels, c.x) && has_plain_form(kernels, c.w);
    torch::Tensor fy, fdx, fdw, fdgate;  // the formula's, where it runs
    if (plain) std::tie(fy, fdx, fdw, fdgate) = run(false);
    std::vector<Fp64Check> checks = {{"y", y, y64.detach(), fy, bound}, {"dx", dx, x64.grad(), fdx, bound}};
    if (c.rms) checks.push_back({"dw", dw, w64.grad(), fdw, bound});
    if (gated) checks.push_back({"dgate", dgate, gate64.grad(), fdgate, bound});
    const std::string line = expect_near_fp64(checks);
    std::printf("[cuda-row-norm] %s%s rows=%ld D=%ld x=%s w=%s:%s\n", c.rms ? "rms" : "l2", gate_name,
                static_cast<long>(2 * c.rows), static_cast<long>(c.D), c10::toString(c.x), c10::toString(c.w),
                line.c_str());
  }
#endif
}

// The SwiGLU kernels (ops/cuda/swiglu.cu) through ops::swiglu: value and gradients against the formula in
// fp64 (beside the libtorch formula's errors in the same dtype, where it runs), and the value bit for bit what
// the kernel gives when called directly. Shapes: whole 16-byte words (SmolLM2-135M's intermediate size), a
// size that is not (one element at a time), and inputs that start one element past a 16-byte boundary.
TEST(CudaOps, SwigluKernelMatchesFp64) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  struct Case {
    std::vector<int64_t> shape;
    torch::ScalarType dtype;
    bool offset;  // the inputs start one element into their storage
  };
  for (const Case& c : {Case{{3, 37, 64}, torch::kFloat, false}, Case{{2, 5, 1536}, torch::kBFloat16, false},
                       Case{{4, 100}, torch::kHalf, false}, Case{{3, 7, 13}, torch::kBFloat16, false},
                       Case{{6, 64}, torch::kBFloat16, true}, Case{{5, 48}, torch::kFloat, true}}) {
    SCOPED_TRACE(std::string(c10::toString(c.dtype)) + (c.offset ? " offset" : ""));
    torch::manual_seed(80 + c.shape.back());
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    auto make = [&](double scale) {
      int64_t n = 1;
      for (const int64_t d : c.shape) n *= d;
      auto t = (torch::randn({n + 1}, f64) * scale).to(c.dtype).to(dev);
      return (c.offset ? t.narrow(0, 1, n) : t.narrow(0, 0, n)).view(c.shape);
    };
    auto gate = make(3), up = make(1), dz = make(1);
    ASSERT_TRUE(gate.is_contiguous());
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(gate.data_ptr()) % 16 != 0, c.offset);

    auto g64 = gate.cpu().to(torch::kDouble).requires_grad_(true);
    auto u64 = up.cpu().to(torch::kDouble).requires_grad_(true);
    (torch::silu(g64) * u64).backward(dz.cpu().to(torch::kDouble));

    auto run = [&](bool fused) {
      ops::set_fused_kernels(fused);
      auto gv = gate.detach().requires_grad_(true), uv = up.detach().requires_grad_(true);  // at their offset
      auto z = ops::swiglu(gv, uv);
      z.backward(dz);
      ops::set_fused_kernels(true);
      return std::make_tuple(z.detach(), gv.grad(), uv.grad());
    };
    const auto [z, dg, du] = run(true);
    EXPECT_EQ(z.scalar_type(), c.dtype);
    EXPECT_TRUE(torch::equal(z, ops::cuda_kernels::swiglu_forward(gate, up))) << "ops did not run the kernel";
    const double bound = c.dtype == torch::kFloat ? 1e-5 : c.dtype == torch::kHalf ? 2e-3 : 1e-2;
    torch::Tensor fz, fdg, fdu;  // the formula's, where it runs
    if (has_plain_form(kernels, c.dtype)) std::tie(fz, fdg, fdu) = run(false);
    const std::string line = expect_near_fp64({{"z", z, (torch::silu(g64) * u64).detach(), fz, bound},
                                               {"dgate", dg, g64.grad(), fdg, bound},
                                               {"dup", du, u64.grad(), fdu, bound}});
    std::printf("[cuda-swiglu] %s n=%ld%s:%s\n", c10::toString(c.dtype), static_cast<long>(gate.numel()),
                c.offset ? " offset" : "", line.c_str());
  }
#endif
}

// The stage-3 loss kernels (ops/cuda/distill_loss.cu) through ops::distill_loss_terms: the per-token CE and KL
// and the gradient of Σ dce ce + dkl kl in the student's logits against the formula in fp64 (beside the libtorch
// formula's errors in the same dtype, where it runs), and the terms bit for bit what the kernel gives when called
// directly; then the cross-entropy alone (ops::cross_entropy_terms, the same kernels without a teacher).
// Cases: rows of whole 16-byte words and not, a row start off a 16-byte boundary, temperatures 1 and not, a
// target ignored (-100) and the last word's.
TEST(CudaOps, DistillLossKernelsMatchFp64) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  struct Case {
    int64_t N, V;
    torch::ScalarType dtype;
    double T;
    bool offset;  // the logits start one element into their storage
  };
  for (const Case& c : {Case{37, 1000, torch::kFloat, 1.0, false}, Case{20, 4104, torch::kBFloat16, 2.0, false},
                       Case{9, 77, torch::kHalf, 1.5, false}, Case{6, 64, torch::kBFloat16, 1.0, true},
                       Case{5, 300, torch::kFloat, 0.5, true}}) {
    SCOPED_TRACE(std::string(c10::toString(c.dtype)) + " V=" + std::to_string(c.V) + (c.offset ? " offset" : ""));
    torch::manual_seed(90 + c.V);
    auto make = [&](double scale) {
      auto x = (torch::randn({c.N * c.V + 1}, torch::kDouble) * scale).to(c.dtype).to(dev);
      return (c.offset ? x.narrow(0, 1, c.N * c.V) : x.narrow(0, 0, c.N * c.V)).view({c.N, c.V});
    };
    auto s = make(3), t = make(3) + 0.5 * s;  // related, as a student's and its teacher's
    auto y = torch::randint(0, c.V, {c.N}, torch::kLong);
    y[1] = -100, y[2] = c.V - 1;
    y = y.to(dev);
    auto dce = torch::rand({c.N}).to(dev), dkl = torch::rand({c.N}).to(dev);

    // fp64: ce = lse(s) - s[y] (0 where ignored), kl = Σ p_t (log p_t - log p_s) at T.
    auto s64 = s.cpu().to(torch::kDouble).requires_grad_(true), t64 = t.cpu().to(torch::kDouble);
    auto y64 = y.cpu();
    auto valid = y64.ge(0);
    auto ce64 = torch::where(valid, s64.logsumexp(-1) - s64.gather(1, y64.clamp_min(0).unsqueeze(1)).squeeze(1),
                             torch::zeros({c.N}, torch::kDouble));
    auto lp_s = torch::log_softmax(s64 / c.T, -1), lp_t = torch::log_softmax(t64 / c.T, -1);
    auto kl64 = (lp_t.exp() * (lp_t - lp_s)).sum(-1);
    torch::autograd::backward({ce64, kl64}, {dce.cpu().to(torch::kDouble), dkl.cpu().to(torch::kDouble)});

    auto run = [&](bool fused) {
      ops::set_fused_kernels(fused);
      auto sv = s.detach().requires_grad_(true);  // at its offset
      auto r = ops::distill_loss_terms(sv, t, y, c.T);
      torch::autograd::backward({r.ce, r.kl}, {dce, dkl});
      ops::set_fused_kernels(true);
      return std::make_tuple(r.ce.detach(), r.kl.detach(), sv.grad());
    };
    const auto [ce, kl, ds] = run(true);
    EXPECT_EQ(ds.scalar_type(), c.dtype);
    EXPECT_TRUE(torch::equal(ce, ops::cuda_kernels::distill_loss_forward(s.contiguous(), t, y, c.T).ce))
        << "ops did not run the kernel";
    EXPECT_EQ(ce[1].item<float>(), 0.f) << "the ignored target's term";
    const double bound = c.dtype == torch::kFloat ? 1e-5 : c.dtype == torch::kHalf ? 2e-3 : 1e-2;
    torch::Tensor fce, fkl, fds;  // the formula's, where it runs
    if (has_plain_form(kernels, c.dtype)) std::tie(fce, fkl, fds) = run(false);
    // The terms are fp32 sums of the logits as given (exact in fp32 whatever their dtype): fp32's bound.
    const std::string line = expect_near_fp64({{"ce", ce, ce64.detach(), fce, 1e-5},
                                               {"kl", kl, kl64.detach(), fkl, 1e-5},
                                               {"ds", ds, s64.grad(), fds, bound}});
    std::printf("[cuda-distill-loss] %s N=%ld V=%ld T=%.1f%s:%s\n", c10::toString(c.dtype), static_cast<long>(c.N),
                static_cast<long>(c.V), c.T, c.offset ? " offset" : "", line.c_str());

    // The cross-entropy alone (no teacher: next-token training), kernel against fp64.
    auto s64c = s.cpu().to(torch::kDouble).requires_grad_(true);
    auto ce64c = torch::where(valid, s64c.logsumexp(-1) - s64c.gather(1, y64.clamp_min(0).unsqueeze(1)).squeeze(1),
                              torch::zeros({c.N}, torch::kDouble));
    ce64c.backward(dce.cpu().to(torch::kDouble));
    auto sc = s.detach().requires_grad_(true);
    auto ce_only = ops::cross_entropy_terms(sc, y);
    ce_only.backward(dce);
    EXPECT_TRUE(torch::equal(ce_only.detach(), ops::cuda_kernels::distill_loss_forward(s.contiguous(), {}, y, 1.0).ce))
        << "ops did not run the kernel";
    const std::string ce_line = expect_near_fp64({{"ce", ce_only.detach(), ce64c.detach(), {}, 1e-5},
                                                  {"ds", sc.grad(), s64c.grad(), {}, bound}});
    std::printf("[cuda-cross-entropy] %s N=%ld V=%ld%s:%s\n", c10::toString(c.dtype), static_cast<long>(c.N),
                static_cast<long>(c.V), c.offset ? " offset" : "", ce_line.c_str());
  }
#endif
}

// The short-convolution kernels (ops/cuda/short_conv.cu) through ops::short_conv: y, the cache and the
// gradients of x, the weight and the bias against the formula in fp64 (with the weight and bias rounded to
// x's dtype, as the formula takes them), beside the libtorch formula's errors in the same dtypes where it
// runs. Cases: a training sequence (several segments, channels past a whole block), a decode step and a
// prefill shorter than the state, each width the kernels take, with and without bias, prefix and silu.
TEST(CudaOps, ShortConvKernelsMatchFp64) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  struct Case {
    int64_t B, T, C, W;
    torch::ScalarType x, w;
    bool bias, prefix, silu;
  };
  const auto f32 = torch::kFloat, bf16 = torch::kBFloat16, f16 = torch::kHalf;
  for (const Case c :
       {Case{2, 70, 200, 4, bf16, f32, false, false, true}, Case{3, 33, 64, 3, f32, f32, true, true, true},
        Case{2, 1, 130, 4, bf16, bf16, false, true, true}, Case{2, 2, 96, 4, f16, f16, true, true, false},
        Case{1, 65, 128, 2, f32, f32, false, true, false}, Case{4, 40, 64, 4, bf16, f32, true, false, true}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) + " W=" + std::to_string(c.W) + " x=" +
                 c10::toString(c.x) + " w=" + c10::toString(c.w));
    torch::manual_seed(90 + c.T);
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    auto x = torch::randn({c.B, c.T, c.C}, f64).to(c.x);
    auto w = (torch::randn({c.C, 1, c.W}, f64) * 0.5).to(c.w);
    auto bias = c.bias ? (torch::randn({c.C}, f64) * 0.1).to(c.w) : torch::Tensor();
    auto prefix = c.prefix ? torch::randn({c.B, c.C, c.W - 1}, f64).to(c.x) : torch::Tensor();
    auto dy = torch::randn({c.B, c.T, c.C}, f64).to(c.x);

    // fp64 reference, the weight and bias in x's dtype as the formula casts them.
    auto x64 = x.to(torch::kDouble).requires_grad_(true);
    auto w64 = w.to(c.x).to(torch::kDouble).requires_grad_(true);
    auto b64 = c.bias ? bias.to(c.x).to(torch::kDouble).requires_grad_(true) : torch::Tensor();
    auto before = c.prefix ? prefix.to(torch::kDouble) : torch::zeros({c.B, c.C, c.W - 1}, f64);
    auto full = torch::cat({before, x64.transpose(1, 2)}, 2);
    const std::vector<int64_t> one{1}, zero{0};
    auto y64 = torch::conv1d(full, w64, b64, one, zero, one, c.C).transpose(1, 2);
    if (c.silu) y64 = torch::silu(y64);
    y64.backward(dy.to(torch::kDouble));
    const auto cache_want = full.narrow(2, c.T, c.W - 1).detach();

    auto run = [&](bool fused) {
      ops::set_fused_kernels(fused);
      auto xd = x.to(dev).clone().requires_grad_(true), wd = w.to(dev).clone().requires_grad_(true);
      auto bd = c.bias ? bias.to(dev).clone().requires_grad_(true) : torch::Tensor();
      auto r = ops::short_conv(xd, wd, bd, c.prefix ? prefix.to(dev) : torch::Tensor(), c.silu, true);
      r.y.backward(dy.to(dev));
      ops::set_fused_kernels(true);
      const auto db = c.bias ? bd.grad() : torch::Tensor();
      return std::vector<torch::Tensor>{r.y.detach(), r.cache, xd.grad(), wd.grad(), db};
    };
    const auto got = run(true);
    EXPECT_EQ(got[0].scalar_type(), c.x);
    EXPECT_EQ(got[1].scalar_type(), c.x);
    EXPECT_TRUE(torch::equal(got[1].cpu().to(torch::kDouble), cache_want)) << "the cache: x's last W-1 steps";
    auto direct = ops::cuda_kernels::short_conv_forward(
        x.to(dev), w.to(dev).view({c.C, c.W}), c.bias ? bias.to(dev) : torch::Tensor(),
        c.prefix ? prefix.to(dev) : torch::Tensor(), c.silu, false);
    EXPECT_TRUE(torch::equal(got[0], direct.y)) << "ops did not run the kernel";

    auto tol = [](torch::ScalarType t) { return t == torch::kFloat ? 1e-5 : t == torch::kHalf ? 2e-3 : 1e-2; };
    const double bound = std::max(tol(c.x), tol(c.w));
    const bool plain = has_plain_form(kernels, c.x) && has_plain_form(kernels, c.w);
    const auto formula = plain ? run(false) : std::vector<torch::Tensor>(5);
    std::vector<Fp64Check> checks = {{"y", got[0], y64.detach(), formula[0], bound},
                                     {"dx", got[2], x64.grad(), formula[2], bound},
                                     {"dw", got[3], w64.grad(), formula[3], bound}};
    if (c.bias) checks.push_back({"dbias", got[4], b64.grad(), formula[4], bound});
    const std::string line = expect_near_fp64(checks);
    std::printf("[cuda-short-conv] B=%ld T=%ld C=%ld W=%ld x=%s w=%s%s%s%s:%s\n", static_cast<long>(c.B),
                static_cast<long>(c.T), static_cast<long>(c.C), static_cast<long>(c.W), c10::toString(c.x),
                c10::toString(c.w), c.bias ? " bias" : "", c.prefix ? " prefix" : "", c.silu ? " silu" : "",
                line.c_str());
  }
#endif
}

// The decay gate's kernels (ops/cuda/softplus_decay.cu) through ops::softplus_decay: g and the gradients of
// f, dt_bias and A_log against the formula in fp64 (beside the libtorch formula's errors where it runs).
// Cases: KDA's (a decay per key channel) and Gated DeltaNet's (one a head) shapes, over several row blocks,
// with f beyond softplus's threshold of 20 in places, and the parameters in fp32 or in f's 16-bit dtype.
TEST(CudaOps, SoftplusDecayKernelsMatchFp64) {
  REQUIRE_KERNELS();
#ifdef LINEARIZE_WITH_KERNELS
  struct Case {
    int64_t B, T, H, K;
    torch::ScalarType f, params;
  };
  const auto f32 = torch::kFloat, bf16 = torch::kBFloat16, f16 = torch::kHalf;
  for (const Case c : {Case{2, 37, 4, 64, bf16, f32}, Case{3, 70, 6, 1, f32, f32}, Case{1, 150, 3, 32, f32, f32},
                       Case{2, 5, 2, 64, f16, f16}, Case{2, 9, 4, 16, bf16, bf16}}) {
    SCOPED_TRACE("H=" + std::to_string(c.H) + " K=" + std::to_string(c.K) + " f=" + c10::toString(c.f) +
                 " params=" + c10::toString(c.params));
    torch::manual_seed(100 + c.K);
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    const int64_t C = c.H * c.K;
    auto f = (torch::randn({c.B, c.T, C}, f64) * 4).to(c.f);
    f.view({-1}).narrow(0, 0, 3).fill_(25.0);  // past softplus's threshold
    auto dt_bias = mixers::dt_bias_init(C).to(c.params);
    auto A_log = torch::log(1 + torch::rand({c.H}, f64) * 15).to(c.params);
    auto dg = torch::randn({c.B, c.T, C}, f64).to(torch::kFloat);

    auto f64v = f.to(torch::kDouble).requires_grad_(true), b64 = dt_bias.to(torch::kDouble).requires_grad_(true);
    auto a64 = A_log.to(torch::kDouble).requires_grad_(true);
    auto g64 = -a64.exp().view({c.H, 1}) * torch::softplus((f64v + b64).view({c.B, c.T, c.H, c.K}));
    g64 = g64.view({c.B, c.T, C});
    g64.backward(dg.to(torch::kDouble));

    auto run = [&](bool fused) {
      ops::set_fused_kernels(fused);
      auto fd = f.to(dev).clone().requires_grad_(true), bd = dt_bias.to(dev).clone().requires_grad_(true);
      auto ad = A_log.to(dev).clone().requires_grad_(true);
      auto g = ops::softplus_decay(fd, bd, ad);
      g.backward(dg.to(dev));
      ops::set_fused_kernels(true);
      return std::vector<torch::Tensor>{g.detach(), fd.grad(), bd.grad(), ad.grad()};
    };
    const auto got = run(true);
    EXPECT_EQ(got[0].scalar_type(), torch::kFloat);
    EXPECT_EQ(got[1].scalar_type(), c.f);
    EXPECT_TRUE(torch::equal(got[0].view({-1, C}), ops::cuda_kernels::softplus_decay_forward(
                                                       f.to(dev).view({-1, C}), dt_bias.to(dev), A_log.to(dev))))
        << "ops did not run the kernel";
    auto tol = [](torch::ScalarType t) { return t == torch::kFloat ? 1e-5 : t == torch::kHalf ? 2e-3 : 1e-2; };
    const bool plain = has_plain_form(kernels, c.f) && has_plain_form(kernels, c.params);
    const auto formula = plain ? run(false) : std::vector<torch::Tensor>(4);
    const std::string line = expect_near_fp64({{"g", got[0], g64.detach(), formula[0], 1e-5},
                                               {"df", got[1], f64v.grad(), formula[1], tol(c.f)},
                                               {"d_dt_bias", got[2], b64.grad(), formula[2], tol(c.params)},
                                               {"dA_log", got[3], a64.grad(), formula[3], tol(c.params)}});
    std::printf("[cuda-softplus-decay] rows=%ld H=%ld K=%ld f=%s params=%s:%s\n", static_cast<long>(c.B * c.T),
                static_cast<long>(c.H), static_cast<long>(c.K), c10::toString(c.f), c10::toString(c.params),
                line.c_str());
  }
#endif
}

// ---- (b) the fused decode step ---------------------------------------------------------------------

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
    const double e_o = rel_err(fused.o, ref.o), e_s = rel_err(fused.state, ref.state);
    EXPECT_LE(e_o, 1e-5);
    EXPECT_LE(e_s, 1e-5);
    std::printf("[cuda-grouped-step] %-18s o %.1e  state %.1e\n", name.c_str(), e_o, e_s);
  }
  EXPECT_THROW(ops::gla_recurrent(q, k.narrow(2, 0, 1).expand({B, 1, 4, K}), v, {}, h0, 0.125), Error)
      << "Hkv must divide H and match v's heads";
}

// ---- (c) mixers on CUDA ----------------------------------------------------------------------------

// Every mixer's layer (head size 64) trained as the trainer runs it, under bf16 autocast, takes the fused
// chunk kernels; its output and every parameter gradient must match the same layer run in fp32 (no
// autocast, libtorch chunked form) within 3e-2, or within 1.5 times the error of the libtorch chunked
// form under the same autocast where that is larger. Where even that form misses a gradient by more
// than 30%, the fp32 gradient is smaller than the 16-bit round-off of the layer (the mLSTM's input gate:
// a shift of all its pre-activations changes nothing once the normaliser dominates, and the head norm
// takes out the scale), and the error is measured against the largest parameter gradient instead.
TEST(CudaMixers, FusedChunkUnderAutocastMatchesLibtorch) {
  REQUIRE_CUDA();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 150;
  for (const std::string kind : {"linear_attention", "retnet", "gla", "deltanet", "gated_deltanet", "kda", "mlstm"}) {
    SCOPED_TRACE(kind);
    torch::manual_seed(5);
    MixerConfig cfg = MixerConfig::defaults_for(kind);
    cfg.hidden_size = 256;
    cfg.num_heads = 4;
    cfg.chunk_size = 64;
    auto m = make_mixer(cfg);
    m->to(torch::kCUDA);
    auto x = torch::randn({B, T, cfg.hidden_size}, torch::kCUDA);
    auto w = torch::randn({B, T, cfg.hidden_size}, torch::kCUDA);
    auto run = [&](bool fused, bool autocast_on) {
      ops::set_fused_kernels(fused);
      m->zero_grad();
      torch::Tensor y;
      {
        compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, autocast_on);
        y = m->forward(x, nullptr);
      }
      (y.to(torch::kFloat) * w).sum().backward();
      ops::set_fused_kernels(true);
      std::vector<torch::Tensor> out = {y.detach().to(torch::kFloat)};
      for (const auto& p : m->parameters())
        if (p.grad().defined()) out.push_back(p.grad().clone());
      return out;
    };
    auto ref = run(false, false), fused = run(true, true), plain = run(false, true);
    ASSERT_EQ(fused.size(), ref.size());
    ASSERT_EQ(plain.size(), ref.size());
    ASSERT_GT(fused.size(), 2u) << "parameters should receive gradients";
    double largest = 0;
    for (size_t i = 1; i < ref.size(); ++i) largest = std::max(largest, ref[i].norm().item<double>());
    double e_y = rel_err(fused[0], ref[0]), e_grad = 0, e_plain = 0;
    int round_off_bound = 0;
    for (size_t i = 1; i < fused.size(); ++i) {
      const double e = rel_err(fused[i], ref[i]), e_p = rel_err(plain[i], ref[i]);
      if (e_p > 0.3) {
        const double e_abs = (fused[i] - ref[i]).norm().item<double>() / largest;
        EXPECT_LE(e_abs, 3e-2) << "parameter gradient " << i << " against the largest gradient";
        std::printf("[cuda-mixer-fused] %s parameter %zu: libtorch bf16 misses by %.1e, fused by %.1e; against the "
                    "largest gradient %.1e\n", kind.c_str(), i, e_p, e, e_abs);
        ++round_off_bound;
        continue;
      }
      EXPECT_LE(e, std::max(3e-2, 1.5 * e_p)) << "parameter gradient " << i;
      e_grad = std::max(e_grad, e), e_plain = std::max(e_plain, e_p);
    }
    EXPECT_LE(round_off_bound, 2) << "most gradients should be well above round-off";
    EXPECT_LE(e_y, 3e-2);
    // Two different computations: bit-identical outputs would mean the kernels were not taken.
    EXPECT_GT(rel_err(fused[0], plain[0]), 0.0) << "the fused kernels did not run";
    std::printf("[cuda-mixer-fused] %-18s against fp32: output %.1e (libtorch bf16 %.1e)  worst parameter grad %.1e "
                "(libtorch bf16 %.1e; %zu tensors)\n",
                kind.c_str(), e_y, rel_err(plain[0], ref[0]), e_grad, e_plain, fused.size() - 1);
  }
}

TEST(CudaMixers, DecodeMatchesForwardAndCpu) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  at::globalContext().setAllowTF32CuDNN(false);  // short convolutions
  const int64_t B = 2, T = 40;
  for (const auto& kind : mixer_kinds()) {
    SCOPED_TRACE(kind);
    torch::manual_seed(2);
    MixerConfig cfg = MixerConfig::defaults_for(kind);
    cfg.hidden_size = 64;
    cfg.num_heads = 4;
    cfg.chunk_size = 16;
    auto m = make_mixer(cfg);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.2);
    }
    torch::NoGradGuard no_grad;
    auto x = torch::randn({B, T, cfg.hidden_size});
    torch::Tensor full_cpu;
    {
      test::EmulationScope cpu_forms(false);
      full_cpu = m->forward(x, nullptr);
    }
    m->to(dev);
    auto xg = x.to(dev);
    auto full = m->forward(xg, nullptr);
    LayerState s;
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < T; ++t) ys.push_back(m->forward(xg.narrow(1, t, 1), &s));
    const double e_cpu = rel_err(full, full_cpu), e_decode = rel_err(torch::cat(ys, 1), full);
    EXPECT_LE(e_cpu, 1e-4);
    EXPECT_LE(e_decode, 1e-4);
    std::printf("[cuda-mixer] %-18s forward vs CPU %.1e  decode vs forward %.1e\n", kind.c_str(), e_cpu, e_decode);
  }
}

// ---- (d) bf16 autocast training step --------------------------------------------------------------

TEST(CudaTrain, Bf16AutocastStage3KeepsFp32WeightsAndLearns) {
  REQUIRE_CUDA();
  const auto c = test::small_llama(300, 128, 2, 4, 2, 256);
  torch::manual_seed(3);
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.05);
  teacher->to(torch::kCUDA, torch::kBFloat16);
  teacher->eval();
  auto student = build_student(teacher, StudentSpec::make("gated_deltanet", "default", {}, c));
  student->to(torch::kFloat);
  student->train();
  DistillOptions o;
  auto batch = torch::randint(0, c.vocab_size, {4, 65}, torch::TensorOptions().dtype(torch::kLong)).to(torch::kCUDA);
  auto x = batch.narrow(1, 0, 64), y = batch.narrow(1, 1, 64);
  torch::optim::AdamW opt(student->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      torch::Tensor t_logits;
      {
        torch::NoGradGuard no_grad;
        t_logits = teacher->forward(x);
      }
      auto s_logits = student->forward(x);
      if (step == 0) {
        EXPECT_EQ(s_logits.scalar_type(), torch::kBFloat16) << "autocast should run matmuls in bf16";
      }
      loss = stage3_loss(o, s_logits, t_logits, y);
    }
    loss.backward();
    losses.push_back(loss.item<double>());
    ASSERT_TRUE(std::isfinite(losses.back())) << "step " << step;
    opt.step();
  }
  for (auto& p : student->named_parameters()) {
    ASSERT_EQ(p.value().scalar_type(), torch::kFloat) << p.key();
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    ASSERT_EQ(p.value().grad().scalar_type(), torch::kFloat) << p.key();
  }
  std::printf("[cuda-train] stage-3 loss %.4f -> %.4f over 8 steps on one batch\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.9 * losses.front());
}

// ---- (e) CUDA-graph decode ------------------------------------------------------------------------

TEST(CudaDecode, GraphedStepMatchesEagerStep) {
  REQUIRE_CUDA();
  NoTf32 no_tf32;
  at::globalContext().setAllowTF32CuDNN(false);
  const auto c = test::small_llama(200, 64, 2, 4, 2, 128);
  torch::manual_seed(5);
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.1);
  teacher->to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  const int64_t B = 3;
  auto prompt = torch::randint(0, c.vocab_size, {B, 10}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  ModelState teacher_state = teacher->new_state();
  teacher->forward(prompt, &teacher_state);
  EXPECT_FALSE(GraphedDecodeStep::usable(teacher, teacher_state)) << "the teacher's KV cache grows";
  for (const auto& kind : mixer_kinds()) {
    SCOPED_TRACE(kind);
    auto student = build_student(teacher, StudentSpec::make(kind, "default", {}, c));
    student->eval();
    ModelState eager = student->new_state();
    student->forward(prompt, &eager);
    std::string why;
    if (!GraphedDecodeStep::usable(student, eager, &why)) {
      EXPECT_EQ(kind, "retnet") << why;
      continue;
    }
    GraphedDecodeStep graph(student, eager, B);
    double worst = 0;
    auto ids = prompt.narrow(1, 9, 1);
    for (int step = 0; step < 6; ++step) {
      auto want = student->forward(ids, &eager);
      auto got = graph.step(ids).clone();
      worst = std::max(worst, rel_err(got, want));
      ids = want.argmax(-1);
    }
    EXPECT_LE(worst, 1e-5);
    const auto final_state = graph.state();
    double worst_state = 0;
    for (size_t l = 0; l < eager.size(); ++l) {
      EXPECT_EQ(final_state[l].position, eager[l].position);
      for (const auto& [name, t] : eager[l].tensors) worst_state = std::max(worst_state, rel_err(final_state[l].get(name), t));
    }
    EXPECT_LE(worst_state, 1e-5);
    std::printf("[cuda-graph] %-18s logits %.1e  state %.1e over 6 steps\n", kind.c_str(), worst, worst_state);
  }
}

}  // namespace
}  // namespace linearize
