// `linearize study`: runs a study's grid (study/study_spec.h) with the same code as the regular
// commands, and writes its report.
//
// OUT/ (default runs/<study name>):
//   study.json                   the study as run (paths resolved)
//   tokenizer/, data/            the tokenizer trained for pretrained teachers, the mixture, held-out text
//   teachers/<name>/             teachers the study trains (pretrain, resumable); <name>.eval.json their
//                                evaluation, computed once
//   runs/<cell>/                 one distillation per teacher x mixer x variant x seed (the largest budget;
//                                checkpoints, metrics.jsonl), runs/<cell>/budget-<tokens>/ the WSD branches
//   results/<cell>__<tokens>.json  one result per student and budget: teacher (path and content hash),
//                                mixer, variant, budget, seed, every metric, recovery against its own teacher
//   report/                      report.md, results.json, SVG figures (study/study_report.h)
// Finished results are skipped; a killed run continues from its checkpoints; with max_minutes the study
// stops at a safe point (a checkpoint after a training step, or between evaluations) and says so, so
// that a long study runs as several bounded calls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "study/study_spec.h"

namespace linearize {

struct StudyOptions {
  std::string out;                // default runs/<name>
  std::vector<std::string> only;  // run only cells whose id contains one of these (empty: all)
  double max_minutes = 0;         // 0: no limit
  std::string device;             // overrides the study's "device" when not empty
  bool report_only = false;       // rewrite the report from the results present
  bool cuda_graph = false;        // every training step after a run's first replayed from a CUDA graph (CUDA only)
};

struct StudyOutcome {
  bool finished = false;    // every selected cell has its results
  int64_t results = 0;      // result files present
  int64_t expected = 0;     // result files the selection asks for
  std::string report_dir;
};

StudyOutcome run_study(const StudySpec& spec, const StudyOptions& options);

// A short content hash of a model folder (FNV-1a 64 over config.json and the weight files' sizes and
// first and last MiB), recorded with every result so that results of another teacher are not mixed up.
std::string model_fingerprint(const std::string& folder);

}  // namespace linearize
