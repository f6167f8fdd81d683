// Precompiled header for every translation unit of the library, the tool, tests and benchmarks.
// Holds only the heavy third-party headers; project headers stay out so that editing them does not
// rebuild the precompiled header.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
