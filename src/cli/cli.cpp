#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "cli/commands.h"
#include "cli/host_memory.h"
#include "io/error.h"

namespace linearize::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"info", "print a model folder's architecture, parameter count, dtype and tokenizer", cmd_info},
      {"tokenize", "turn text into token ids, or text/jsonl corpora into sharded token datasets", cmd_tokenize},
      {"tokenizer", "tokenizer tools (tokenizer train: train a byte-level BPE on text files)", cmd_tokenizer},
      {"generate", "generate text from a teacher or student model, streaming", cmd_generate},
      {"pretrain", "train a Llama teacher from scratch", cmd_pretrain},
      {"distill", "linearize a teacher: three-stage distillation into a mixer", cmd_distill},
      {"sft", "supervised fine-tuning on conversations (ChatML, loss on assistant tokens)", cmd_sft},
      {"chat", "chat with a fine-tuned model in the terminal, streaming", cmd_chat},
      {"serve", "serve a model over OpenAI's HTTP API, sequences batched as they come", cmd_serve},
      {"eval", "evaluate a model (eval ppl | tasks | niah | instruct | all)", cmd_eval},
      {"launch", "run pretrain/distill/sft data parallel, one process per device (c10d: NCCL or Gloo)", cmd_launch},
      {"study", "run a grid of teachers x mixers x budgets and report the study's tables", cmd_study},
      {"report", "Markdown tables and SVG figures from eval results", cmd_report},
      {"export", "write a student in another library's format (export --format fla)", cmd_export},
      {"import", "read another library's model folder as a student (import --format fla)", cmd_import},
      {"demo", "run the built-in default job (see README)", cmd_demo},
  };
  return list;
}

namespace {
// "error: " or, in one of several launched processes, "error (rank N): ".
std::string error_prefix() {
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (!rank || !world || std::string(world) == "1") return "error: ";
  return std::string("error (rank ") + rank + "): ";
}

// The error line in one write: launched processes share a stderr pipe, and a line written in pieces
// can interleave with another rank's ("error (rank 0): error (rank 1): ...").
void print_error(const std::string& what) {
  const std::string line = error_prefix() + what + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void print_usage(std::ostream& out) {
  out << "usage: linearize <command> [options]\n\n"
         "Linearize pretrained Llama-architecture language models: replace softmax attention with\n"
         "linear-time token mixers, distill, evaluate and run them with constant memory.\n\ncommands:\n";
  for (const auto& c : commands()) {
    std::string name = "  " + c.name;
    out << name << std::string(name.size() < 14 ? 14 - name.size() : 1, ' ') << c.summary << "\n";
  }
  out << "\nRun `linearize <command> --help` for a command's options.\n";
}
}  // namespace

int run_cli(int argc, char** argv) {
  keep_freed_memory_for_reuse();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_usage(std::cout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : commands()) {
    if (c.name != name) continue;
    try {
      return c.run(args);
    } catch (const Error& e) {
      print_error(e.what());
      return 1;
    } catch (const c10::Error& e) {
      print_error(e.what_without_backtrace());
      return 1;
    } catch (const std::exception& e) {
      print_error(e.what());
      return 1;
    }
  }
  std::cerr << "error: unknown command \"" << name << "\" (run `linearize --help` for the list)\n";
  return 2;
}

}  // namespace linearize::cli
