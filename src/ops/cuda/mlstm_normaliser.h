// Host entry points of ops/cuda/mlstm_normaliser.cu: built for the GPU, or as C++ for the CPU emulator's tests.
#pragma once
#include <torch/torch.h>


namespace linearize::ops::cuda_kernels {

// The mLSTM's gates and normaliser (ops/cuda/mlstm_normaliser.cu; mlstm/fused_chunk.cpp joins them
// with the numerator), fp32 throughout:
//   m_t = max(log σ(f_t) + m_{t-1}, i_t),  g_t = log σ(f_t) + m_{t-1} - m_t,  k'_t = w_t k_t, w_t = e^{i_t - m_t}
//   n_t = e^{g_t} n_{t-1} + k'_t,  den_t = n_t · (scale q_t)
// q, k [B,T,H,K] contiguous (16-byte aligned), both fp32 or both kp_dtype; igate, fgate [B,T,H] fp32
// contiguous (f the forget gate's pre-activation); m0 [B,H] fp32; n0 [B,H,K] fp32 or undefined (zeros).
// kp_dtype (bf16 or fp16) is the dtype of k' for the numerator's kernels. Returns k' [B,T,H,K]
// (kp_dtype); g, m, den [B,H,T] and n_T [B,H,K] (fp32); and for the backward w [B,H,T], the sum of g over
// each segment of the walk, gsum [B,H,S], and the n entering every 16 steps, [B,H,4 ceil(T/64),K].
// Supported: K = 64 or 128.
bool mlstm_normaliser_supported(int64_t K);
struct MlstmNormaliserForward {
  torch::Tensor kp, g, m, den, n_final, w, gsum, entering;
};
MlstmNormaliserForward mlstm_normaliser_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& igate, const torch::Tensor& fgate,
                                                const torch::Tensor& m0, const torch::Tensor& n0, double scale,
                                                torch::ScalarType kp_dtype);
// Its backward given the forward's inputs and results (kp, g, m, w, gsum, entering are read) and the
// gradients of k' (kp_dtype, aligned), g, m, den (fp32 [B,H,T], contiguous) and n_T (each may be
// undefined), with m held constant inside g and k' (only m0 is an input there): dq, dk (q's dtype),
// d_igate, d_fgate [B,T,H], d_m0 [B,H] and, when asked, d_n0 [B,H,K] (fp32). dq_add (q's dtype and shape,
// contiguous, or undefined) is a gradient q has from elsewhere (the numerator's): dq includes it, added in
// fp32 before dq is rounded, so that no separate pass adds the two.
struct MlstmNormaliserGrads {
  torch::Tensor dq, dk, d_igate, d_fgate, d_m0, d_n0;
};
MlstmNormaliserGrads mlstm_normaliser_backward(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& igate, const torch::Tensor& fgate,
                                               const torch::Tensor& m0, const MlstmNormaliserForward& fw,
                                               const torch::Tensor& d_kp, const torch::Tensor& d_g,
                                               const torch::Tensor& d_m, const torch::Tensor& d_den,
                                               const torch::Tensor& d_final, double scale, bool want_d_n0,
                                               const torch::Tensor& dq_add = {});

// h = o / (max(|den|, e^{-m}) + eps) row by row (the mLSTM's numerator over its denominator): o [B,T,H,V]
// 16-bit contiguous, den and m [B,H,T] fp32 contiguous; h in out_dtype (fp32 or o's dtype). Its backward
// given dh (h's dtype, contiguous): d_o (o's dtype) and d_den, d_m [B,H,T] fp32, with e^{-m} a constant
// (m's gradient is that of the eps term: see mlstm/fused_chunk.cpp).
torch::Tensor divide_rows_forward(const torch::Tensor& o, const torch::Tensor& den, const torch::Tensor& m, double eps,
                                  torch::ScalarType out_dtype);
struct DivideRowsGrads {
  torch::Tensor d_o, d_den, d_m;
};
DivideRowsGrads divide_rows_backward(const torch::Tensor& o, const torch::Tensor& den, const torch::Tensor& m,
                                     double eps, const torch::Tensor& dh);

}  // namespace linearize::ops::cuda_kernels
