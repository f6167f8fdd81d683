// A scalar decay's gradient through a fused walk, from the row sums its backward gives (chunk.h): one
// kernel on a kernel device (fused_decay_gradient.cpp), else libtorch.
#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace linearize::ops::detail {

torch::Tensor walk_decay_gradient(const torch::Tensor& dot_q, const torch::Tensor& dot_k, const torch::Tensor& dot_w,
                                  int64_t chunk, const torch::Tensor& d_final, const torch::Tensor& final_state) {
  if (auto fused = fused_walk_decay_gradient(dot_q, dot_k, dot_w, chunk, d_final, final_state)) return *fused;
  auto db = dot_q - dot_k;                                               // [B,H,T]
  auto dg = db.flip(2).cumsum(2).flip(2);                                // Σ_{t >= s}
  if (dot_w.defined()) {
    const int64_t B = dot_q.size(0), H = dot_q.size(1), T = dot_q.size(2), N = dot_w.size(2) / chunk;
    auto per_chunk = dot_w.reshape({B, H, N, chunk}).sum(-1);            // [B,H,N]
    auto later = per_chunk.flip(2).cumsum(2).flip(2) - per_chunk;        // [B,H,N]: Σ over chunks m > n
    dg = dg + later.repeat_interleave(chunk, 2).narrow(2, 0, T);
  }
  if (d_final.defined()) dg = dg + (d_final * final_state).sum({2, 3}).unsqueeze(-1);
  return dg;
}

}  // namespace linearize::ops::detail
