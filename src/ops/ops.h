// The three op families behind the seven token mixers. Ops own no parameters: tensors in, tensors out.
// Each has a recurrent form (token by token: the reference and the decode path) and a chunked form
// (chunks of 64 by default: training and prefill, autograd-capable through libtorch ops). Both take an
// optional initial state and return the final state. Gate math and cumulative sums run in fp32
// whatever the input dtype; outputs come back in the dtype of v.
//
// Layout (as fla): q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; state [B, H, K, V].
// Output read after the update: o_t = S_t^T (scale * q_t).
#pragma once
#include <torch/torch.h>

namespace linearize::ops {

struct OpResult {
  torch::Tensor o;      // [B, T, H, V]
  torch::Tensor state;  // [B, H, K, V] fp32 final state
};
// The recurrent forms' and the short convolution's `in_place`: write the new state over the one given (h0,
// prefix) and return that tensor, where it has the new state's dtype and layout, so a caller that keeps no
// other copy (a CUDA graph's buffers) moves no state between steps; other callers leave it false and their
// states untouched (snapshots).

// ---- The GLA family: gated linear attention  S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T ------------------
// g (log decay, <= 0) selects the decay kind:
//   undefined      none (Linear Attention)
//   [H]            fixed per head, the same at every step (RetNet's g_gamma)
//   [B, T, H]      data-dependent scalar per head
//   [B, T, H, K]   data-dependent per key channel (GLA)
// gla_recurrent also takes grouped KV heads: k, v and a [B, T, Hkv] or [B, T, Hkv, K] g with Hkv heads, H a
// multiple of Hkv, query head h reading head h / (H / Hkv) (as repeat_heads spreads them), so that a decode
// step need not copy them to H heads first.
// gate_logits > 0: g holds the gate's logits x ([B, T, H or Hkv, K]), the log decay being
// log_sigmoid(x) / gate_logits (GLA's normaliser), which a fused decode step computes as it reads them
// (no launches of its own); elsewhere the same formula runs first.
OpResult gla_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& g, const torch::Tensor& h0, double scale, bool in_place = false,
                       double gate_logits = 0);
OpResult gla_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& g, const torch::Tensor& h0, double scale, int64_t chunk = 64);

// ---- The delta rule: gated delta rule  S_t = (I - b_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T ---
// beta [B, T, H]; g undefined (DeltaNet), [B, T, H] (Gated DeltaNet) or [B, T, H, K] (KDA).
// q and k are used as given (layers L2-normalise them first).
OpResult delta_rule_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                              double scale, bool in_place = false);
OpResult delta_rule_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                          double scale, int64_t chunk = 64);
// The delta rule's beta from its projection's logits: beta_scale sigmoid(logits) in fp32 (beta_scale 2 allows
// negative eigenvalues); what delta_rule_decode's fused kernel computes as it reads them.
torch::Tensor delta_rule_beta(const torch::Tensor& logits, double beta_scale);
// One decode step (T = 1) from a layer's raw inputs: q, k [B,1,H,K] before their L2 norm (l2_norm with
// l2_eps), beta_logits [B,1,H] with beta = beta_scale sigmoid(beta_logits), g and h0 as above. The fused
// kernel normalises and takes the sigmoid as it reads them (four launches fewer a layer: two norms, a cast
// and the sigmoid); elsewhere l2_norm, sigmoid and delta_rule_recurrent run.
OpResult delta_rule_decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& beta_logits, double beta_scale, const torch::Tensor& g,
                           const torch::Tensor& h0, double scale, bool in_place = false, double l2_eps = 1e-6);

// ---- The mLSTM: mLSTM (exponential input gate, sigmoid forget gate, normaliser, max-stabiliser) ---
// igate, fgate: pre-activations [B, T, H]; log f = logsigmoid(fgate); input weight exp(igate).
// State (c [B,H,K,V], n [B,H,K], m [B,H]) starts at zeros when undefined.
// h_t = C_t^T q^_t / (max(|n_t . q^_t|, exp(-m_t)) + eps), q^ = q * scale.
struct MlstmState {
  torch::Tensor c, n, m;
  bool defined() const { return c.defined(); }
};
struct MlstmResult {
  torch::Tensor h;  // [B, T, H, V]
  MlstmState state;
};
MlstmResult mlstm_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                            double scale, double eps = 1e-6);
MlstmResult mlstm_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& igate, const torch::Tensor& fgate, const MlstmState& init,
                        double scale, double eps = 1e-6, int64_t chunk = 64);

// Fused CUDA kernels (see ops/cuda/): the chunked forms and a T = 1 call of gla_recurrent or
// delta_rule_recurrent on CUDA run as a few kernel launches. On by default where compiled; turning them
// off runs the libtorch form (tests and benchmarks compare the two).
void set_fused_kernels(bool on);
bool fused_kernels_enabled();  // compiled in (for CUDA or the emulator) and on
// The CPU build compiles the same kernels for a SIMT emulator (ops/cuda/emulation/simt.h), so that tests
// can check them on a machine without a GPU: while emulation is on, the kernels take CPU tensors (slowly).
// Off by default; set_kernel_emulation(true) throws in a build without the emulator.
bool kernel_emulation_available();
void set_kernel_emulation(bool on);
bool kernel_emulation_enabled();
// Whether the fused kernels take t: a CUDA tensor, or a CPU one while emulation is on.
bool on_kernel_device(const torch::Tensor& t);

