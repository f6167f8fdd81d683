#include "train/graphed_train_step.h"

#include <cmath>

#include "compat/cuda_graph.h"
#include "compat/torch_compat.h"
#include "io/error.h"
#include "ops/ops.h"
#include "train/optimizer_schedule.h"


namespace linearize {

namespace {

using AdamWOptions = torch::optim::AdamWOptions;
using AdamWState = torch::optim::AdamWParamState;

// The parameters that have a gradient, in the optimizer's order, with their groups' options.
struct Updated {
  std::vector<torch::Tensor> params;
  std::vector<const AdamWOptions*> options;
};

Updated updated_params(torch::optim::AdamW& opt) {
  Updated u;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) {
        u.params.push_back(p);
        u.options.push_back(&static_cast<const AdamWOptions&>(group.options()));
      }
  return u;
}

}  // namespace

bool GraphedTrainStep::usable(torch::optim::AdamW& opt, Replay replay, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  const auto u = updated_params(opt);
  if (u.params.empty()) return no("no parameter has a gradient yet (run one step first)");
#ifndef LINEARIZE_WITH_CUDA
  if (replay == Replay::cuda_graph) return no("this build has no CUDA");
#endif
  if (replay == Replay::cuda_graph && !u.params[0].is_cuda()) return no("the parameters are not on CUDA");
  for (size_t i = 0; i < u.params.size(); ++i) {
    const auto& p = u.params[i];
    if (p.scalar_type() != torch::kFloat || !p.is_contiguous() || !p.grad().is_contiguous() ||
        p.grad().scalar_type() != torch::kFloat || p.device() != u.params[0].device())
      return no("a parameter or its gradient is not fp32 and contiguous on one device");
    const auto& o = *u.options[i];
    if (o.amsgrad()) return no("amsgrad");
    if (o.betas() != u.options[0]->betas() || o.eps() != u.options[0]->eps())
      return no("parameter groups with different betas or eps");
  }
  return true;
}

struct GraphedTrainStep::Impl {
  LossFn loss;
  torch::optim::AdamW* opt = nullptr;
  Replay replay = Replay::cuda_graph;
  int64_t grad_accum = 1;
  double clip = 0;
  bool autocast = false;
  Updated updated;
  std::vector<torch::Tensor> grads;
  std::vector<AdamWState*> states;
  ops::AdamWUpdate update;
  torch::Tensor rows;          // the step's batch, copied in before each replay
  torch::Tensor host_factors;  // [n, 3] decay, step_size, bias2_sqrt (pinned on CUDA)
  torch::Tensor loss_sum, norm;  // the step's outputs (fp64, fp32) on the device
#ifdef LINEARIZE_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  // The step: gradients zeroed in place, each micro-batch's forward and backward, the norm, the update (or,
  // with update false, the warm-up before capture: no parameter changes).
  void run(bool with_update) {
    {
      torch::NoGradGuard no_grad;
      for (auto& g : grads) g.zero_();
      loss_sum.zero_();
    }
    const int64_t micro = rows.size(0) / grad_accum;
    for (int64_t a = 0; a < grad_accum; ++a) {
      torch::Tensor l;
      {
        compat::AutocastGuard guard(torch::kCUDA, torch::kBFloat16, autocast);
        l = loss(rows.narrow(0, a * micro, micro)).to(torch::kFloat);
      }
      (l / static_cast<double>(grad_accum)).backward();
      torch::NoGradGuard no_grad;
      loss_sum.add_(l.detach().to(torch::kDouble));
    }
    torch::NoGradGuard no_grad;
    norm = gradients_norm(grads);
    if (!with_update) return;
    // clip_grad_norm_'s factor, as adamw_step writes it
    if (clip > 0) update.grad_scale = torch::clamp_max(clip / (norm + 1e-6), 1.0);
    update.skip_unless_finite = norm;
    ops::adamw_update(update);
  }

  void capture();
};

#ifdef LINEARIZE_WITH_CUDA

void GraphedTrainStep::Impl::capture() {
  // The warm-up runs the step without its update: no parameter changes before the first replay.
  graph = compat::capture_cuda_graph(
      rows.device(), [&] { run(/*with_update=*/false); }, [&] { run(/*with_update=*/true); },
      "CUDA graph training step");
}

