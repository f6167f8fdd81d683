#include "compat/device.h"

#include "io/error.h"

namespace linearize {

torch::Device parse_device_name(const std::string& name, const std::string& what) {
  if (name == "cpu") return torch::kCPU;
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      throw Error(what + ": CUDA is not available in this build or on this machine (use --device cpu)");
    return torch::Device(name);
  }
  throw Error(what + ": expected cpu, cuda or cuda:N");
}

}  // namespace linearize
