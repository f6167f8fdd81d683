// linearize export / import: a student folder in another library's format and back (model/fla_export.h).
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/error.h"
#include "model/fla_export.h"

namespace linearize::cli {

namespace {
// --format: fla is the one format there is.
void require_fla_format(const Args& args) {
  if (args.str("format") != "fla") throw Error("--format: unknown format \"" + args.str("format") + "\" (expected fla)");
}
}  // namespace

int cmd_export(const std::vector<std::string>& argv) {
  CommandSpec spec{"export",
                   "Write a student as a Hugging Face folder another library loads. --format fla: flash-linear-\n"
                   "attention's model classes (its config.json and parameter names), for students of the six\n"
                   "mixers fla has (not mLSTM); whatever fla cannot express is refused with the reason, never changed.",
                   "STUDENT_DIR OUT",
                   "After `import fla.models`, transformers' AutoModelForCausalLM.from_pretrained(OUT) loads it.",
                   {{"format", "NAME", "the target: fla", "fla"}},
                   2,
                   2};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  require_fla_format(args);
  const auto& pos = args.positional();
  const auto config = export_fla(pos[0], pos[1]);
  std::cerr << "[export] wrote " << pos[1] << " (fla " << config["model_type"].get<std::string>() << ")\n";
  return 0;
}

int cmd_import(const std::vector<std::string>& argv) {
  CommandSpec spec{"import",
                   "Read another library's model folder as a student folder. --format fla: a flash-linear-\n"
                   "attention model (linear_attn, retnet, gla, delta_net, gated_deltanet, kda) without hybrid\n"
                   "layers; settings our mixers lack are refused with the reason.",
                   "FLA_DIR OUT",
                   "The student folder works with every command that reads a student (generate, eval, serve, distill).",
                   {{"format", "NAME", "the source: fla", "fla"}},
                   2,
                   2};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  require_fla_format(args);
  const auto& pos = args.positional();
  import_fla(pos[0], pos[1]);
  std::cerr << "[import] wrote " << pos[1] << "\n";
  return 0;
}

}  // namespace linearize::cli
