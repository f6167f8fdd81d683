// A whole optimizer step of the training loop captured as one CUDA graph: zeroing the gradients, every
// micro-batch's forward and backward (the teacher's forward too, when distilling), the gradients' norm,
// clipping and the AdamW update replay as one launch. Small models are bound by the host issuing thousands
// of small kernels a step (SmolLM2-135M's students reach 8-13% MFU); a replay issues none of them.
//
// What a graph needs, and how the step provides it: fixed addresses (the batch goes into one buffer, the
// gradients are zeroed in place, never freed); nothing read on the host inside the step (the norm stays on
// the device and decides there whether the update happens, the learning rate and bias corrections come
// from a small device array refilled before each replay); the same kernels every step (fixed shapes).
// The eager stand-in runs the same step without a graph, so CPU tests check everything but the capture.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace linearize {

class GraphedTrainStep {
 public:
  enum class Replay { cuda_graph, eager };
  using LossFn = std::function<torch::Tensor(const torch::Tensor& micro_batch)>;

  // Whether the optimizer's steps can be captured: a CUDA build and parameters on CUDA (for a graph),
  // fp32 contiguous parameters with gradients (after an eager step), one set of betas and eps, no amsgrad.
  // `why` receives the reason when not.
  static bool usable(torch::optim::AdamW& opt, Replay replay, std::string* why = nullptr);

  // rows_shape: the step's rows [batch, width] (int64), split into grad_accum micro-batches; clip as
  // adamw_step takes it; autocast: bf16 autocast around each loss (CUDA). The parameters that have a
  // gradient now are the ones updated (run one eager step first). Throws linearize::Error when the
  // capture fails (an op that reads the device on the host, or one a graph cannot hold).
  GraphedTrainStep(LossFn loss, torch::optim::AdamW& opt, std::vector<int64_t> rows_shape, int64_t grad_accum,
                   double clip, bool autocast, Replay replay = Replay::cuda_graph);
  ~GraphedTrainStep();

  struct Result {
    double loss;       // mean over the micro-batches
    double grad_norm;  // as adamw_step returns it: the norm before clipping (0 without clipping); not
                       // finite when the step was skipped (nothing updated)
  };
  // One step on `rows` at learning rate lr (every group's, as set_learning_rate sets it), with the
  // optimizer's state (moments, step counts) kept as adamw_step keeps it.
  Result step(const torch::Tensor& rows, double lr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace linearize
