// The path of the running linearize executable, for commands that start copies of it (launch, demo).
#pragma once
#include <string>

namespace linearize::cli {

std::string self_exe();

}  // namespace linearize::cli