#else

void GraphedTrainStep::Impl::capture() { throw Error("CUDA graph training step: this build has no CUDA"); }

#endif

GraphedTrainStep::GraphedTrainStep(LossFn loss, torch::optim::AdamW& opt, std::vector<int64_t> rows_shape,
                                   int64_t grad_accum, double clip, bool autocast, Replay replay)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!usable(opt, replay, &why)) throw Error("CUDA graph training step: " + why);
  if (rows_shape.size() != 2 || grad_accum < 1 || rows_shape[0] % grad_accum != 0)
    throw Error("CUDA graph training step: expected rows [batch, width] with batch divisible by grad_accum " +
                std::to_string(grad_accum));
  auto& m = *impl_;
  m.loss = std::move(loss);
  m.opt = &opt;
  m.replay = replay;
  m.grad_accum = grad_accum;
  m.clip = clip;
  m.autocast = autocast;
  m.updated = updated_params(opt);
  const auto device = m.updated.params[0].device();
  const auto [beta1, beta2] = m.updated.options[0]->betas();
  m.update.beta1 = beta1, m.update.beta2 = beta2, m.update.eps = m.updated.options[0]->eps();
  for (auto& p : m.updated.params) {
    // The state as libtorch's AdamW keeps it (adamw_step made it at the eager step; a skipped one did not).
    auto& slot = opt.state()[compat::optimizer_state_key(p)];
    if (!slot) {
      auto st = std::make_unique<AdamWState>();
      st->step(0);
      st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      slot = std::move(st);
    }
    auto* st = static_cast<AdamWState*>(slot.get());
    m.states.push_back(st);
    m.grads.push_back(p.grad());
    m.update.p.push_back(p), m.update.g.push_back(p.grad());
    m.update.m.push_back(st->exp_avg()), m.update.v.push_back(st->exp_avg_sq());
  }
  const auto n = static_cast<int64_t>(m.updated.params.size());
  auto host = torch::TensorOptions().dtype(torch::kFloat);
  if (device.is_cuda()) host = host.pinned_memory(true);
  m.host_factors = torch::empty({n, 3}, host);
  m.update.factors = torch::empty({n, 3}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  m.rows = torch::zeros(rows_shape, torch::TensorOptions().dtype(torch::kLong).device(device));
  m.loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  if (replay == Replay::cuda_graph) m.capture();
}

GraphedTrainStep::~GraphedTrainStep() = default;

GraphedTrainStep::Result GraphedTrainStep::step(const torch::Tensor& rows, double lr) {
  auto& m = *impl_;
  if (rows.sizes() != m.rows.sizes())
    throw Error("CUDA graph training step: captured for rows " + c10::str(m.rows.sizes()) + ", got " +
                c10::str(rows.sizes()));
  set_learning_rate(*m.opt, lr);
  // Each parameter's factors for this step, as adamw_step computes them (its group's lr and weight decay,
  // its step count).
  auto f = m.host_factors.accessor<float, 2>();
  for (size_t i = 0; i < m.states.size(); ++i) {
    const auto& o = *m.updated.options[i];
    const double t = static_cast<double>(m.states[i]->step() + 1);
    f[i][0] = static_cast<float>(o.weight_decay() != 0 ? 1 - o.lr() * o.weight_decay() : 1.0);
    f[i][1] = static_cast<float>(o.lr() / (1 - std::pow(m.update.beta1, t)));
    f[i][2] = static_cast<float>(std::sqrt(1 - std::pow(m.update.beta2, t)));
  }
  m.update.factors.copy_(m.host_factors, /*non_blocking=*/true);
  m.rows.copy_(rows);
#ifdef LINEARIZE_WITH_CUDA
  if (m.graph) {
    m.graph->replay();
  } else {
    m.run(/*with_update=*/true);
  }
#else
  m.run(/*with_update=*/true);
#endif
  const double loss = m.loss_sum.item<double>() / static_cast<double>(m.grad_accum);
  const double norm = m.norm.item<double>();
  if (!std::isfinite(norm)) return {loss, norm};  // skipped: nothing updated, step counts kept
  for (auto* st : m.states) st->step(st->step() + 1);
  return {loss, m.clip > 0 ? norm : 0.0};
}

}  // namespace linearize
