// Training mixtures (train/training_data.h) that teach a small Llama to retrieve, shared by the demo and
// the built-in studies.
#pragma once
#include <nlohmann/json.hpp>

namespace linearize {

// 128-token windows of mostly copy drills (70%), short RULER-form retrieval episodes with one needle (25%)
// and English-like text (5%): a 2-layer teacher of hidden 64 learns to retrieve from it in 4000 steps of
// 4 windows (the quick demo's and the mini study's teachers).
nlohmann::json copy_drill_mixture();

}  // namespace linearize
