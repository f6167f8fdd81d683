// AdamW with the usual two parameter groups (weight decay on matrices; none on norms, biases and
// gate parameters such as A_log and dt_bias) and the learning-rate schedules of the pipeline:
//   wsd       linear warmup, constant, then a linear (or, with cosine_decay, half-cosine as Hugging Face's
//             get_wsd_schedule) decay to min_lr_frac * lr over the last `decay_frac` of the steps
//   cosine    linear warmup, cosine decay to min_lr_frac * lr
//   linear    linear warmup, linear decay to min_lr_frac * lr
//   constant  linear warmup, then constant (the study's stage 2)
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace linearize {

// The learning-rate schedules: warmup, then stable and a decay over the last decay_frac (wsd), a cosine or
// linear decay over the rest, or constant.
enum class ScheduleKind { wsd, cosine, linear, constant };
// The names of the command line, study files and checkpoints ("wsd", "cosine", "linear", "constant"); the
// parser throws an Error naming `what` (the option or key) and the accepted names.
ScheduleKind parse_schedule_kind(const std::string& name, const std::string& what);
std::string to_string(ScheduleKind kind);

struct Schedule {
  ScheduleKind kind = ScheduleKind::wsd;
  double lr = 3e-4;
  double warmup_frac = 0.1;
  double decay_frac = 0.2;     // wsd only
  bool cosine_decay = false;   // wsd only
  double min_lr_frac = 0.0;
  int64_t total_steps = 1;
  // Learning rate for 0-based step `step` (the LR the optimizer uses for that step).
  double at(int64_t step) const;
};

struct OptimizerOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// Parameters whose name ends in "bias", "A_log", "dt_bias", or which are 1-D (norm weights) get no
// weight decay.
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                                const OptimizerOptions& options, double lr);

void set_learning_rate(torch::optim::Optimizer& opt, double lr);

// One step of opt, as opt.step() takes it (the same state, so checkpoints are the same), through
// ops::adamw_update: on a GPU a few launches for all parameters where libtorch runs some nine a parameter.
// With max_grad_norm > 0 the gradients are clipped first to that total L2 norm, as
// torch::nn::utils::clip_grad_norm_ clips them (the same factor, max_norm / (norm + 1e-6) capped at 1), but
// the factor goes into the update instead of into the gradients, which are left as they were. Returns the
// gradients' total norm before clipping (0 without clipping). A non-finite norm (NaN or inf gradients)
// skips the step, moments and step counts included, and is returned as it is. Falls back to
// clip_grad_norm_ and opt.step() for what the update does not take (amsgrad).
double adamw_step(torch::optim::AdamW& opt, double max_grad_norm = 0);

// The gradients' total L2 norm as clip_grad_norm_ computes it (a norm a tensor, then the norm of those), fp32 on
// their device, without reading it on the host.
torch::Tensor gradients_norm(const std::vector<torch::Tensor>& grads);

}  // namespace linearize
