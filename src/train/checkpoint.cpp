#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/safetensors.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

void fsync_file(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The folder to read: `dir`, or `dir.old` when a swap was interrupted between its two renames.
fs::path readable(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "state.json")) return dir;
  fs::path old = dir + ".old";
  if (fs::exists(old / "state.json")) return old;
  throw Error(dir + ": no checkpoint (state.json missing)");
}

}  // namespace

void save_checkpoint(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     const nlohmann::json& state) {
  const fs::path target(dir), tmp(dir + ".tmp"), old(dir + ".old");
  {
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (auto& p : module.named_parameters(true)) params.emplace_back(p.key(), p.value());
    require_finite(params, "checkpoint " + dir);
  }
  remove_tree(tmp.string());
  fs::create_directories(tmp);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& p : module.named_parameters(true)) tensors.emplace_back(p.key(), p.value());
  save_safetensors((tmp / "model.safetensors").string(), tensors);
  torch::save(optimizer, (tmp / "optimizer.pt").string());
  fsync_file(tmp / "optimizer.pt");
  write_file_atomic((tmp / "state.json").string(), [&](std::ostream& o) { o << state.dump(2) << "\n"; });
  // Swap: target -> old, tmp -> target, drop old. A crash between the renames leaves `old`.
  remove_tree(old.string());
  if (fs::exists(target)) fs::rename(target, old);
  fs::rename(tmp, target);
  fsync_file(target.parent_path().empty() ? fs::path(".") : target.parent_path());
  remove_tree(old.string());
}

bool checkpoint_exists(const std::string& dir) {
  return fs::exists(fs::path(dir) / "state.json") || fs::exists(fs::path(dir + ".old") / "state.json");
}

nlohmann::json read_checkpoint_state(const std::string& dir) {
  const fs::path p = readable(dir) / "state.json";
  try {
    return nlohmann::json::parse(read_file(p.string()));
  } catch (const nlohmann::json::exception& e) {
    throw Error(p.string() + ": malformed checkpoint state: " + e.what());
  }
}

void load_checkpoint_weights(const std::string& dir, torch::nn::Module& module) {
  WeightStore store((readable(dir) / "model.safetensors").string());
  torch::NoGradGuard ng;
  for (auto& p : module.named_parameters(true))
    p.value().copy_(store.get(p.key(), p.value().scalar_type(), p.value().sizes().vec()));
}

nlohmann::json load_checkpoint(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  const fs::path where = readable(dir);
  load_checkpoint_weights(dir, module);
  torch::load(optimizer, (where / "optimizer.pt").string());
  return read_checkpoint_state(dir);
}

}  // namespace linearize
