// The chunk-to-chunk state pass of the GLA and delta-rule families (see common.h). On CUDA with fused kernels on, a
// custom autograd function around the kernels of ops/cuda/state_pass.cu (a walk with the products
// inside for the delta rule, a batched product and a decayed scan for the GLA family); elsewhere a loop of libtorch
// ops over the chunks, differentiated by autograd.
#include "compat/torch_compat.h"
#include "ops/common.h"
#include "ops/chunk/chunk.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

namespace {

StatePass state_pass_libtorch(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                              const torch::Tensor& D, const torch::Tensor& S0) {
  const int64_t N = U.size(2);
  const bool delta = W.defined();
  auto S = S0;
  // The state path runs in S0's dtype (fp32 or fp64) whatever the operands came in.
  const auto dt = S0.scalar_type();
  auto in_dt = [&](const torch::Tensor& t) { return t.defined() ? t.to(dt) : t; };
  const auto Wd = in_dt(W), Ud = in_dt(U), KdTd = in_dt(KdT);
  // Per-chunk views through unbind (its backward stacks the gradients; select's would build a full
  // zero tensor per chunk). The GLA family: the chunk contributions do not depend on the state, so they
  // are one batched product.
  using Tensors = std::vector<torch::Tensor>;
  const auto Us = delta ? Ud.unbind(2) : Tensors(), KdTs = delta ? KdTd.unbind(2) : Tensors();
  const auto Ws = delta ? Wd.unbind(2) : Tensors();
  const auto Ds = D.defined() ? D.unbind(2) : Tensors();
  const auto dS_all = delta ? Tensors() : KdTd.matmul(Ud).unbind(2);  // N x [B,H,K,V]
  std::vector<torch::Tensor> states, writes;
  states.reserve(N);
  if (delta) writes.reserve(N);
  for (int64_t n = 0; n < N; ++n) {
    states.push_back(S);
    torch::Tensor dS;
    if (delta) {
      auto X = Us[n] - Ws[n].matmul(S);  // [B,H,C,V]
      writes.push_back(X);
      dS = KdTs[n].matmul(X);
    } else {
      dS = dS_all[n];
    }
    S = D.defined() ? Ds[n] * S + dS : S + dS;
  }
  return {torch::stack(states, 2), delta ? torch::stack(writes, 2) : torch::Tensor(), S};
}

}  // namespace

StatePass state_pass(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                     const torch::Tensor& D, const torch::Tensor& S0) {
  if (auto fused = fused_state_pass(W, U, KdT, D, S0)) return *fused;
  return state_pass_libtorch(W, U, KdT, D, S0);
}

}  // namespace linearize::ops::detail
