// The mLSTM's chunked form through the fused kernels (mlstm.h, detail::fused_mlstm_chunk): the gates, the max
// state and the normaliser in fp32 by ops/cuda/mlstm_normaliser.cu, the numerator by the GLA family's
// scalar-decay chunk kernels, joined as in as_linear_attention.cpp (whose top comment has the math).
#include <cstdint>
#include <optional>

#include "ops/chunk/chunk.h"
#include "ops/common.h"
#include "ops/mlstm/mlstm.h"
#include "ops/ops.h"
#include "ops/cuda/chunk_scalar_decay.h"
#include "ops/cuda/mlstm_normaliser.h"
#include "ops/cuda/placeholder.h"

namespace linearize::ops::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using cuda_kernels::present;

// The parts through ops/cuda/mlstm_normaliser.cu. Inputs q, k [B,T,H,K] (fp32 or the 16-bit kp_dtype),
// igate, fgate [B,T,H] fp32, m0 [B,H] fp32, n0 [B,H,K] fp32 or empty; outputs kp, g, m, den, n_final and q
// itself (autograd makes it a view of q with this node as its source), for the numerator: the gradient
// that comes back to it is added into dq by the normaliser's backward kernel.
struct GatesNormaliserFunction : public torch::autograd::Function<GatesNormaliserFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& igate, const torch::Tensor& fgate, const torch::Tensor& m0,
                               const torch::Tensor& n0, double scale, int64_t kp_dtype) {
    const auto lo = static_cast<torch::ScalarType>(kp_dtype);
    auto r = cuda_kernels::mlstm_normaliser_forward(q, k, igate, fgate, m0, present(n0), scale, lo);
    ctx->save_for_backward({q, k, igate, fgate, m0, r.kp, r.g, r.m, r.w, r.gsum, r.entering});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["n0"] = n0.numel() > 0;
    return {r.kp, r.g, r.m, r.den, r.n_final, q};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    cuda_kernels::MlstmNormaliserForward fw;
    fw.kp = s[5], fw.g = s[6], fw.m = s[7], fw.w = s[8], fw.gsum = s[9], fw.entering = s[10];
    auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat).contiguous() : t; };
    const bool want_d_n0 = ctx->saved_data["n0"].toBool() && ctx->needs_input_grad(5);
    auto d_kp = grads[0].defined() ? aligned_rows(grads[0].to(fw.kp.scalar_type())) : grads[0];
    auto dq_add = grads[5].defined() ? grads[5].to(s[0].scalar_type()).contiguous() : grads[5];
    auto r = cuda_kernels::mlstm_normaliser_backward(s[0], s[1], s[2], s[3], s[4], fw, d_kp, f32(grads[1]),
                                                     f32(grads[2]), f32(grads[3]), f32(grads[4]),
                                                     ctx->saved_data["scale"].toDouble(), want_d_n0, dq_add);
    return {r.dq, r.dk, r.d_igate, r.d_fgate, r.d_m0, r.d_n0, torch::Tensor(), torch::Tensor()};
  }
};

// h = o / (max(|den|, e^{-m}) + eps) through ops/cuda/mlstm_normaliser.cu, with m's gradient that of the
// eps term (see the top of this file): o [B,T,H,V] 16-bit, den and m [B,H,T] fp32, h in out_dtype, with
// no fp32 copy of o and no element-wise kernels for the denominator on the way.
struct DivideRowsFunction : public torch::autograd::Function<DivideRowsFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& o, const torch::Tensor& den,
                               const torch::Tensor& m, double eps, int64_t out_dtype) {
    ctx->save_for_backward({o, den, m});
    ctx->saved_data["eps"] = eps;
    return cuda_kernels::divide_rows_forward(o, den, m, eps, static_cast<torch::ScalarType>(out_dtype));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(5);
    const auto s = ctx->get_saved_variables();
    auto r = cuda_kernels::divide_rows_backward(s[0], s[1], s[2], ctx->saved_data["eps"].toDouble(),
                                                grads[0].contiguous());
    return {r.d_o, r.d_den, r.d_m, torch::Tensor(), torch::Tensor()};
  }
};

// The parts through the kernels, k' in the 16-bit dtype lo. q and k stay fp32 when they are (autocast):
// the normaliser then sees them unrounded, as libtorch_parts does.
MlstmParts kernel_parts(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& igate,
                   const torch::Tensor& fgate, const torch::Tensor& m0, const torch::Tensor& n0, double scale,
                   torch::ScalarType lo) {
  auto gate = [](const torch::Tensor& x) { return x.to(torch::kFloat).contiguous(); };
  auto rows = [&](const torch::Tensor& x) {
    return aligned_rows(x.scalar_type() == torch::kFloat || x.scalar_type() == lo ? x : x.to(torch::kFloat));
  };
  auto none = torch::empty({0}, q.options().dtype(torch::kFloat));
  auto out = GatesNormaliserFunction::apply(rows(q), rows(k), gate(igate), gate(fgate), gate(m0),
                                            n0.defined() ? gate(n0) : none, scale, static_cast<int64_t>(lo));
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

}  // namespace

std::optional<MlstmResult> fused_mlstm_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const torch::Tensor& igate, const torch::Tensor& fgate,
                                             const MlstmState& init, double scale, double eps, int64_t chunk) {
  const auto dt = fused_chunk_dtype(q, k, v, chunk);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  if (!dt || !cuda_kernels::scalar_decay_chunk_supported(K, v.size(3), *dt) ||
      !cuda_kernels::mlstm_normaliser_supported(K) || T == 0)
    return std::nullopt;
  const auto f32 = q.options().dtype(torch::kFloat);
  auto m0 = init.defined() ? init.m : torch::zeros({B, H}, f32);
  auto n0 = init.defined() ? init.n : torch::Tensor();
  const auto parts = kernel_parts(q, k, igate, fgate, m0, n0, scale, *dt);
  auto divide = [&](const torch::Tensor& num) {
    return DivideRowsFunction::apply(aligned_rows(num), parts.den.contiguous(), parts.m.contiguous(), eps,
                                     static_cast<int64_t>(v.scalar_type()));
  };
  return mlstm_join(parts, v, init, scale, eps, chunk, divide);
}

}  // namespace linearize::ops::detail
