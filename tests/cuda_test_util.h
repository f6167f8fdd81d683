// Helpers shared by the CUDA tests (tests/test_cuda_*.cpp, suites named Cuda*, ctest label `cuda`): where a
// kernel test runs, random inputs for the chunked op families and the check of a fused 16-bit path against
// fp32. Kernel tests run on the GPU, or without one on the CPU build's SIMT emulator
// (ops/cuda/emulation/simt.h) so that CI checks the kernels' arithmetic too; the rest skip without a GPU.
// The CUDA golden checks of the op families (also emulated) and the Llama teacher sit with their CPU twins
// (test_ops.cpp, test_llama.cpp).
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"
#include "test_util.h"

namespace linearize::cuda_test {

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
#define REQUIRE_KERNELS()                                                          \
  ::linearize::cuda_test::KernelDevice kernels;                                    \
  if (!kernels.available())                                                        \
    GTEST_SKIP() << "skipped: neither CUDA nor the kernel emulator in this build"; \
  const torch::Device dev = kernels.device
// Whether the libtorch form runs in dtype dt where the kernels do, to print its error beside theirs for
// scale: not in fp16 on the CPU (libtorch 1.13 has no fp16 products there), under the emulator.
inline bool has_plain_form(const KernelDevice& kernels, torch::ScalarType dt) {
  return kernels.gpu || dt != torch::kHalf;
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

inline std::vector<OpCase> op_cases() {
  return {{"linear_attention", Family::Gla, 0},  {"retnet", Family::Gla, 1},      {"gla_scalar", Family::Gla, 2},
          {"gla_vector", Family::Gla, 3},        {"deltanet", Family::DeltaRule, 0}, {"gated_deltanet", Family::DeltaRule, 2},
          {"kda", Family::DeltaRule, 3},         {"mlstm", Family::Mlstm, 0}};
}

struct OpInputs {
  torch::Tensor q, k, v, g, beta, h0, ig, fg;
  std::vector<torch::Tensor*> all() { return {&q, &k, &v, &g, &beta, &h0, &ig, &fg}; }
};

inline OpInputs random_inputs(const OpCase& c, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V) {
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

inline OpInputs to_device(OpInputs in, const torch::Device& dev, bool grad) {
  for (auto* t : in.all())
    if (t->defined()) *t = t->to(dev).detach().requires_grad_(grad);
  return in;
}

// The fused path's results against the fp32 reference, each within 3e-2 relative error; returns a line
// "  name err (err of the libtorch form in the same dtype)" per result for the printed summary (the
// bracket left out where `plain` is empty).
inline std::string compare_fused(const std::vector<torch::Tensor>& ref, const std::vector<torch::Tensor>& fused,
                                 const std::vector<torch::Tensor>& plain, const std::vector<std::string>& names) {
  std::string line;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(fused[i].defined()) << names[i] << " missing on the fused path";
    if (!fused[i].defined()) continue;
    const double e = test::rel_err(fused[i], ref[i]);
    EXPECT_LE(e, 3e-2) << names[i];
    char buf[64];
    if (plain.empty())
      std::snprintf(buf, sizeof buf, "  %s %.1e", names[i].c_str(), e);
    else
      std::snprintf(buf, sizeof buf, "  %s %.1e (%.1e)", names[i].c_str(), e, test::rel_err(plain[i], ref[i]));
    line += buf;
  }
  return line;
}

}  // namespace linearize::cuda_test
