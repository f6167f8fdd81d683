// linearize demo: the README's main job on its built-in default: the whole study in miniature with
// nothing downloaded (see src/demo/demo.h for the steps).
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "compat/child_process.h"
#include "demo/demo.h"
#include "io/error.h"

namespace linearize::cli {

int cmd_demo(const std::vector<std::string>& argv) {
  CommandSpec spec{
      "demo",
      "The study in miniature, from nothing: generate a text corpus with planted facts, train a BPE\n"
      "tokenizer and a small Llama teacher, linearize it into all seven mixers (three distillation\n"
      "stages each), evaluate held-out perplexity, recall (RULER's S-NIAH-1, from 160 tokens to 4x\n"
      "the teacher's window) and recovery, print the comparison and write a report folder.",
      "",
      "About 11 minutes on 2 CPU cores (--quick: about 2). A second run with the same --out reuses the\n"
      "finished steps. Each step is also a regular command: tokenizer train, pretrain, distill, eval.",
      {{"out", "DIR", "run folder (data, tokenizer, teacher, students, report)", "runs/demo"},
       {"quick", "", "smaller corpus, models and budgets (about 2 minutes)"},
       {"seed", "S", "seed of the corpus, initialisation and data order", "0"},
       {"mixers", "LIST", "only these mixers (default: all seven)"},
       {"jobs", "N", "students distilled at once on the CPU, one process and thread each (default: one per core)"},
       device_option()},
      0,
      0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  DemoOptions o;
  o.out = args.str("out");
  o.quick = args.flag("quick");
  o.seed = static_cast<uint64_t>(args.integer("seed"));
  if (args.has("mixers")) o.mixers = args.str_list("mixers");
  o.device = parse_device(args.str("device"));
  o.program = self_exe();
  if (args.has("jobs")) {
    o.jobs = args.integer("jobs");
    if (o.jobs < 1) throw Error("demo: --jobs must be at least 1, got " + std::to_string(o.jobs));
  }
  run_demo(o);
  return 0;
}

}  // namespace linearize::cli
