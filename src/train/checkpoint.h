// Training checkpoints: a folder holding the module's parameters (model.safetensors), the optimizer
// state (optimizer.pt, torch's archive) and state.json (step, data position, seed, whether the stage
// finished). Written atomically: the new folder is written under a temporary name, fsynced, and
// swapped in by rename, so a run killed at any moment leaves the previous checkpoint or the new one.
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>

namespace linearize {

void save_checkpoint(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     const nlohmann::json& state);

// True when a checkpoint exists at `dir` (or its previous copy survived an interrupted swap).
bool checkpoint_exists(const std::string& dir);

// Reads state.json only.
nlohmann::json read_checkpoint_state(const std::string& dir);

// Restores parameters (by name and shape) and optimizer state; returns state.json.
nlohmann::json load_checkpoint(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer);

// Parameters only (e.g. to carry a finished stage's weights into the next stage).
void load_checkpoint_weights(const std::string& dir, torch::nn::Module& module);

}  // namespace linearize
