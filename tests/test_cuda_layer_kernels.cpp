// The kernels of the layers around the mixers, each through its op against the formula in fp64 and checked
// to be what the op runs: the row norms (RMS with its output gates, L2), SwiGLU, the stage-3 distillation
// loss and cross-entropy, the short convolution and the softplus decay gate. Without a GPU these run the
// kernels on the CPU build's emulator (cuda_test_util.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "model/mixers/blocks.h"
#include "ops/ops.h"
#include "test_util.h"

#ifdef LINEARIZE_WITH_KERNELS
#include "ops/cuda/distill_loss.h"
#include "ops/cuda/row_norms.h"
#include "ops/cuda/short_conv.h"
#include "ops/cuda/softplus_decay.h"
#include "ops/cuda/swiglu.h"
#endif

namespace linearize {
namespace {

using cuda_test::has_plain_form;
using test::rel_err;

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
    {  // x and the gate as heads of wider rows ([2, 1, rows, D] slices, as a packed product's) are read in place
      const int64_t n = c.rows * c.D;
      auto widen = [&](const torch::Tensor& t) {
        auto wide = torch::zeros({2, 1, n + 7}, t.options()).to(dev);
        wide.narrow(2, 3, n).copy_(t.to(dev).view({2, 1, n}));
        return wide;
      };
      auto heads = [&](const torch::Tensor& wide) { return wide.narrow(2, 3, n).view({2, 1, c.rows, c.D}); };
      auto wx = widen(x), wg = widen(gate);
      ASSERT_FALSE(heads(wx).is_contiguous());
      {
        torch::NoGradGuard no_grad;  // decoding: no copy
        auto ys = c.rms ? ops::rms_norm(heads(wx), w.to(dev), eps, heads(wg), c.gate) : ops::l2_norm(heads(wx), eps);
        EXPECT_TRUE(torch::equal(ys.reshape({-1, c.D}), direct.y)) << "y from strided rows";
      }
      // The kernels' backward reads such rows too: the same gradients as from contiguous rows.
      const double mean_scale = c.rms ? 1.0 / static_cast<double>(c.D) : 1.0;
      const auto wd = c.rms ? w.to(dev) : torch::Tensor();
      const auto dy2 = dy.to(dev).view({-1, c.D});
      auto from_rows = ops::cuda_kernels::row_norm_backward(heads(wx).view({2, c.rows, c.D}), wd, direct.rstd, dy2,
                                                            mean_scale, c.rms, gated ? heads(wg).view({2, c.rows, c.D})
                                                                                     : torch::Tensor(), c.gate);
      auto from_copy = ops::cuda_kernels::row_norm_backward(x.to(dev).view({-1, c.D}), wd, direct.rstd, dy2, mean_scale,
                                                            c.rms, gated ? gate.to(dev).view({-1, c.D}) : torch::Tensor(),
                                                            c.gate);
      EXPECT_TRUE(torch::equal(from_rows.dx, from_copy.dx)) << "dx from strided rows";
      if (c.rms) {
        EXPECT_TRUE(torch::equal(from_rows.dw, from_copy.dw)) << "dw from strided rows";
      }
      if (gated) {
        EXPECT_TRUE(torch::equal(from_rows.dgate, from_copy.dgate)) << "dgate from strided rows";
      }
    }
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
    {  // gate and up as the halves of one packed product's rows, without gradients: read in place, one launch
      torch::NoGradGuard no_grad;
      const int64_t I = c.shape.back();
      auto both = torch::cat({gate, up}, -1);
      auto gate_half = both.narrow(-1, 0, I), up_half = both.narrow(-1, I, I);
      ASSERT_FALSE(gate_half.is_contiguous());
      EXPECT_EQ(ops::cuda_kernels::swiglu_row_stride(up_half), 2 * I);
      EXPECT_TRUE(torch::equal(ops::cuda_kernels::swiglu_rows_forward(gate_half, up_half), z));
      EXPECT_TRUE(torch::equal(ops::swiglu(gate_half, up_half), z)) << "the halves of a packed product";
      EXPECT_EQ(ops::cuda_kernels::swiglu_row_stride(gate.transpose(0, 1)), -1) << "rows that do not fold";
    }
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
    {  // x as a slice of wider rows (a packed product's output) is read in place, with the same results
      auto wide = torch::randn({c.B, c.T, c.C + 9}, f64).to(c.x).to(dev);
      auto slice = wide.narrow(2, 5, c.C);
      slice.copy_(x.to(dev));
      ASSERT_FALSE(slice.is_contiguous());
      auto wd = w.to(dev).view({c.C, c.W});
      auto bd = c.bias ? bias.to(dev) : torch::Tensor();
      auto pd = c.prefix ? prefix.to(dev) : torch::Tensor();
      auto strided = ops::cuda_kernels::short_conv_forward(slice, wd, bd, pd, c.silu, true);
      EXPECT_TRUE(torch::equal(strided.y, direct.y)) << "y from a strided x";
      EXPECT_TRUE(torch::equal(strided.cache.cpu().to(torch::kDouble), cache_want)) << "the cache from a strided x";
      auto dyd = dy.to(dev);
      auto from_slice = ops::cuda_kernels::short_conv_backward(slice, wd, bd, pd, dyd, c.silu);
      auto from_copy = ops::cuda_kernels::short_conv_backward(x.to(dev), wd, bd, pd, dyd, c.silu);
      EXPECT_TRUE(torch::equal(from_slice.dx, from_copy.dx)) << "dx from a strided x";
      EXPECT_TRUE(torch::equal(from_slice.dw, from_copy.dw)) << "dw from a strided x";
    }

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

// A residual connection and the norm after it in one kernel (ops::add_rms_norm, the decoder layers' h = x + a
// and its post-attention norm when decoding): bit for bit the addition in x's dtype followed by the norm
// kernel, in fp32 and bf16 with a weight of either; within round-off of the libtorch formula; and, where a
// gradient is wanted, the plain addition and rms_norm, so that training keeps its graph.
TEST(CudaOps, AddRmsNormMatchesAddThenNorm) {
  REQUIRE_KERNELS();
  torch::manual_seed(29);
  const int64_t D = 96;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16})
    for (const auto w_dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " weight " + c10::toString(w_dtype));
      const auto opts = torch::TensorOptions().device(dev);
      const auto x = torch::randn({2, 3, D}, opts).to(dtype), r = torch::randn({2, 3, D}, opts).to(dtype);
      const auto w = (torch::rand({D}, opts) + 0.5).to(w_dtype);
      torch::NoGradGuard no_grad;
      const auto got = ops::add_rms_norm(x, r, w, 1e-5);
      const auto sum = x + r;
      EXPECT_TRUE(torch::equal(got.sum, sum));
      EXPECT_TRUE(torch::equal(got.normed, ops::rms_norm(sum, w, 1e-5))) << "the norm kernel on the sum";
      ops::set_fused_kernels(false);
      const auto plain = ops::rms_norm(sum, w, 1e-5);
      ops::set_fused_kernels(true);
      EXPECT_EQ(got.normed.scalar_type(), plain.scalar_type());
      EXPECT_LE(rel_err(got.normed, plain), plain.scalar_type() == torch::kFloat ? 1e-6 : 1e-2);
    }
  const auto x = torch::randn({4, D}, torch::TensorOptions().device(dev).requires_grad(true));
  const auto w = torch::ones({D}, torch::TensorOptions().device(dev));
  const auto r = ops::add_rms_norm(x, torch::randn({4, D}, torch::TensorOptions().device(dev)), w, 1e-5);
  ASSERT_TRUE(r.normed.requires_grad()) << "with a gradient wanted, the differentiable ops";
  r.normed.sum().backward();
  EXPECT_TRUE(x.grad().defined());
}

}  // namespace
}  // namespace linearize
