// The report of a study (OUT/report): the study's tables and figures from OUT/results/*.json and the
// teachers' evaluations, every number from the files, so a report can be rewritten at any time.
//   - recovery per mixer and teacher scale (task recovery where zero-shot tasks ran, perplexity recovery =
//     teacher ppl / student ppl always), at the largest budget;
//   - the perplexity gap to the teacher (student ppl / teacher ppl - 1) per mixer against scale
//     (gap_by_scale.svg; the study: linear attention's gap widens from 14% to 20%);
//   - NIAH per task and teacher: a table and a heatmap of mixer x length (niah_<task>_<teacher>.svg);
//   - recovery against distillation tokens, one line per mixer (budget_<teacher>.svg);
//   - the rank agreement (Spearman) of our S-NIAH-1 ordering at the length nearest 2k with the study's;
//   - a few sentences on what the numbers show, computed from them;
//   - results.json: every result.
#pragma once
#include <string>

#include "study/study_spec.h"

namespace linearize {

void write_study_report(const StudySpec& spec, const std::string& out, const std::string& report_dir);

}  // namespace linearize
