// What the study reports, for comparing our runs with it, and the rank statistic the comparison uses.
//   S-NIAH-1 at 2k tokens, SmolLM2-1.7B students (the study's NIAH table): Gated DeltaNet 81.8, mLSTM 25.2,
//   KDA 2.0, DeltaNet, GLA, linear attention and RetNet 0.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace linearize {

// Mixer name -> the study's S-NIAH-1 accuracy (%) at 2k tokens.
const std::map<std::string, double>& study_niah_2k();

// Ranks of `values` (1 = smallest), ties sharing the mean of their ranks.
std::vector<double> average_ranks(const std::vector<double>& values);

// Spearman's rank correlation of two equally long lists (Pearson's on the average ranks); NaN when either
// list is constant or they have fewer than two entries.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace linearize
