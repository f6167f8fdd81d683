// linearize report RESULTS.json... --out DIR: the Markdown tables and SVG figures of report/markdown.h
// from results written by `linearize eval tasks|niah|all`. Reads and writes files only, runs no model.
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "report/markdown.h"

namespace linearize::cli {

int cmd_report(const std::vector<std::string>& argv) {
  CommandSpec spec{"report",
                   "Markdown table (models x tasks, average, recovery when a teacher result is given) and SVG\n"
                   "figures (NIAH heatmaps, recovery bars, recovery vs scale/tokens) from results JSON files.",
                   "RESULTS.json...",
                   "A result with \"role\": \"teacher\" (written by `eval all --teacher`) is the reference for\n"
                   "recovery; results with \"scale\" or \"tokens\" fields also get a line chart per mixer.",
                   {{"out", "DIR", "output folder", "report"}},
                   1, 1000};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const auto inputs = load_report_inputs(args.positional());
  for (const auto& path : write_report(inputs, args.str("out"))) std::cout << "wrote " << path << "\n";
  return 0;
}

}  // namespace linearize::cli
