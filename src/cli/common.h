// Pieces shared by several commands: device selection, model loading with a progress line, and the
// BOS convention of a model's tokenizer.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "io/tokenizer.h"
#include "model/model_io.h"
#include "train/trainer.h"

namespace linearize::cli {

// --device cpu|cuda|cuda:N (cuda refused with a clear message when this build or machine has none).
torch::Device parse_device(const std::string& s);
OptionSpec device_option();

// The model folder's tokenizer, or an error naming the folder.
std::unique_ptr<Tokenizer> model_tokenizer(const std::string& folder);

// Options every training command shares (seq-len, batch, lr, schedule, checkpoints, resume, ...), their
// defaults shown from the command's own: `defaults` (its loop options) and `seq_len`. --lr and --schedule
// only when `with_schedule` (distill has one per stage instead).
std::vector<OptionSpec> training_options(const TrainLoopOptions& defaults, int64_t seq_len, bool with_schedule);
// The loop options those flags describe (name, steps and run_dir are left to the caller).
TrainLoopOptions loop_options(const Args& args);

// Results of the eval commands: written to --out FILE (atomically, folders created) when given,
// printed as one JSON line with --json, else as text by `print_text`.
void write_json(const nlohmann::json& j, const std::string& path);
void emit(const nlohmann::json& j, const Args& args, const std::function<void()>& print_text);

// "\r<what> done/total" on stderr, ending the line when done == total.
void progress_line(const std::string& what, int64_t done, int64_t total);

}  // namespace linearize::cli
