// linearize chat: a terminal conversation with a fine-tuned model (see infer/chat.h). Lines from stdin
// are user turns; /reset starts over (back to the system prompt), /exit or end of input ends. Works
// with stdin as a pipe: each reply is printed on stdout followed by a newline.
#include <unistd.h>

#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "infer/chat.h"
#include "io/chat_template.h"

namespace linearize::cli {

int cmd_chat(const std::vector<std::string>& argv) {
  CommandSpec spec{"chat",
                   "Chat with a model in the terminal: the ChatML template applied, replies streamed. A student\n"
                   "keeps its fixed-size state from turn to turn (a teacher its KV cache): no turn is re-encoded.",
                   "",
                   "Commands: /reset (forget the conversation), /exit. Reads stdin line by line, so a script can\n"
                   "pipe a conversation in: printf 'Hi\\nAnd then?\\n' | linearize chat --model DIR",
                   {{"model", "DIR", "model folder (fine-tuned with `linearize sft`)", "", true},
                    {"system", "TEXT", "system prompt (default: the template's default, if any)"},
                    {"max-new-tokens", "N", "tokens per reply at most", "256"},
                    {"temperature", "T", "sample with this temperature (default: greedy)"},
                    {"top-p", "P", "nucleus sampling mass", "1.0"},
                    {"seed", "S", "random seed for sampling", "0"},
                    {"stats", "", "print the state size after each reply to stderr"},
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
  std::string note;
  auto format = chat_format_for(folder, &note);
  ChatOptions co;
  co.system = args.has("system") ? args.str("system") : format.default_system;
  co.max_new_tokens = args.integer("max-new-tokens");
  if (args.has("temperature")) {
    co.sampling.greedy = false;
    co.sampling.temperature = args.number("temperature");
    co.sampling.top_p = args.number("top-p");
    co.sampling.seed = static_cast<uint64_t>(args.integer("seed"));
  }
  ChatSession chat(model, *tok, folder, co);
  const bool tty = isatty(STDIN_FILENO);
  if (tty) std::cerr << "[chat] " << folder << ": " << note << ". /reset to start over, /exit to leave.\n";
  std::string line;
  while (true) {
    if (tty) std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      chat.reset();
      if (tty) std::cerr << "[chat] conversation reset\n";
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    chat.reply(line, [](const std::string& piece) { std::cout << piece << std::flush; });
    std::cout << "\n" << std::flush;
    if (args.flag("stats")) std::cerr << "[chat] state " << chat.state_bytes() / 1024.0 << " KiB after "
                                      << chat.ids().size() << " tokens\n";
  }
  return 0;
}

}  // namespace linearize::cli
