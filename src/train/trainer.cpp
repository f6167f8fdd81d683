#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "compat/torch_compat.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/graphed_train_step.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream o;
  if (s >= 3600) o << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60) o << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else o << s << "s";
  return o.str();
}

// Keeps only the lines of metrics.jsonl that precede `step` of stage `name` (lines written after the
// checkpoint by a run that was then killed), so a resumed run's log has every step once.
void truncate_metrics(const std::string& run_dir, const std::string& name, int64_t step) {
  const fs::path p = fs::path(run_dir) / "metrics.jsonl";
  if (!fs::exists(p)) return;
  std::ifstream in(p);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.value("stage", "") == name && j.value("step", int64_t{0}) > step) continue;
    } catch (...) {
      continue;  // a torn last line from a killed run
    }
    kept += line + "\n";
  }
  in.close();
  std::ofstream(p, std::ios::trunc) << kept;
}

}  // namespace

void append_metrics(const std::string& run_dir, const nlohmann::json& record) {
  if (run_dir.empty()) return;
  fs::create_directories(run_dir);
  std::ofstream out(fs::path(run_dir) / "metrics.jsonl", std::ios::app);
  out << record.dump() << "\n";
}

std::string snapshot_dir(const std::string& run_dir, const std::string& name, int64_t step) {
  return (fs::path(run_dir) / ("checkpoint-" + name + "-step" + std::to_string(step))).string();
}

namespace {

// PyTorch's deterministic mode for a scope, as it was afterwards. Strict: in warn-only mode SDPA's
// backward keeps its non-deterministic split-key kernels (warning once), so the same run would not repeat;
// strict, it takes its deterministic ones, and an op without a deterministic form stops the run with
// PyTorch's error naming it. cuBLAS needs a fixed workspace for repeatable results; its variable is read
// when cuBLAS starts, so it is set here only if the process has not set it (a study's first GPU work is
// this loop).
class DeterministicScope {
 public:
  explicit DeterministicScope(bool on)
      : on_(on), was_(at::globalContext().deterministicAlgorithms()),
        was_warn_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    if (!on_) return;
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicScope() {
    if (on_) at::globalContext().setDeterministicAlgorithms(was_, was_warn_);
  }
  DeterministicScope(const DeterministicScope&) = delete;
  DeterministicScope& operator=(const DeterministicScope&) = delete;

 private:
  bool on_, was_, was_warn_;
};

}  // namespace

