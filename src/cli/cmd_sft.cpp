// linearize sft: supervised fine-tuning of a teacher or student on conversations (ChatML, loss on
// assistant tokens only; see distill/sft.h).
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sft_options.h"

namespace linearize::cli {

std::vector<OptionSpec> sft_options() {
  return {{"system", "TEXT", "default system prompt for conversations without one (default: the template's)"},
          {"epochs", "N", "passes over the data (may be fractional)", "1"},
          {"packing", "", "pack several conversations into each row (no attention or state crosses a boundary)"},
          {"max-steps", "N", "stop after at most N optimizer steps"}};
}

SftOptions sft_settings(const Args& args) {
  SftOptions o;
  if (args.has("system")) o.system = args.str("system"), o.system_given = true;
  o.epochs = args.number("epochs");
  o.packing = args.flag("packing");
  if (args.has("max-steps")) o.max_steps = args.integer("max-steps");
  o.seq_len = args.integer("seq-len");
  o.loop = loop_options(args);
  return o;
}

int cmd_sft(const std::vector<std::string>& argv) {
  CommandSpec spec{
      "sft",
      "Supervised fine-tuning of a teacher or student model folder on conversations: the ChatML\n"
      "template (<|im_start|>role\\n...<|im_end|>), next-token loss on the assistant tokens only.",
      "",
      "Data: jsonl, one record per line: {\"messages\": [{\"role\", \"content\"}, ...]} (smoltalk),\n"
      "{\"instruction\", \"input\", \"output\"} or self-instruct's {\"instruction\", \"instances\": [...]}.\n"
      "The model folder's chat template is used when its tokenizer_config.json carries a ChatML one; any\n"
      "other template is reported and ChatML used. A tokenizer without <|im_start|>/<|im_end|> gets them\n"
      "as new special tokens (the embedding grows; the output folder's tokenizer files record them).\n"
      "Checkpoints, --resume and OUT/metrics.jsonl work as in pretrain and distill.",
      {{"model", "DIR", "model folder (teacher or student)", "", true},
       {"data", "FILE", "jsonl conversations or instruction records", "", true},
       {"out", "DIR", "fine-tuned model folder to write", "", true}},
      0,
      0};
  for (auto& opt : sft_options()) spec.options.push_back(opt);
  const SftOptions defaults;
  for (auto& opt : training_options(defaults.loop, defaults.seq_len, true)) spec.options.push_back(opt);
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  if (args.has("config")) args.apply_config_file(args.str("config"));
  SftOptions o = sft_settings(args);
  o.model = args.str("model");
  o.data = args.str("data");
  o.out = args.str("out");
  auto r = run_sft(o);
  if (!r.finished) std::cerr << "[sft] stopped early (--stop-after); resume with --resume\n";
  return 0;
}

}  // namespace linearize::cli
