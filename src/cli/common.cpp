#include "cli/common.h"

#include <filesystem>
#include <iostream>

#include "compat/device.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "train/data_parallel.h"

namespace linearize::cli {

namespace fs = std::filesystem;

torch::Device parse_device(const std::string& s) { return parse_device_name(s, "--device " + s); }

OptionSpec device_option() { return {"device", "DEV", "cpu, cuda or cuda:N", "cpu"}; }

std::unique_ptr<Tokenizer> model_tokenizer(const std::string& folder) {
  // A tokenizer folder without a model (tokenize --tokenizer) has no vocabulary to check against.
  if (!fs::exists(fs::path(folder) / "config.json")) return load_tokenizer(folder);
  return load_model_tokenizer(folder, LlamaConfig::load(folder));
}

std::vector<OptionSpec> training_options(const TrainLoopOptions& d, int64_t seq_len, bool with_schedule) {
  std::vector<OptionSpec> out = {
      {"seq-len", "N", "tokens per training sequence", default_text(seq_len)},
      {"batch", "N", "sequences per optimizer step", default_text(d.batch)},
      {"grad-accum", "N", "micro-batches per step (batch must be divisible by it)", default_text(d.grad_accum)},
      {"warmup", "F", "warmup fraction of the steps", default_text(d.schedule.warmup_frac)},
      {"weight-decay", "X", "AdamW weight decay (not on norms, biases, A_log, dt_bias)",
       default_text(d.optimizer.weight_decay)},
      {"clip", "X", "gradient-norm clipping (0: off)", default_text(d.clip)},
      {"seed", "S", "seed for initialisation and data order", default_text(static_cast<int64_t>(d.seed))},
      {"checkpoint-every", "N", "steps between checkpoints (0: end of each stage only)",
       default_text(d.checkpoint_every)},
      {"log-every", "N", "steps between progress lines", default_text(d.log_every)},
      {"resume", "", "continue from the run folder's checkpoints"},
      {"stop-after", "N", "stop after step N's checkpoint, as if killed (for testing resume)"},
      {"quiet", "", "no progress lines"},
      {"recompute", "", "recompute each layer's activations in backward: much less memory, one more forward pass per layer"},
      {"deterministic", "", "deterministic GPU algorithms only: the same run on the same kind of GPU gives the same weights; slower, and an op without one stops the run"},
      {"cuda-graph", "", "replay each optimizer step after the first as one CUDA graph: faster where launching kernels bounds the step (small models); CUDA only, not under data parallel"},
      {"config", "FILE", "JSON file with any of these options ({\"seq-len\": 512, ...})"},
      device_option(),
  };
  if (with_schedule) {
    out.insert(out.begin() + 3, {"lr", "X", "peak learning rate", default_text(d.schedule.lr)});
    out.insert(out.begin() + 4,
               {"schedule", "KIND", "learning-rate schedule: wsd, cosine, linear, constant", to_string(d.schedule.kind)});
  }
  return out;
}

TrainLoopOptions loop_options(const Args& args) {
  TrainLoopOptions o;
  o.batch = args.integer("batch");
  o.grad_accum = args.integer("grad-accum");
  if (args.knows("lr")) o.schedule.lr = args.number("lr");
  if (args.knows("schedule")) o.schedule.kind = parse_schedule_kind(args.str("schedule"), "--schedule");
  o.schedule.warmup_frac = args.number("warmup");
  o.optimizer.weight_decay = args.number("weight-decay");
  o.clip = args.number("clip");
  o.seed = static_cast<uint64_t>(args.integer("seed"));
  o.checkpoint_every = args.integer("checkpoint-every");
  o.log_every = args.integer("log-every");
  o.resume = args.flag("resume");
  o.recompute = args.flag("recompute");
  o.deterministic = args.flag("deterministic");
  if (args.has("stop-after")) o.stop_after = args.integer("stop-after");
  o.quiet = args.flag("quiet") || !is_main_process();  // under `launch`, rank 0 reports
  o.device = device_for_rank(parse_device(args.str("device")));
  if (args.flag("cuda-graph")) {
    if (!o.device.is_cuda()) throw Error("--cuda-graph needs --device cuda (got " + o.device.str() + ")");
    o.step_graph = TrainLoopOptions::StepGraph::cuda_graph;
  }
  if (o.batch < 1) throw Error("--batch must be at least 1");
  return o;
}

void write_json(const nlohmann::json& j, const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomic(path, [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

void emit(const nlohmann::json& j, const Args& args, const std::function<void()>& print_text) {
  if (args.has("out")) write_json(j, args.str("out"));
  if (args.flag("json")) std::cout << j.dump() << "\n";
  else print_text();
}

void progress_line(const std::string& what, int64_t done, int64_t total) {
  std::cerr << "\r" << what << " " << done << "/" << total << std::flush;
  if (done == total) std::cerr << "\n";
}

}  // namespace linearize::cli
