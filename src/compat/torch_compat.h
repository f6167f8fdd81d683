// The one place where libtorch 1.13 (Debian, CPU) and libtorch 2.x (pip PyTorch, CUDA) differ for us.
// Everything else in the code base calls these helpers instead of version-specific APIs.
#pragma once
#include <torch/torch.h>
#include <torch/version.h>

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace linearize::compat {

inline constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// The c10d class that ProcessGroupGloo / ProcessGroupNCCL derive from and that carries the
// collectives: ProcessGroup on 1.13, Backend since 2.0 (where ProcessGroup wraps backends).
#if TORCH_VERSION_MAJOR >= 2
using CommBackend = c10d::Backend;
#else
using CommBackend = c10d::ProcessGroup;
#endif

// Causal (or unmasked) softmax attention. q [B,H,Tq,D], k/v [B,Hkv,Tk,D] with H a multiple of Hkv: query
// head h reads KV head h / (H / Hkv) (HF repeat_kv order), without the KV heads being copied where the
// backend allows. When causal, query i attends to keys 0 .. i + (Tk - Tq).
// Uses scaled_dot_product_attention on torch 2 (flash kernels on CUDA, grouped heads included when no mask is
// needed), else matmul-softmax over the grouped heads.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, double scale);
// The same under an explicit mask: bool [B or 1, 1, Tq, Tk], true where query i may read key j (packed documents:
// causal within each document). Every query must see at least one key.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double scale);

// Whether autocast is on for a device type, and its dtype (activation recomputation replays it).
struct AutocastState {
  bool enabled = false;
  torch::ScalarType dtype = torch::kFloat;
};
AutocastState autocast_state(torch::DeviceType device);

// RAII guard that turns on bf16 (or other low-precision) autocast for a device type and restores the
// previous state when it leaves scope.
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device, torch::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_;
  bool enabled_;
  bool prev_enabled_ = false;
  torch::ScalarType prev_dtype_ = torch::kFloat;
};

// RAII guard that turns autocast off for a device type (fp32 matrix products stay fp32) and restores the
// previous state when it leaves scope.
class AutocastOffGuard {
 public:
  explicit AutocastOffGuard(torch::DeviceType device);
  ~AutocastOffGuard();
  AutocastOffGuard(const AutocastOffGuard&) = delete;
  AutocastOffGuard& operator=(const AutocastOffGuard&) = delete;

 private:
  torch::DeviceType device_;
  bool prev_enabled_ = false;
};

// RAII guard that lets fp32 matrix products on CUDA use TF32 tensor cores (10-bit mantissa, as
// precise as the bf16 operands they stand in for) while it is in scope, then restores the setting.
// Custom autograd functions take it in their backward, where autocast is off.
class Tf32Guard {
 public:
  explicit Tf32Guard(bool enabled);
  ~Tf32Guard();
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  bool enabled_;
  bool prev_ = false;
};

// The key of parameter p in torch::optim::Optimizer::state(): its TensorImpl, which libtorch 1.13 spells as a
// string.
#if TORCH_VERSION_MAJOR >= 2
inline void* optimizer_state_key(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
inline std::string optimizer_state_key(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

}  // namespace linearize::compat
