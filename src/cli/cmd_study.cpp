// linearize study: run a study's grid (study/study.h) from a file or a built-in preset.
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "study/study.h"

namespace linearize::cli {

namespace fs = std::filesystem;

int cmd_study(const std::vector<std::string>& argv) {
  CommandSpec spec{
      "study",
      "Run a study: teachers x mixers x variants x token budgets x seeds, each cell distilled, evaluated\n"
      "(perplexity, zero-shot tasks, NIAH) and compared with its own teacher, then the study's tables and\n"
      "figures in OUT/report. Resumable: finished cells are skipped, a killed cell continues from its\n"
      "checkpoints, and --max-minutes stops at a safe point so that a long study runs as several calls.",
      "[STUDY.json]",
      "presets (--preset NAME; --write FILE writes one out to copy and edit):\n"
      "  mini   CPU, about 15 minutes on 2 cores: three tiny teachers the study trains, seven mixers each\n"
      "  gpu    one H100/H200, about 40 minutes: teachers t-10m, t-40m and t-150m (6.5M, 27M and 94M\n"
      "         parameters) trained by the study on ../shared/data prose and retrieval episodes, seven mixers\n"
      "         each (--device cuda; --only t-10m runs one teacher's row)\n"
      "  paper  the study's grid on your SmolLM2-135M/360M/1.7B folders (--teachers A,B,C) and tokens (--data)\n"
      "The file format is in src/study/study_spec.h and docs/study.md.",
      {{"preset", "NAME", "run a built-in study instead of a file: mini, gpu or paper"},
       {"write", "FILE", "write the preset's study file and exit"},
       {"teachers", "LIST", "paper preset: the three teacher folders"},
       {"data", "PATH", "paper preset: the distillation data (token dataset or mixture)"},
       {"base", "DIR", "presets: the folder their relative paths start from (default ../shared/data)"},
       {"out", "DIR", "output folder (default runs/<study name>)"},
       {"only", "LIST", "run only cells whose id contains one of these (e.g. gated_deltanet,t-10m__gla)"},
       {"max-minutes", "M", "stop cleanly after about M minutes; run again to continue"},
       {"report-only", "", "rewrite the report from the results present"},
       {"cuda-graph", "", "replay each training step after a run's first as one CUDA graph (faster for small models; CUDA only)"},
       device_option()},
      0,
      1};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  StudySpec study;
  if (args.has("preset")) {
    if (!args.positional().empty()) throw Error("give a study file or --preset, not both");
    auto j = study_preset(args.str("preset"), args.has("teachers") ? args.str_list("teachers") : std::vector<std::string>{});
    if (args.has("data")) j["data"] = args.str("data");
    if (args.has("write")) {
      write_file_atomic(args.str("write"), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
      std::cerr << "wrote " << args.str("write") << "\n";
      return 0;
    }
    const std::string base = args.has("base") ? args.str("base") : (fs::path("..") / "shared" / "data").string();
    study = parse_study(j, "preset " + args.str("preset"), base);
  } else {
    if (args.positional().empty()) throw Error("linearize study: give a study file or --preset NAME (see --help)");
    study = read_study(args.positional()[0]);
  }
  StudyOptions o;
  if (args.has("out")) o.out = args.str("out");
  if (args.has("only")) o.only = args.str_list("only");
  if (args.has("max-minutes")) o.max_minutes = args.number("max-minutes");
  if (args.has("device")) o.device = args.str("device");
  o.report_only = args.flag("report-only");
  o.cuda_graph = args.flag("cuda-graph");
  const auto r = run_study(study, o);
  return r.finished || o.max_minutes > 0 ? 0 : 1;
}

}  // namespace linearize::cli
