// linearize tokenize: ids of a text, or a token shard (.u32) from text/jsonl files.
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/error.h"
#include "io/hf_config.h"
#include "io/token_shards.h"

namespace linearize::cli {

int cmd_tokenize(const std::vector<std::string>& argv) {
  CommandSpec spec{
      "tokenize",
      "Print the token ids of a text, or tokenize files into a token shard (little-endian uint32,\n"
      "documents separated by the EOS id).",
      "",
      "examples:\n  linearize tokenize --tokenizer MODEL_DIR --text \"Hello world\" --json\n"
      "  linearize tokenize --tokenizer MODEL_DIR --input a.txt,b.jsonl --output train.u32",
      {{"tokenizer", "DIR|FILE", "model folder or tokenizer file (tokenizer.json / tokenizer.model)", "", true},
       {"text", "TEXT", "text to tokenize (special tokens in it are recognised)"},
       {"json", "", "print ids as a JSON array"},
       {"input", "FILES", "comma-separated .txt (one document each) or .jsonl files"},
       {"output", "FILE.u32", "token shard to write (with --input)"},
       {"field", "NAME", "jsonl field holding the text", "text"},
       {"eos", "ID", "document separator id (default: the model's eos_token_id, else <|endoftext|>)"}},
      0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string tok_path = args.str("tokenizer");
  auto tok = load_tokenizer(tok_path);
  if (args.has("text")) {
    auto ids = tok->encode(args.str("text"), true);
    if (args.flag("json")) {
      std::cout << nlohmann::json(ids).dump() << "\n";
    } else {
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << "\n";
    }
    return 0;
  }
  if (!args.has("input") || !args.has("output"))
    throw Error("linearize tokenize: give --text, or --input FILES with --output FILE.u32 (see --help)");
  int64_t eos = -1;
  if (args.has("eos")) {
    eos = args.integer("eos");
  } else {
    try {
      auto config = LlamaConfig::load(tok_path);
      if (!config.eos_token_ids.empty()) eos = config.eos_token_ids[0];
    } catch (const Error&) {
    }
    if (eos < 0) {
      if (auto id = tok->token_to_id("<|endoftext|>")) eos = *id;
      else if (auto id2 = tok->token_to_id("</s>")) eos = *id2;
      else throw Error("linearize tokenize: no EOS id known for this tokenizer; pass --eos ID");
    }
  }
  auto files = args.str_list("input");
  auto ids = tokenize_documents(*tok, files, eos, args.str("field"));
  write_token_shard(args.str("output"), ids);
  std::cerr << "wrote " << ids.size() << " tokens from " << files.size() << " file(s) to " << args.str("output")
            << " (eos " << eos << ")\n";
  return 0;
}

}  // namespace linearize::cli
