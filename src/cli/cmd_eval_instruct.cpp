// linearize eval instruct: ROUGE-L of greedy answers to held-out self-instruct items (eval/instruct.h).
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/instruct.h"

namespace linearize::cli {

std::string default_instruct_data() {
  return (std::filesystem::path("..") / "shared" / "data" / "instruct" / "user_oriented_instructions.jsonl").string();
}

nlohmann::json run_instruct_eval(CausalLM& model, const Tokenizer& tok, const std::string& folder, const std::string& data,
                                 int64_t limit, int64_t max_new_tokens, const std::string& system) {
  InstructOptions o;
  o.data = data;
  o.limit = limit;
  o.max_new_tokens = max_new_tokens;
  o.system = system;
  return evaluate_instruct(model, tok, folder, o,
                           [](int64_t done, int64_t total) { progress_line("instruct:", done, total); });
}

int eval_instruct(const std::vector<std::string>& argv) {
  CommandSpec spec{"eval instruct",
                   "Instruction following: greedy answers (ChatML) to held-out self-instruct items, scored by\n"
                   "ROUGE-L F-measure against the reference output (as the self-instruct paper), mean reported.",
                   "",
                   "The default data are the 252 user-oriented instructions (not in seed_tasks.jsonl, which\n"
                   "SFT examples train on). One item per record (its first instance).",
                   {{"model", "DIR", "model folder (fine-tuned with `linearize sft`)", "", true},
                    {"data", "FILE", "jsonl items (self-instruct, instruction/output or messages)", default_instruct_data()},
                    {"limit", "N", "score only the first N items"},
                    {"max-new-tokens", "N", "answer length at most", "128"},
                    {"system", "TEXT", "system prompt (default: none)"},
                    {"json", "", "print the results JSON on stdout"},
                    {"out", "FILE", "also write the results JSON to FILE"},
                    device_option()},
                   0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.str("model");
  LoadOptions lo;
  lo.device = parse_device(args.str("device"));
  lo.inference = true;
  auto model = load_model(folder, lo);
  auto tok = model_tokenizer(folder);
  auto r = run_instruct_eval(model, *tok, folder, args.str("data"), args.has("limit") ? args.integer("limit") : 0,
                             args.integer("max-new-tokens"), args.maybe("system").value_or(""));
  emit(r, args, [&] {
    std::cout << "instruct ROUGE-L " << 100 * r["rouge_l"].get<double>() << " over " << r["items"] << " items\n";
  });
  return 0;
}

}  // namespace linearize::cli
