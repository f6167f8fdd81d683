// linearize eval <what>: evaluation commands. `eval ppl` scores held-out text.
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/perplexity.h"
#include "io/error.h"
#include "io/token_shards.h"

namespace linearize::cli {

namespace {

int eval_ppl(const std::vector<std::string>& argv) {
  CommandSpec spec{"eval ppl",
                   "Next-token perplexity over consecutive non-overlapping windows of N tokens (each window\n"
                   "scored from its first token).",
                   "",
                   "",
                   {{"model", "DIR", "model folder", "", true},
                    {"data", "FILE", ".u32 token shard, or .txt/.jsonl text tokenized with the model's tokenizer", "", true},
                    {"seq-len", "N", "window length in tokens", "512"},
                    {"batch", "B", "windows per forward pass", "8"},
                    {"max-tokens", "N", "score at most the first N tokens of the data"},
                    {"json", "", "print {\"nll\", \"ppl\", \"tokens\"} as JSON"},
                    device_option()},
                   0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.str("model");
  const int64_t seq_len = args.integer("seq-len"), batch = args.integer("batch");
  LoadOptions lo;
  lo.device = parse_device(args.str("device"));
  auto model = load_model(folder, lo);
  std::unique_ptr<Tokenizer> tok;
  const std::string data = args.str("data");
  if (data.size() < 4 || data.substr(data.size() - 4) != ".u32") tok = model_tokenizer(folder);
  const int64_t eos = model->config.eos_token_ids.empty() ? -1 : model->config.eos_token_ids[0];
  auto tokens = load_tokens(data, tok.get(), eos, model->config.vocab_size);
  if (args.has("max-tokens") && static_cast<int64_t>(tokens.size()) > args.integer("max-tokens"))
    tokens.resize(args.integer("max-tokens"));
  const bool json = args.flag("json");
  auto r = perplexity(model, tokens, seq_len, batch, [&](int64_t done, int64_t total) {
    if (!json) std::cerr << "\rscoring windows " << done << "/" << total << std::flush;
  });
  if (!json) std::cerr << "\n";
  nlohmann::json j = {{"nll", r.nll}, {"ppl", r.ppl}, {"tokens", r.tokens}};
  if (json) std::cout << j.dump() << "\n";
  else std::cout << "nll " << r.nll << "  ppl " << r.ppl << "  tokens " << r.tokens << "\n";
  return 0;
}

}  // namespace

int cmd_eval(const std::vector<std::string>& argv) {
  const std::string usage = "usage: linearize eval ppl [options]   (run `linearize eval ppl --help`)\n";
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << usage;
    return argv.empty() ? 2 : 0;
  }
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] == "ppl") return eval_ppl(rest);
  throw Error("linearize eval: unknown evaluation \"" + argv[0] + "\" (available: ppl)");
}

}  // namespace linearize::cli
