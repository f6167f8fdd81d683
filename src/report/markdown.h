// The evaluation report: results JSONs (from `linearize eval tasks/all`, schema in eval/tasks.h and
// eval/niah.h) in, a Markdown file and the SVG figures it links out.
//   - a table of models x tasks (headline metric in %), the average, and the recovery % when a
//     teacher result (role "teacher") is among the inputs or a result carries "recovery";
//   - one NIAH table per task (accuracy per length) and a heatmap figure per model and task;
//   - a bar chart of recovery per model (label, with the mixer when known);
//   - a line chart of recovery (or the average when there is no teacher) against "scale" and against
//     "tokens", one line per mixer, when results carry those fields.
// Not done: statistical tests, per-task charts, HTML output.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace linearize {

struct ReportInput {
  std::string name;      // display name (label or model folder name)
  std::string source;    // file it was read from
  nlohmann::json results;
  bool teacher = false;
};

// Reads results files; errors name the file and the missing field.
std::vector<ReportInput> load_report_inputs(const std::vector<std::string>& paths);

// Recovery % of `input` against its own teacher among `all` (the teacher input whose "model" is the
// student's "teacher"; with none recorded, the only teacher input), else its own "recovery"; negative
// when neither is available. A student is never compared with another teacher than its own.
double report_recovery(const ReportInput& input, const std::vector<ReportInput>& all);

// Figures as (file name, SVG text).
std::vector<std::pair<std::string, std::string>> report_figures(const std::vector<ReportInput>& inputs);

// The Markdown text; `figures` are the file names to link (relative to the report).
std::string markdown_report(const std::vector<ReportInput>& inputs, const std::vector<std::string>& figures);

// Writes DIR/report.md and the figures; returns the paths written.
std::vector<std::string> write_report(const std::vector<ReportInput>& inputs, const std::string& dir);

}  // namespace linearize
