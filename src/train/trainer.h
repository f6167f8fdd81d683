// The training loop shared by pretraining, the three distillation stages and SFT: batches from a
// WindowLoader, gradient accumulation, clipping, the LR schedule, a progress line on stderr,
// metrics.jsonl, atomic checkpoints and exact resume. On CUDA the step runs under bf16 autocast while
// the parameters and the optimizer state stay fp32. In a process started by a launcher (RANK,
// WORLD_SIZE, ... in the environment; see data_parallel.h) the loop trains data parallel: each rank
// computes its share of every global batch, gradients are averaged across ranks, and only rank 0
// logs and writes checkpoints. `batch` stays the global batch, so results do not depend on the
// number of processes (up to fp32 round-off).
//
// What a step computes is the caller's StepFn: given a micro-batch (rows of the BatchSource, e.g.
// [b, seq_len + 1] token windows) it returns the scalar loss to differentiate. The loop owns
// everything else.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "train/batch_source.h"
#include "train/data_loader.h"
#include "train/optimizer_schedule.h"

namespace linearize {

struct TrainLoopOptions {
  std::string name = "train";  // stage name in logs and the checkpoint folder name
  int64_t steps = 1;           // optimizer steps
  int64_t batch = 8;           // sequences per optimizer step
  int64_t grad_accum = 1;      // micro-batches per step (batch must be divisible by it)
  double clip = 1.0;           // max global grad norm (<= 0: off)
  Schedule schedule;
  OptimizerOptions optimizer;
  std::string run_dir;         // holds checkpoint-<name>/ and metrics.jsonl
  int64_t checkpoint_every = 0;  // steps; 0: only at the end of the stage
  int64_t log_every = 10;
  bool resume = false;         // continue from checkpoint-<name> when it exists
  int64_t stop_after = -1;     // testing aid: return right after this step, as if killed then
                               // (only the scheduled checkpoints have been written)
  // A clean stop: once this time point has passed, the loop writes a checkpoint after the current step and
  // returns unfinished (--max-minutes of `study`); --resume continues exactly.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Steps after which a copy of the checkpoint is kept as checkpoint-<name>-step<N> (WSD branch points).
  std::vector<int64_t> snapshot_steps;
  torch::Device device = torch::kCPU;
  uint64_t seed = 0;
  bool quiet = false;
  bool recompute = false;  // the caller sets CausalLM::recompute from it (activation recomputation)
  // PyTorch's deterministic algorithms while the loop runs (and cuBLAS's fixed workspace): a rerun on the same
  // kind of GPU gives the same weights, bit for bit, where every op has a deterministic form.
  bool deterministic = false;
  // Each optimizer step after a run's first captured as one CUDA graph and replayed (train/graphed_train_step.h):
  // much faster where the host bounds the step (small models). The same results as the eager loop, to
  // the GPU's round-off. Not under data parallel; where a step cannot be captured, the loop says why once
  // and runs eagerly. eager: the graph's stand-in without a graph (tests).
  enum class StepGraph { off, cuda_graph, eager };
  StepGraph step_graph = StepGraph::off;
};

// The loop's defaults with another learning-rate schedule: the defaults of a command that trains with its
// own (pretraining and SFT: cosine).
inline TrainLoopOptions loop_with_schedule(ScheduleKind kind, double lr) {
  TrainLoopOptions o;
  o.schedule.kind = kind;
  o.schedule.lr = lr;
  return o;
}

struct TrainResult {
  double last_loss = 0;
  int64_t steps_done = 0;
  bool finished = false;  // false when stopped by stop_after or the deadline
  int64_t skipped_steps = 0;  // steps whose gradients were not finite (nothing updated)
  int64_t graphed_steps = 0;  // steps replayed from a captured graph (TrainLoopOptions::step_graph)
};

// The folder of the snapshot kept after `step` (TrainLoopOptions::snapshot_steps).
std::string snapshot_dir(const std::string& run_dir, const std::string& name, int64_t step);

using StepFn = std::function<torch::Tensor(const torch::Tensor& micro_batch)>;

// `module` is what the checkpoint saves and restores (all its parameters); `trainable` are the
// parameters the optimizer updates (with their names, for the weight-decay groups).
TrainResult run_training(torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& trainable,
                         BatchSource& data, const StepFn& step, const TrainLoopOptions& options);

// Appends one JSON object per line to run_dir/metrics.jsonl.
void append_metrics(const std::string& run_dir, const nlohmann::json& record);

}  // namespace linearize