TrainResult run_training(torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& trainable,
                         BatchSource& loader, const StepFn& step_fn, const TrainLoopOptions& o) {
  if (o.steps < 1) throw Error(o.name + ": the number of steps must be positive (more tokens or a smaller batch?)");
  const DeterministicScope deterministic(o.deterministic);
  // Data parallel when launched: every rank takes its own rows of each global batch.
  DataParallelGroup* group = DataParallelGroup::get(o.device);
  const int64_t world = group ? group->world_size() : 1, rank = group ? group->rank() : 0;
  if (o.grad_accum < 1 || o.batch % (world * o.grad_accum) != 0)
    throw Error(o.name + ": batch " + std::to_string(o.batch) + " is not divisible by grad_accum " +
                std::to_string(o.grad_accum) + (world > 1 ? " x " + std::to_string(world) + " processes" : ""));
  const int64_t per_rank = o.batch / world, micro = per_rank / o.grad_accum;
  const bool main_rank = rank == 0, quiet = o.quiet || !main_rank;
  auto optimizer = make_adamw(trainable, o.optimizer, o.schedule.lr);
  Schedule schedule = o.schedule;
  schedule.total_steps = o.steps;
  std::vector<torch::Tensor> params;
  for (const auto& [n, p] : trainable)
    if (p.requires_grad()) params.push_back(p);

  const std::string ckpt = o.run_dir.empty() ? "" : (fs::path(o.run_dir) / ("checkpoint-" + o.name)).string();
  // What a resumed run must share with the one that wrote the checkpoint for the continuation to be exact.
  // The step count may differ (a budget branch continues a longer run) and so may the number of processes.
  const nlohmann::json settings = {{"seed", o.seed}, {"batch", o.batch}, {"tokens_per_row", loader.tokens_per_row()},
                                   {"lr", o.schedule.lr}, {"schedule", to_string(o.schedule.kind)},
                                   {"weight_decay", o.optimizer.weight_decay}, {"clip", o.clip}};
  int64_t start = 0;
  TrainResult result;
  if (o.resume && !ckpt.empty() && checkpoint_exists(ckpt)) {
    if (const auto saved = read_checkpoint_state(ckpt); saved.contains("settings")) {
      std::string diff;
      for (const auto& [key, value] : settings.items())
        if (saved["settings"].contains(key) && saved["settings"][key] != value)
          diff += (diff.empty() ? "" : ", ") + key + " " + value.dump() + " (checkpoint: " + saved["settings"][key].dump() + ")";
      if (!diff.empty())
        throw Error(ckpt + ": --resume with settings other than the run that wrote it: " + diff +
                    "; resume with the original settings, or give a new --out");
    }
    // Every rank reads the same checkpoint; the data position is global, so the number of
    // processes may differ from the run that wrote it.
    auto state = load_checkpoint(ckpt, module, *optimizer);
    start = state.at("step").get<int64_t>();
    loader.set_position_json(state.at("data_position"));
    result.last_loss = state.value("loss", 0.0);
    if (main_rank) truncate_metrics(o.run_dir, o.name, start);
    if (!quiet) std::cerr << "[" << o.name << "] resumed from " << ckpt << " at step " << start << "\n";
    if (state.value("finished", false) || start >= o.steps) {
      result.steps_done = start;
      result.finished = true;
      return result;
    }
  }

  std::unique_ptr<GradientSync> sync;
  if (group) {
    std::vector<torch::Tensor> replica;
    for (const auto& p : module.parameters()) replica.push_back(p);
    for (const auto& b : module.buffers()) replica.push_back(b);
    group->broadcast_from_rank0(replica);
    // With one process the all-reduce is the identity: its copies would only cost time.
    if (world > 1) sync = std::make_unique<GradientSync>(*group, params);
    if (!quiet)
      std::cerr << "[" << o.name << "] data parallel over " << world << " processes: " << per_rank
                << " sequences each per step, "
                << (sync ? "gradients in " + std::to_string(sync->num_buckets()) + " buckets" : "no gradient all-reduce")
                << "\n";
  }

  auto save = [&](int64_t step_done, double loss, bool finished) {
    if (ckpt.empty()) return;
    if (main_rank)
      save_checkpoint(ckpt, module, *optimizer,
                      {{"stage", o.name}, {"step", step_done}, {"loss", loss}, {"data_position", loader.position_json()},
                       {"seed", o.seed}, {"finished", finished}, {"steps", o.steps}, {"world_size", world},
                       {"settings", settings}});
    if (group) group->barrier();  // no rank runs ahead of a checkpoint being written
  };

  // Steps replayed from a graph once the first has run eagerly (it makes the gradients and moments).
  std::unique_ptr<GraphedTrainStep> graphed;
  bool graph_given_up = o.step_graph == TrainLoopOptions::StepGraph::off || sync != nullptr;
  auto try_graph = [&](const torch::Tensor& rows) {
    graph_given_up = true;  // one try a run
    const auto replay = o.step_graph == TrainLoopOptions::StepGraph::cuda_graph ? GraphedTrainStep::Replay::cuda_graph
                                                                                : GraphedTrainStep::Replay::eager;
    std::string why;
    try {
      if (GraphedTrainStep::usable(*optimizer, replay, &why))
        graphed = std::make_unique<GraphedTrainStep>(step_fn, *optimizer, rows.sizes().vec(), o.grad_accum, o.clip,
                                                     o.device.is_cuda(), replay);
    } catch (const Error& e) {
      why = e.what();
    }
    if (!quiet)
      std::cerr << "[" << o.name << "] "
                << (graphed ? "steps replay as one CUDA graph" : "steps run eagerly, not as a CUDA graph: " + why)
                << "\n";
  };

  auto refuse_nonfinite = [&](double loss, int64_t s) {
    if (!std::isfinite(loss))
      throw Error(o.name + ": loss became " + std::to_string(loss) + " at step " + std::to_string(s + 1) +
                  " (lower the learning rate?)");
  };

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tokens_per_step = o.batch * loader.tokens_per_row();
  constexpr int kMaxNonfiniteSteps = 8;
  int nonfinite_in_a_row = 0;
  for (int64_t s = start; s < o.steps; ++s) {
    const double lr = schedule.at(s);
    set_learning_rate(*optimizer, lr);
    // The global batch is drawn on every rank (the order depends only on the seed); each keeps its rows.
    auto rows = loader.next_part(o.batch, rank * per_rank, per_rank);
    if (!graphed && !graph_given_up && s > start) try_graph(rows);
    double loss = 0, grad_norm = 0;
    if (graphed) {
      // The whole step in one replay. A non-finite loss comes with non-finite gradients, which the update skips.
      const auto r = graphed->step(rows, lr);
      loss = r.loss, grad_norm = r.grad_norm;
      ++result.graphed_steps;
      refuse_nonfinite(loss, s);
    } else {
      optimizer->zero_grad();
      // Summed where the loss lives and read once a step: a read per micro-batch would wait for each one's backward.
      torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(o.device));
      for (int64_t a = 0; a < o.grad_accum; ++a) {
        auto batch = rows.narrow(0, a * micro, micro).to(o.device);
        torch::Tensor micro_loss;
        {
          // bf16 autocast on CUDA (fp32 master weights stay in the optimizer); plain fp32 on CPU.
          compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, o.device.is_cuda());
          micro_loss = step_fn(batch).to(torch::kFloat);
        }
        if (sync) sync->arm(a + 1 == o.grad_accum);
        (micro_loss / static_cast<double>(o.grad_accum)).backward();
        loss_sum += micro_loss.detach().to(torch::kDouble);
      }
      if (sync) sync->finish();  // .grad = mean over ranks of each rank's mean over its micro-batches
      loss = loss_sum.item<double>() / static_cast<double>(o.grad_accum);
      if (group) loss = group->mean(loss);
      refuse_nonfinite(loss, s);  // before the update
      grad_norm = adamw_step(*optimizer, o.clip);  // clipped within (0: no clipping)
    }
    if (!std::isfinite(grad_norm)) {
      // NaN or inf gradients: adamw_step updated nothing. A few in a row stop the run before the model is harmed.
      ++result.skipped_steps;
      if (++nonfinite_in_a_row >= kMaxNonfiniteSteps)
        throw Error(o.name + ": the gradients' norm was " + std::to_string(grad_norm) + " at " +
                    std::to_string(kMaxNonfiniteSteps) + " steps in a row (up to step " + std::to_string(s + 1) +
                    "); nothing was written after the last good checkpoint (lower the learning rate?)");
      if (!quiet)
        std::cerr << "[" << o.name << "] step " << s + 1 << ": gradient norm " << grad_norm << ", step skipped\n";
    } else {
      nonfinite_in_a_row = 0;
    }
    result.last_loss = loss;
    const int64_t done = s + 1;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = static_cast<double>((done - start) * tokens_per_step) / std::max(elapsed, 1e-9);
    if (main_rank)
      append_metrics(o.run_dir, {{"stage", o.name}, {"step", done}, {"loss", loss}, {"lr", lr},
                                 {"grad_norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm) : nlohmann::json(nullptr)},
                                 {"skipped", !std::isfinite(grad_norm)}, {"tokens", done * tokens_per_step},
                                 {"tokens_per_s", tok_s}, {"elapsed_s", elapsed}});
    if (!quiet && (done % std::max<int64_t>(o.log_every, 1) == 0 || done == o.steps || done == start + 1)) {
      const double eta = elapsed / static_cast<double>(done - start) * static_cast<double>(o.steps - done);
      std::cerr << "[" << o.name << "] step " << done << "/" << o.steps << "  loss " << std::setprecision(5)
                << loss << "  lr " << std::setprecision(3) << lr << "  " << static_cast<int64_t>(tok_s)
                << " tok/s  ETA " << format_duration(eta) << "\n";
    }
    const bool last = done == o.steps;
    const bool snapshot = std::find(o.snapshot_steps.begin(), o.snapshot_steps.end(), done) != o.snapshot_steps.end();
    const bool out_of_time = o.deadline && std::chrono::steady_clock::now() >= *o.deadline && !last;
    if (last || snapshot || out_of_time || (o.checkpoint_every > 0 && done % o.checkpoint_every == 0))
      save(done, loss, last);
    if (snapshot && main_rank && !ckpt.empty()) {
      copy_flat_folder(ckpt, snapshot_dir(o.run_dir, o.name, done));
    }
    if ((o.stop_after > 0 && done == o.stop_after && !last) || out_of_time) {
      if (out_of_time && !quiet) std::cerr << "[" << o.name << "] stopped at step " << done << " (time limit); checkpoint written\n";
      result.steps_done = done;
      return result;
    }
  }
  result.steps_done = o.steps;
  result.finished = true;
  return result;
}

}  // namespace linearize
