// linearize generate: stream text from a teacher (KV cache) or student (recurrent state).
#include <chrono>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "infer/generate.h"

namespace linearize::cli {

int cmd_generate(const std::vector<std::string>& argv) {
  CommandSpec spec{"generate",
                   "Generate text from a model folder, streaming tokens as they are chosen.\n"
                   "Greedy by default; --temperature/--top-p/--seed sample instead.",
                   "",
                   "",
                   {{"model", "DIR", "model folder (teacher or student)", "", true},
                    {"prompt", "TEXT", "prompt text (empty: start from BOS)", ""},
                    {"max-new-tokens", "N", "tokens to generate", "128"},
                    {"greedy", "", "pick the most likely token (the default)"},
                    {"temperature", "T", "sample with this temperature"},
                    {"top-p", "P", "nucleus sampling mass", "1.0"},
                    {"seed", "S", "random seed for sampling", "0"},
                    {"ignore-eos", "", "keep generating after the end-of-sequence token"},
                    {"stats", "", "print tokens/s and state memory to stderr at the end"},
                    device_option()},
                   0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.str("model");
  const int64_t max_new_tokens = args.integer("max-new-tokens");
  LoadOptions lo;
  lo.device = parse_device(args.str("device"));
  lo.inference = true;
  auto model = load_model(folder, lo);
  auto tok = model_tokenizer(folder);
  const std::string prompt = args.maybe("prompt").value_or("");
  std::vector<int32_t> ids = prompt_prefix(model->config, *tok, prompt.empty());
  auto body = tok->encode(prompt, true);
  ids.insert(ids.end(), body.begin(), body.end());

  GenerateOptions go;
  go.max_new_tokens = max_new_tokens;
  if (args.has("temperature") && !args.flag("greedy")) {
    go.sampling.greedy = false;
    go.sampling.temperature = args.number("temperature");
    go.sampling.top_p = args.number("top-p");
    go.sampling.seed = static_cast<uint64_t>(args.integer("seed"));
  }
  if (!args.flag("ignore-eos")) go.stop_ids = model->config.eos_token_ids;

  std::cout << prompt << std::flush;
  StreamDecoder stream(*tok);
  const bool bos_first = !ids.empty() && model->config.bos_token_id && ids[0] == *model->config.bos_token_id;
  // After a lone BOS the first piece is decoded as the start of a text.
  for (size_t i = bos_first ? 1 : 0; i < ids.size(); ++i) stream.push(ids[i]);
  auto t0 = std::chrono::steady_clock::now();
  ModelState state = model->new_state();
  auto out = generate(model, ids, go, [&](int32_t id) {
    if (std::find(go.stop_ids.begin(), go.stop_ids.end(), id) != go.stop_ids.end()) return;
    std::cout << stream.push(id) << std::flush;
  }, &state);
  std::cout << stream.flush() << "\n";
  if (args.flag("stats")) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << out.size() << " tokens in " << s << " s (" << out.size() / s << " tokens/s), state "
              << state_bytes(state) / 1024.0 << " KiB\n";
  }
  return 0;
}

}  // namespace linearize::cli
