#include "train/optimizer_schedule.h"

#include <cmath>
#include <memory>

#include "compat/torch_compat.h"
#include "io/error.h"
#include "ops/ops.h"

namespace linearize {

ScheduleKind parse_schedule_kind(const std::string& name, const std::string& what) {
  if (name == "wsd") return ScheduleKind::wsd;
  if (name == "cosine") return ScheduleKind::cosine;
  if (name == "linear") return ScheduleKind::linear;
  if (name == "constant") return ScheduleKind::constant;
  throw Error(what + ": unknown learning-rate schedule \"" + name + "\" (expected wsd, cosine, linear or constant)");
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::wsd: return "wsd";
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::linear: return "linear";
    case ScheduleKind::constant: return "constant";
  }
  return "wsd";
}

double Schedule::at(int64_t step) const {
  const double total = static_cast<double>(std::max<int64_t>(total_steps, 1));
  const double warmup = std::floor(warmup_frac * total);
  const double s = static_cast<double>(step);
  const double min_lr = min_lr_frac * lr;
  if (warmup > 0 && s < warmup) return lr * (s + 1) / warmup;
  if (kind == ScheduleKind::constant) return lr;
  if (kind == ScheduleKind::wsd) {
    const double decay_start = total - std::floor(decay_frac * total);
    if (s < decay_start) return lr;
    const double p = std::min(1.0, (s - decay_start + 1) / std::max(1.0, total - decay_start));
    if (cosine_decay) return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * p));
    return lr + (min_lr - lr) * p;
  }
  const double p = std::min(1.0, (s - warmup + 1) / std::max(1.0, total - warmup));
  if (kind == ScheduleKind::linear) return lr + (min_lr - lr) * p;
  return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * p));  // cosine
}

std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                                const OptimizerOptions& o, double lr) {
  std::vector<torch::Tensor> decay, no_decay;
  auto ends_with = [](const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
  };
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    const bool skip = p.dim() < 2 || ends_with(name, "bias") || ends_with(name, "A_log") || ends_with(name, "dt_bias");
    (skip ? no_decay : decay).push_back(p);
  }
  auto base = torch::optim::AdamWOptions(lr).betas({o.beta1, o.beta2}).eps(o.eps);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(base).weight_decay(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(base).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(groups, base);
}

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

// On a GPU libtorch's _foreach_norm takes many tensors a launch where clip_grad_norm_ takes one each; on the CPU
// the same per-tensor norms as clip_grad_norm_, to the bit.
torch::Tensor gradients_norm(const std::vector<torch::Tensor>& grads) {
  std::vector<torch::Tensor> norms;
  if (grads.front().is_cuda()) {
    norms = at::_foreach_norm(grads);
  } else {
    for (const auto& g : grads) norms.push_back(g.norm(2));
  }
  return norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
}

namespace {

double libtorch_step(torch::optim::AdamW& opt, double max_grad_norm) {
  std::vector<torch::Tensor> params, grads;
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params()) {
      params.push_back(p);
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  if (grads.empty()) return 0;
  const double norm = gradients_norm(grads).item<double>();
  if (!std::isfinite(norm)) return norm;  // skipped: no update
  if (max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, max_grad_norm);
  opt.step();
  return max_grad_norm > 0 ? norm : 0.0;
}

}  // namespace

double adamw_step(torch::optim::AdamW& opt, double max_grad_norm) {
  for (const auto& group : opt.param_groups())
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad())
      return libtorch_step(opt, max_grad_norm);
  ops::AdamWUpdate u;
  bool first = true;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    if (first) u.beta1 = beta1, u.beta2 = beta2, u.eps = o.eps(), first = false;
    if (beta1 != u.beta1 || beta2 != u.beta2 || o.eps() != u.eps)
      return libtorch_step(opt, max_grad_norm);  // one set of betas and eps a call
  }
  // The gradients' norm first, read on the host: a non-finite one skips the step (nothing is updated).
  std::vector<torch::Tensor> grads;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0;
  torch::Tensor norm;
  {
    torch::NoGradGuard no_grad;
    norm = gradients_norm(grads);
  }
  const double norm_value = norm.item<double>();
  if (!std::isfinite(norm_value)) return norm_value;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      // The state as libtorch's AdamW keeps it: created at a parameter's first step.
      auto& slot = opt.state()[compat::optimizer_state_key(p)];
      if (!slot) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      st.step(st.step() + 1);
      const double t = static_cast<double>(st.step());
      u.p.push_back(p), u.g.push_back(p.grad()), u.m.push_back(st.exp_avg()), u.v.push_back(st.exp_avg_sq());
      u.decay.push_back(o.weight_decay() != 0 ? 1 - o.lr() * o.weight_decay() : 1.0);
      u.step_size.push_back(o.lr() / (1 - std::pow(beta1, t)));
      u.bias2_sqrt.push_back(std::sqrt(1 - std::pow(beta2, t)));
    }
  }
  if (max_grad_norm > 0) {
    torch::NoGradGuard no_grad;
    // clip_grad_norm_'s factor, written as it writes it (double / tensor is libtorch's reciprocal product).
    u.grad_scale = torch::clamp_max(max_grad_norm / (norm + 1e-6), 1.0);
  }
  ops::adamw_update(u);
  return max_grad_norm > 0 ? norm_value : 0.0;
}

}  // namespace linearize
