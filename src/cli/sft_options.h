// The SFT options shared by `linearize sft` and `linearize distill --recipe instruct` (cmd_sft.cpp).
#pragma once
#include <vector>

#include "cli/args.h"
#include "distill/sft.h"

namespace linearize::cli {

// --system, --epochs, --packing, --max-steps
std::vector<OptionSpec> sft_options();
// Those options plus the shared training options (seq-len, batch, lr, schedule, ...).
SftOptions sft_settings(const Args& args);

}  // namespace linearize::cli
