// Host entry points of ops/cuda/state_pass.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>

#include <utility>

namespace linearize::ops::cuda_kernels {

// The chunk-to-chunk state pass of the chunked forms (fp32; inner shapes [B, H, N, ...], N chunks of C).
//
// The delta rule (delta rule), the products inside the walk:
//   S^(0) = S0 (zeros when undefined)
//   X_n = U_n - W_n S^(n)
//   S^(n+1) = Diag(D_n) S^(n) + KdT_n X_n
// W [B,H,N,C,K]; U [B,H,N,C,V]; KdT [B,H,N,K,C]; D [B,H,N,K] or undefined (no decay); S0 [B,H,K,V] or
// undefined. Returns S^(n) for every n (the state entering chunk n), X and S^(N).
struct DeltaPassForward {
  torch::Tensor states, writes, final_state;
};
DeltaPassForward delta_pass_forward(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& KdT,
                                    const torch::Tensor& D, const torch::Tensor& S0);

// Its reverse pass, given the gradients of the three outputs (each may be undefined): lambda[n] =
// dLoss/dS^(n+1), d_writes_total[n] = dLoss/dX_n (through every path) and d_initial = dLoss/dS0. The
// gradients of W, U, KdT and D follow from these with batched products (ops/chunk/state_pass.cpp).
struct StatePassGrads {
  torch::Tensor lambda, d_writes_total, d_initial;
};
StatePassGrads delta_pass_backward(const torch::Tensor& W, const torch::Tensor& KdT, const torch::Tensor& D,
                                   const torch::Tensor& d_states, const torch::Tensor& d_writes,
                                   const torch::Tensor& d_final, int64_t V);

// The GLA family, the decayed scan over chunk contributions dS [B,H,N,K,V] (the caller's batched KdT_n U_n):
//   S^(n+1) = Diag(D_n) S^(n) + dS_n.  Returns every S^(n) [B,H,N,K,V] and S^(N) [B,H,K,V].
std::pair<torch::Tensor, torch::Tensor> decay_scan_forward(const torch::Tensor& dS, const torch::Tensor& D,
                                                           const torch::Tensor& S0);
// Its reverse: lambda[n] = dLoss/dS^(n+1) [B,H,N,K,V] (also the gradient of dS_n) and dLoss/dS0.
// d_states and d_final may be undefined (no gradient).
std::pair<torch::Tensor, torch::Tensor> decay_scan_backward(const torch::Tensor& D, const torch::Tensor& d_states,
                                                            const torch::Tensor& d_final, int64_t B, int64_t H,
                                                            int64_t N, int64_t K, int64_t V,
                                                            const torch::TensorOptions& opts);

}  // namespace linearize::ops::cuda_kernels
