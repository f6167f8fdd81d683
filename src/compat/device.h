// The devices users name (--device, a study file's "device"): cpu, cuda or cuda:N.
#pragma once
#include <torch/torch.h>

#include <string>

namespace linearize {

// The device `name` stands for. `what` names where it came from, for the errors ("--device cuda", "s.json:
// device \"cuda\""): one for a name that is none of those, one for CUDA on a build or machine without it.
torch::Device parse_device_name(const std::string& name, const std::string& what);

}  // namespace linearize
