// linearize export / import: a student folder in another library's format and back (model/fla_export.h).
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/error.h"
#include "io/safetensors.h"
#include "model/fla_export.h"
#include "model/model_io.h"

namespace linearize::cli {

namespace {
// --format: fla is the one format there is.
void require_fla_format(const Args& args) {
  if (args.str("format") != "fla") throw Error("--format: unknown format \"" + args.str("format") + "\" (expected fla)");
}

// OUT/reference_logits.safetensors: `input_ids` [2, n] (drawn from the vocabulary with a fixed seed) and
// our fp32 `logits` [2, n, vocab] for them, so that the other library's load can be checked where it runs
// (scripts/check_fla_export.py).
void write_reference_logits(const std::string& student_dir, const std::string& out, int64_t n) {
  torch::NoGradGuard no_grad;
  auto model = load_model(student_dir);
  model->eval();
  torch::manual_seed(0);
  const auto ids = torch::randint(0, model->config.vocab_size, {2, n}, torch::kLong);
  const auto logits = model->forward(ids).to(torch::kFloat).contiguous();
  save_safetensors(out + "/reference_logits.safetensors", {{"input_ids", ids}, {"logits", logits}},
                   {{"format", "pt"}, {"source", student_dir}});
}
}  // namespace

int cmd_export(const std::vector<std::string>& argv) {
  CommandSpec spec{"export",
                   "Write a student as a Hugging Face folder another library loads. --format fla: flash-linear-\n"
                   "attention's model classes (its config.json and parameter names), for students of the six\n"
                   "mixers fla has (not mLSTM), hybrids as fla's \"attn\" layers (fla needs flash-attn for them);\n"
                   "whatever fla cannot express is refused with the reason, never changed.",
                   "STUDENT_DIR OUT",
                   "After `import fla.models`, transformers' AutoModelForCausalLM.from_pretrained(OUT) loads it.",
                   {{"format", "NAME", "the target: fla", "fla"},
                    {"reference-logits", "N",
                     "also write reference_logits.safetensors: 2 x N seeded token ids and our fp32 logits for them "
                     "(check the load with scripts/check_fla_export.py; 0: none)",
                     "0"}},
                   2,
                   2};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  require_fla_format(args);
  const int64_t n = args.integer("reference-logits");
  if (n < 0 || n > 65536) throw Error("--reference-logits: expected 0 .. 65536 tokens, got " + std::to_string(n));
  const auto& pos = args.positional();
  const auto config = export_fla(pos[0], pos[1]);
  if (n > 0) write_reference_logits(pos[0], pos[1], n);
  std::cerr << "[export] wrote " << pos[1] << " (fla " << config["model_type"].get<std::string>() << ")\n";
  return 0;
}

int cmd_import(const std::vector<std::string>& argv) {
  CommandSpec spec{"import",
                   "Read another library's model folder as a student folder. --format fla: a flash-linear-\n"
                   "attention model (linear_attn, retnet, gla, delta_net, gated_deltanet, kda), hybrids (one \"attn\"\n"
                   "spec) included; settings our mixers lack are refused with the reason.",
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