// ---- Norms over the last dim (ops/nn/row_norms.cpp), in fp32 inside whatever the dtype ----------------
// On a kernel device (ops/cuda/row_norms.cu) one kernel each way, which keeps only the per-row factor for
// the backward; elsewhere the libtorch formula.
// L2 normalisation: x / sqrt(sum x^2 + eps), returned in x's dtype.
torch::Tensor l2_norm(const torch::Tensor& x, double eps = 1e-6);
// RMS norm as Hugging Face's LlamaRMSNorm: weight * (x / sqrt(mean x^2 + eps)).to(x's dtype); weight [D].
// With a gate (x's shape) and act sigmoid or silu, times act(gate): the mixers' gated output norms
// (fla's FusedRMSNormGated), one kernel each way on a kernel device where the gate has x's dtype.
enum class Gate { none, sigmoid, silu };
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                       const torch::Tensor& gate = {}, Gate act = Gate::none);
// A residual connection and the RMS norm after it: sum = x + residual and rms_norm(sum, weight, eps). One
// kernel where it runs and nothing needs a gradient (inference); elsewhere the addition and rms_norm.
struct AddNorm {
  torch::Tensor sum, normed;
};
AddNorm add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps);

// ---- The Llama MLP's SwiGLU product (ops/nn/swiglu.cpp) ------------------------------------------------
// silu(gate) * up, as libtorch rounds it; on a kernel device one kernel each way (ops/cuda/swiglu.cu)
// where gate and up share shape and dtype, elsewhere the formula, which also takes strided views when no
// gradient is wanted (no copies first).
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// ---- The mixers' short convolutions (ops/nn/short_conv.cpp) ---------------------------------------------
// A causal depthwise convolution over time of x [B, T, C] with weight [C, 1, W] and bias [C] (or
// undefined), from the W-1 inputs before x, prefix [B, C, W-1] (a decoding state; undefined: zeros), then
// silu when asked: fla's ShortConvolution, with w and bias cast to x's dtype. Returns y [B, T, C] and, with
// want_cache, the W-1 last inputs [B, C, W-1] (x's dtype) for the next call, written over the prefix with
// in_place for one step (T = 1). On a kernel device one kernel each way (ops/cuda/short_conv.cu); elsewhere
// cat, conv1d and silu.
struct ShortConvResult {
  torch::Tensor y, cache;
};
ShortConvResult short_conv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                           const torch::Tensor& prefix, bool silu, bool want_cache, bool in_place = false);

// ---- The decay gate of Gated DeltaNet and KDA (ops/chunk/softplus_decay.cpp) ----------------------------
// g = -exp(A_log) * softplus(f + dt_bias) in fp32 (Mamba2's parameterisation): f [..., C] with C = H * K
// channels, K a head (K = 1: one a head, as Gated DeltaNet), dt_bias [C], A_log [H]. Returns [..., C] fp32.
// On a kernel device one kernel each way (ops/cuda/softplus_decay.cu); elsewhere the formula.
torch::Tensor softplus_decay(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log);
// fla's bounded KDA gate, g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)) in [lower_bound, 0), same
// shapes; the libtorch formula in fp32.
torch::Tensor lower_bound_decay(const torch::Tensor& f, const torch::Tensor& dt_bias, const torch::Tensor& A_log,
                                double lower_bound);

// ---- Stage-3 distillation's and next-token training's per-token terms (ops/nn/distill_loss.cpp) --------------
// Student logits s and teacher logits t [N, V], targets [N] (int64), temperature T > 0; in fp32 [N]:
//   ce[i] = logsumexp(s_i) - s_i[y_i]   (0 where y_i is outside [0, V), as cross_entropy's ignored targets)
//   kl[i] = KL(softmax(t_i / T) || softmax(s_i / T))
// differentiable in s (t must not need a gradient for the kernels; otherwise the formula runs). On a kernel
// device (ops/cuda/distill_loss.cu) one pass over s and t each way, keeping three numbers a row for the
// backward, which writes the gradient in s's dtype; elsewhere the libtorch formula in fp32.
struct DistillTerms {
  torch::Tensor ce, kl;
};
DistillTerms distill_loss_terms(const torch::Tensor& s, const torch::Tensor& t, const torch::Tensor& targets,
                                double temperature);
// The cross-entropy term alone, ce [N] fp32 (the same kernels without a teacher): next-token training.
torch::Tensor cross_entropy_terms(const torch::Tensor& logits, const torch::Tensor& targets);

// ---- AdamW's update of many tensors at once (ops/nn/adamw.cpp) -------------------------------------------
// In place, for each tensor i with parameter p, gradient g and moments m, v (one shape):
//   p = p decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  p = p - step_size m / (sqrt(v) / bias2_sqrt + eps)
// per element as libtorch's AdamW step (decay = 1 - lr wd, step_size = lr / (1 - b1^t), bias2_sqrt =
// sqrt(1 - b2^t)). On a kernel device with every tensor fp32 and contiguous a few launches for them all
// (ops/cuda/adamw.cu); elsewhere libtorch's element-wise ops, tensor by tensor, as its optimizer runs them.
// grad_scale, where given (a 0-dim fp32 tensor on the parameters' device, e.g. gradient clipping's factor),
// multiplies every g before the update, as g.mul_(grad_scale) would, without writing g back.
// factors, where given ([count, 3] fp32 on the parameters' device: decay, step_size, bias2_sqrt of each
// tensor), replace the three vectors (then empty) and are read on the device, so that a captured CUDA graph
// replays the update with each step's factors. skip_unless_finite, where given (one fp32 number on the
// device, e.g. the gradients' norm): when it is not finite, nothing is updated.
struct AdamWUpdate {
  std::vector<torch::Tensor> p, g, m, v;
  std::vector<double> decay, step_size, bias2_sqrt;
  torch::Tensor grad_scale, factors, skip_unless_finite;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};
void adamw_update(const AdamWUpdate& update);

}  // namespace linearize::ops
