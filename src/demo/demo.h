// `linearize demo`: the whole study in miniature with nothing downloaded.
//   1. generate English-like training text with planted key-value facts (data/synthetic_text.h), held-out
//      documents; recall is RULER's S-NIAH-1 at 160 tokens up to 4x the teacher's training window;
//   2. train a byte-level BPE tokenizer on it and pretrain a small Llama teacher;
//   3. linearize the teacher into all seven mixers (three stages, small budgets);
//   4. evaluate teacher and students: held-out perplexity, recall accuracy per context length,
//      recovery % (student score / teacher score);
//   5. print the comparison table and write a report folder (report.md, results.json, SVG figures).
// Every step is also reachable alone through the regular commands (tokenizer train, pretrain, distill,
// eval); the run folder keeps each step's inputs and outputs, and a second run reuses finished steps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace linearize {

struct DemoOptions {
  std::string out = "runs/demo";
  bool quick = false;
  uint64_t seed = 0;
  std::vector<std::string> mixers;  // empty: all seven
  torch::Device device = torch::kCPU;
  // The linearize executable. When set, on the CPU the students are distilled by child processes of
  // `program distill` with one thread each, `jobs` at a time (0: one per core); otherwise one after
  // another in this process. Both give the same students bit for bit.
  std::string program;
  int64_t jobs = 0;
};

struct DemoRow {
  std::string model;       // "teacher" or a mixer name
  double heldout_ppl = 0;
  std::vector<std::pair<int64_t, double>> recall;  // (context length, accuracy)
  double recall_mean = 0;
  double ppl_recovery = 0;     // teacher ppl / student ppl x 100
  double recall_recovery = 0;  // mean recall student / teacher x 100
  double seconds = 0;          // distillation time
};

// Runs everything; returns the table rows (teacher first).
std::vector<DemoRow> run_demo(const DemoOptions& options);

}  // namespace linearize
